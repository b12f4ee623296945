//! Ungraded checks of the watchdog that keeps a rank from waiting forever on
//! a collective its device never completes (NCCL's case), on stand-in calls
//! whose completion the test controls.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use workbook::distributed::watchdog::Watchdog;

/// A stand-in call that completes once `flag` is set.
fn call(flag: &Arc<AtomicBool>) -> Box<dyn FnMut() -> Result<bool, String> + Send> {
    let flag = Arc::clone(flag);
    Box::new(move || Ok(flag.load(Ordering::SeqCst)))
}

/// A watchdog with a short timeout whose verdict arrives on the receiver.
fn watchdog(timeout_ms: u64) -> (Watchdog, mpsc::Receiver<String>) {
    let (tell, told) = mpsc::channel();
    let watchdog = Watchdog::start(Duration::from_millis(timeout_ms), move |why| tell.send(why).unwrap());
    (watchdog, told)
}

#[test]
fn a_call_that_never_completes_ends_the_rank_naming_it() {
    let (watchdog, told) = watchdog(200);
    let (done, stuck) = (Arc::new(AtomicBool::new(true)), Arc::new(AtomicBool::new(false)));
    let started = Instant::now();
    watchdog.watch("NCCL call #0 (all_reduce)".into(), call(&done));
    watchdog.watch("NCCL call #1 (all_gather)".into(), call(&stuck));
    let why = told.recv_timeout(Duration::from_secs(5)).expect("the watchdog must fire for a stuck call");
    assert!(started.elapsed() >= Duration::from_millis(200), "it fired before the timeout: {:?}", started.elapsed());
    assert!(why.contains("NCCL call #1 (all_gather) has not completed"), "it must name the stuck call: {why}");
    assert!(why.contains("--timeout"), "it must say how to allow longer work: {why}");
}

#[test]
fn calls_that_complete_in_time_never_fire_it() {
    let (watchdog, told) = watchdog(300);
    for n in 0..5 {
        let flag = Arc::new(AtomicBool::new(false));
        watchdog.watch(format!("call #{n}"), call(&flag));
        std::thread::sleep(Duration::from_millis(50));
        flag.store(true, Ordering::SeqCst);
    }
    assert!(told.recv_timeout(Duration::from_millis(600)).is_err(), "calls that completed must not fire it");
    drop(watchdog); // stops its thread, which still holds nothing pending
}

#[test]
fn an_error_from_the_device_ends_the_rank_at_once() {
    let (watchdog, told) = watchdog(60_000);
    watchdog.watch("NCCL call #0 (broadcast)".into(), Box::new(|| Err("CUDA_ERROR_LAUNCH_FAILED".into())));
    let why = told.recv_timeout(Duration::from_secs(5)).expect("an error must fire it without waiting the timeout");
    assert!(why.contains("NCCL call #0 (broadcast) failed on the device: CUDA_ERROR_LAUNCH_FAILED"), "{why}");
}
