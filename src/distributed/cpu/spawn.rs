//! The launcher: one thread per rank, like `torch.multiprocessing.spawn`.

use std::any::Any;
use std::panic::{self, AssertUnwindSafe};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use candle_core::{bail, Error, Result};

use super::rendezvous::Rendezvous;
use super::CpuProcessGroup;
use crate::distributed::ProcessGroup;

/// How long a rank waits in a collective before the group gives up, as
/// `torch.distributed`'s process-group timeout.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

/// Runs `f` on `world_size` ranks, each a thread with its own
/// [`CpuProcessGroup`], and returns their results in rank order.
///
/// Rank r's thread is named `rank-r`, or `rank-r of NAME` when the thread
/// that calls `spawn` is named NAME other than `main` (a test's thread,
/// which libtest names after the test): a panic report can then say whose
/// rank panicked.
///
/// If a rank's `f` returns an error or panics, the other ranks' collectives
/// fail at once instead of waiting for it, and `spawn` returns the root cause,
/// naming the rank (e.g. `rank 1 failed: ...`), rather than the errors it
/// caused on the others.
pub fn spawn<T, F>(world_size: usize, f: F) -> Result<Vec<T>>
where
    T: Send,
    F: Fn(CpuProcessGroup) -> Result<T> + Sync,
{
    spawn_with_timeout(world_size, DEFAULT_TIMEOUT, f)
}

/// [`spawn`], with the longest a rank may wait in one collective for the
/// others: a short one makes a test of a stuck rank fail quickly.
pub fn spawn_with_timeout<T, F>(world_size: usize, timeout: Duration, f: F) -> Result<Vec<T>>
where
    T: Send,
    F: Fn(CpuProcessGroup) -> Result<T> + Sync,
{
    if world_size == 0 {
        bail!("spawn: world_size must be at least 1");
    }
    let rendezvous = Arc::new(Rendezvous::new(world_size, timeout));
    let caller = thread::current().name().filter(|&name| name != "main").map(|name| format!(" of {name}"));
    let caller = caller.unwrap_or_default();
    let (f, meeting_point) = (&f, &*rendezvous);
    let results: Vec<Result<T>> = thread::scope(|scope| {
        let mut ranks = Vec::with_capacity(world_size);
        for rank in 0..world_size {
            let group = CpuProcessGroup::new(rank, Arc::clone(&rendezvous));
            let started = thread::Builder::new()
                .name(format!("rank-{rank}{caller}"))
                .spawn_scoped(scope, move || run_rank(f, group, meeting_point));
            match started {
                Ok(handle) => ranks.push(handle),
                Err(e) => {
                    // Release the ranks already running: they would wait for this one.
                    meeting_point.abort(format!("could not start a thread for rank {rank}: {e}"));
                    break;
                }
            }
        }
        ranks.into_iter().map(|rank| rank.join().unwrap_or_else(|p| Err(panicked(&*p)))).collect()
    });

    let failed = results.len() < world_size || results.iter().any(Result::is_err);
    if failed {
        if let Some(reason) = rendezvous.failure() {
            return Err(Error::Msg(root_cause(&results, reason)));
        }
    }
    results.into_iter().collect()
}

/// Why the group failed: the first failure recorded, unless a rank's own
/// error says more. A rank's error is an echo when it holds the recorded
/// reason; one that does not is its own, and the reason only what another
/// rank saw first (a rank that finished while it waited for one that was
/// failing, a timeout).
fn root_cause<T>(results: &[Result<T>], reason: String) -> String {
    let own = results.iter().enumerate().find_map(|(rank, result)| {
        let error = result.as_ref().err()?.to_string();
        let echo = error.contains(&reason) || reason == format!("rank {rank} failed: {error}");
        (!echo).then(|| format!("rank {rank} failed: {error}"))
    });
    own.unwrap_or(reason)
}

/// One rank's thread: runs `f`, and tells the group how it ended.
fn run_rank<T, F>(f: &F, group: CpuProcessGroup, rendezvous: &Rendezvous) -> Result<T>
where
    F: Fn(CpuProcessGroup) -> Result<T>,
{
    let rank = group.rank();
    let result = panic::catch_unwind(AssertUnwindSafe(|| f(group))).unwrap_or_else(|p| Err(panicked(&*p)));
    match &result {
        Ok(_) => rendezvous.finish(rank),
        Err(e) => rendezvous.abort(format!("rank {rank} failed: {e}")),
    }
    result
}

/// A panic as an error, with the message it was raised with.
fn panicked(payload: &(dyn Any + Send)) -> Error {
    let message = payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(a panic without a message)".to_string());
    Error::Msg(format!("panicked: {message}"))
}
