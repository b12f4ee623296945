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

/// A watchdog with a short timeout whose verdict arrives on the receiver,
/// in a job where no rank is ever busy.
fn watchdog(timeout_ms: u64) -> (Watchdog, mpsc::Receiver<String>) {
    watchdog_while_busy(timeout_ms, &Arc::new(AtomicBool::new(false)))
}

/// A watchdog in a job where some rank says it is busy while `busy` is set.
fn watchdog_while_busy(timeout_ms: u64, busy: &Arc<AtomicBool>) -> (Watchdog, mpsc::Receiver<String>) {
    let (tell, told) = mpsc::channel();
    let busy = Arc::clone(busy);
    let query = Box::new(move || busy.load(Ordering::SeqCst).then(|| "rank 0: writing a checkpoint".to_string()));
    let watchdog = Watchdog::start(Duration::from_millis(timeout_ms), query, move |why| tell.send(why).unwrap());
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

/// A rank writing a checkpoint for longer than the timeout keeps the others'
/// calls waiting on the GPU: while it says it is busy the watchdog does not
/// fire, and a timeout after it stops saying so, it does.
#[test]
fn a_busy_rank_holds_the_watchdog_off_past_the_timeout() {
    let busy = Arc::new(AtomicBool::new(true));
    let (watchdog, told) = watchdog_while_busy(200, &busy);
    let stuck = Arc::new(AtomicBool::new(false));
    watchdog.watch("NCCL call #3 (all_reduce)".into(), call(&stuck));
    assert!(told.recv_timeout(Duration::from_millis(700)).is_err(), "it fired while a rank said it was busy");
    let idle_from = Instant::now();
    busy.store(false, Ordering::SeqCst);
    let why = told.recv_timeout(Duration::from_secs(5)).expect("the watchdog must fire once no rank is busy");
    assert!(
        idle_from.elapsed() <= Duration::from_millis(450),
        "it waited {:?} after the busy period",
        idle_from.elapsed()
    );
    assert!(why.contains("NCCL call #3 (all_reduce) has not completed"), "{why}");
}

/// What the NCCL backend has never run with two GPUs is refused where it is
/// called, naming the way to run it anyway, until the process opts in.
#[test]
fn never_run_nccl_paths_are_refused_until_the_process_opts_in() {
    use workbook::distributed::{allow_unverified_nccl, refuse_unverified};
    let refused = refuse_unverified("a subgroup's communicator").unwrap_err().to_string();
    assert!(refused.contains("a subgroup's communicator has never run with two GPUs"), "{refused}");
    assert!(refused.contains("--unverified-nccl") && refused.contains("--backend tcp"), "{refused}");
    allow_unverified_nccl(true);
    let allowed = refuse_unverified("a subgroup's communicator");
    allow_unverified_nccl(false);
    assert!(allowed.is_ok(), "the opt-in must let it run");
}
