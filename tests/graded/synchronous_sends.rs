//! Sends that wait for their receive, as NCCL's do, for thread ranks.
//!
//! The CPU backends buffer every message: `send` returns at once, so code
//! that has two ranks send to each other before either receives runs here
//! and hangs on GPUs. Wrapped in [`SynchronousSends`], a rank's `send`
//! returns only once its peer has posted the matching `recv`; `send_recv`
//! posts its receive before it waits for its send, as NCCL's grouped pair
//! does. The ranks share a board of posted receives and of who waits in a
//! send for whom, so a cycle of waiting sends, which can never end, is
//! reported as soon as it forms, naming it.

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use candle_core::{bail, Result, Tensor};
use workbook::distributed::{CollectiveOverride, ProcessGroup, Properties};

/// The longest a send waits for its receive without a cycle before it gives up.
const PATIENCE: Duration = Duration::from_secs(20);

/// What every rank of one job shares.
#[derive(Default)]
pub struct SendBoard {
    state: Mutex<State>,
    changed: Condvar,
}

#[derive(Default)]
struct State {
    /// Receives posted, by (sender, receiver).
    posted: HashMap<(usize, usize), u64>,
    /// Sends made, by (sender, receiver).
    sent: HashMap<(usize, usize), u64>,
    /// The rank each rank's send waits for, if it waits, and which of its
    /// sends to that rank it is.
    waiting_for: HashMap<usize, (usize, u64)>,
    /// A deadlock was found: every waiting send gives up.
    deadlocked: bool,
    /// Ranks whose work has ended: a send to one of them can never be received.
    finished: Vec<usize>,
}

impl SendBoard {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Rank `rank` has ended its work: it receives nothing more.
    pub fn finish(&self, rank: usize) {
        self.state().finished.push(rank);
        self.changed.notify_all();
    }

    /// Rank `to` has posted a receive from `from`.
    fn post(&self, from: usize, to: usize) {
        *self.state().posted.entry((from, to)).or_default() += 1;
        self.changed.notify_all();
    }

    /// The number of `from`'s sends to `to`, counting one more.
    fn count_send(&self, from: usize, to: usize) -> u64 {
        let mut state = self.state();
        let sent = state.sent.entry((from, to)).or_default();
        *sent += 1;
        *sent
    }

    /// Waits until `to` has posted the receive of `from`'s `nth` send.
    fn wait_for_receive(&self, from: usize, to: usize, nth: u64) -> Result<()> {
        let start = Instant::now();
        let mut state = self.state();
        state.waiting_for.insert(from, (to, nth));
        while !state.received(from, to, nth) {
            if let Some(cycle) = state.cycle_through(from) {
                state.waiting_for.remove(&from);
                state.deadlocked = true;
                self.changed.notify_all();
                bail!("{}", deadlock(&cycle));
            }
            if state.finished.contains(&to) {
                state.waiting_for.remove(&from);
                bail!(
                    "rank {from}'s send to rank {to} is never received: rank {to} ended its step without receiving it"
                );
            }
            if state.deadlocked {
                state.waiting_for.remove(&from);
                bail!("rank {from}'s send to rank {to} was given up: other ranks' sends deadlocked");
            }
            if start.elapsed() > PATIENCE {
                state.waiting_for.remove(&from);
                bail!("rank {from}'s send to rank {to} waited {PATIENCE:?} for rank {to} to receive it");
            }
            state =
                self.changed.wait_timeout(state, Duration::from_millis(50)).unwrap_or_else(PoisonError::into_inner).0;
        }
        state.waiting_for.remove(&from);
        self.changed.notify_all();
        Ok(())
    }
}

impl State {
    /// Whether `to` has posted the receive of `from`'s `nth` send to it.
    fn received(&self, from: usize, to: usize, nth: u64) -> bool {
        self.posted.get(&(from, to)).copied().unwrap_or(0) >= nth
    }

    /// The ranks from `start` round to `start` again, each waiting in a send
    /// for the next whose receive is not posted, if they close a cycle. A
    /// send whose receive was posted but whose thread has not woken yet is
    /// no link.
    fn cycle_through(&self, start: usize) -> Option<Vec<usize>> {
        let mut cycle = vec![start];
        let mut at = start;
        while let Some(&(next, nth)) = self.waiting_for.get(&at) {
            if self.received(at, next, nth) {
                return None;
            }
            if next == start {
                return Some(cycle);
            }
            if cycle.contains(&next) {
                return None;
            }
            cycle.push(next);
            at = next;
        }
        None
    }
}

/// The sentence that says which sends wait for each other.
fn deadlock(cycle: &[usize]) -> String {
    let links: Vec<String> = cycle
        .iter()
        .zip(cycle.iter().cycle().skip(1))
        .map(|(rank, next)| format!("rank {rank} waits in its send to rank {next}"))
        .collect();
    format!(
        "deadlock where a send waits for its receive (NCCL's sends do): {}, so none of them reaches its receive",
        links.join(", ")
    )
}

/// One rank's sends made synchronous, through the job's `board`.
#[derive(Clone)]
pub struct SynchronousSends {
    pub board: Arc<SendBoard>,
}

impl CollectiveOverride for SynchronousSends {
    fn send(&self, inner: &dyn ProcessGroup, t: &Tensor, dst: usize) -> Result<()> {
        let me = inner.rank();
        inner.send(t, dst)?;
        let nth = self.board.count_send(me, dst);
        self.board.wait_for_receive(me, dst, nth)
    }

    fn recv(&self, inner: &dyn ProcessGroup, like: &Tensor, src: usize) -> Result<Tensor> {
        self.board.post(src, inner.rank());
        inner.recv(like, src)
    }

    /// The receive is posted before the send waits for its own: neither half
    /// waits for the other.
    fn send_recv(&self, inner: &dyn ProcessGroup, t: &Tensor, dst: usize, like: &Tensor, src: usize) -> Result<Tensor> {
        let me = inner.rank();
        self.board.post(src, me);
        inner.send(t, dst)?;
        let nth = self.board.count_send(me, dst);
        let received = inner.recv(like, src)?;
        self.board.wait_for_receive(me, dst, nth)?;
        Ok(received)
    }

    fn properties(&self, inner: &dyn ProcessGroup) -> Properties {
        Properties { buffered_sends: false, ..inner.properties() }
    }
}
