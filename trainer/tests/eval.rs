//! Evaluation on held-out windows: which windows are held out, and that the
//! validation loss of a real run falls.

use trainer::eval::{HeldOut, MOST_HELD_OUT};

/// The tail is 1% of the windows, at least one per replica, and each
/// replica's share is as large as the others' and disjoint from them.
#[test]
fn the_held_out_tail_is_shared_equally_and_never_trained_on() {
    let held = HeldOut::of(11_515, 2, 16).unwrap();
    assert_eq!((held.train_windows(), held.len()), (11_400, 115));
    let (a, b) = (held.batches(0, 2, 8).concat(), held.batches(1, 2, 8).concat());
    assert_eq!((a.len(), b.len()), (57, 57));
    assert!(a.iter().chain(&b).all(|&w| (11_400..11_515).contains(&w)));
    assert!(a.iter().all(|w| !b.contains(w)));
    assert_eq!(held.batches(0, 2, 8).len(), 8, "57 windows in batches of at most 8");
    assert_eq!(HeldOut::of(50, 4, 8).unwrap().len(), 4);
    assert_eq!(HeldOut::of(10_000_000, 1, 8).unwrap().len(), MOST_HELD_OUT);
    let error = HeldOut::of(17, 2, 16).unwrap_err().to_string();
    assert!(error.contains("fewer than one batch"), "{error}");
}
