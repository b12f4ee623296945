//! A watchdog for collectives that run after their call returns.
//!
//! NCCL queues each collective on the GPU and returns at once; the host
//! waits only later, when it reads a result. If a peer rank died, stopped or
//! took another code path, that collective never completes and the wait
//! never returns: NCCL itself has no timeout. So, as PyTorch's NCCL watchdog
//! does, a thread beside the rank watches every queued collective: one that
//! has not completed `timeout` after it was queued, or one whose device
//! reports an error, ends the rank with a message that names it. The other
//! ranks, stuck in the same collective, end the same way, so the job ends
//! instead of hanging, as it does over the TCP backend.
//!
//! A rank busy with long work on the host (a checkpoint write) joins the
//! next collective late, and the others' calls wait on the GPU meanwhile:
//! before it fires, the watchdog asks whether some rank says it is busy (see
//! [`ProcessGroup::set_busy`](super::ProcessGroup::set_busy)), and if one
//! does, gives the late call another timeout.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

/// Whether a watched collective has completed: `Err` when the device says
/// it failed.
pub type Completion = Box<dyn FnMut() -> Result<bool, String> + Send>;

/// What long work some rank of the job says it is busy with, if any.
pub type BusyQuery = Box<dyn FnMut() -> Option<String> + Send>;

/// Watches the collectives of one rank, in the order they were queued.
pub struct Watchdog {
    shared: Arc<Shared>,
    timeout: Duration,
    thread: Option<JoinHandle<()>>,
}

struct Shared {
    state: Mutex<State>,
    /// Wakes the watching thread early when the watchdog is dropped.
    stop: Condvar,
}

#[derive(Default)]
struct State {
    pending: VecDeque<Pending>,
    stopping: bool,
}

struct Pending {
    what: String,
    queued: Instant,
    /// When it is late: a timeout after it was queued, or after the last
    /// time a rank said it was busy.
    deadline: Instant,
    done: Completion,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Watchdog {
    /// Starts watching: `expire` is called once, on the watchdog's thread,
    /// with what went wrong, when a collective has been pending longer than
    /// `timeout` while `busy` says no rank is busy, or failed. It is expected
    /// to end the process.
    pub fn start(timeout: Duration, busy: BusyQuery, expire: impl FnOnce(String) + Send + 'static) -> Self {
        let shared = Arc::new(Shared { state: Mutex::default(), stop: Condvar::new() });
        let watching = Arc::clone(&shared);
        let thread = thread::Builder::new()
            .name("watchdog".into())
            .spawn(move || {
                if let Some(why) = watch(&watching, timeout, busy) {
                    expire(why);
                }
            })
            .expect("starting the watchdog's thread");
        Self { shared, timeout, thread: Some(thread) }
    }

    /// Watches one more collective, `what`, queued now; `done` says whether
    /// it has completed.
    pub fn watch(&self, what: String, done: Completion) {
        let queued = Instant::now();
        let deadline = queued + self.timeout;
        self.shared.lock().pending.push_back(Pending { what, queued, deadline, done });
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.shared.lock().stopping = true;
        self.shared.stop.notify_all();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The watching thread: returns why the rank must end, or `None` once the
/// watchdog is dropped. Collectives on one stream complete in the order
/// they were queued, so only the oldest pending one can be late.
fn watch(shared: &Shared, timeout: Duration, mut busy: BusyQuery) -> Option<String> {
    let every = (timeout / 20).clamp(Duration::from_millis(10), Duration::from_secs(1));
    let mut state = shared.lock();
    loop {
        if state.stopping {
            return None;
        }
        let mut late = false;
        while let Some(oldest) = state.pending.front_mut() {
            match (oldest.done)() {
                Ok(true) => drop(state.pending.pop_front()),
                Ok(false) => {
                    late = Instant::now() >= oldest.deadline;
                    break;
                }
                Err(e) => return Some(format!("{} failed on the device: {e}", oldest.what)),
            }
        }
        if late {
            // Asked without the lock: the query may wait on the network, and
            // the rank queues more calls meanwhile.
            drop(state);
            let someone_busy = busy().is_some();
            state = shared.lock();
            // A call that completed or failed meanwhile is settled by the
            // loop above, on `continue`.
            if let Some(oldest) = state.pending.front_mut() {
                if someone_busy {
                    oldest.deadline = Instant::now() + timeout;
                } else if matches!((oldest.done)(), Ok(false)) {
                    return Some(format!(
                        "{} has not completed {:.0?} after it was queued: a peer rank is dead, stopped or stuck, \
                         or called another collective; ending this rank so that the job ends (raise --timeout if \
                         this work legitimately takes longer)",
                        oldest.what,
                        oldest.queued.elapsed()
                    ));
                }
            }
            continue;
        }
        state = shared.stop.wait_timeout(state, every).unwrap_or_else(PoisonError::into_inner).0;
    }
}
