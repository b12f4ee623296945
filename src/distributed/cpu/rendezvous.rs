//! Where the CPU ranks meet: one slot per rank, a generation counter, and the
//! failure that aborts the group.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use candle_core::{Error, Result, Tensor};

use crate::distributed::collective::{combine, Call, Outcome};

/// State shared by all the ranks of one group.
pub(super) struct Rendezvous {
    world_size: usize,
    /// The longest a rank waits in a collective for the others.
    timeout: Duration,
    state: Mutex<State>,
    /// Signalled on every change a waiting rank must see: a completed
    /// collective, an abort, a rank that finished.
    changed: Condvar,
}

struct State {
    /// The generation counter: the sequence number of the collective being
    /// assembled, shown as `#n` in errors.
    generation: u64,
    /// Each rank's contribution to it, once that rank has arrived.
    arrived: Vec<Option<Arrival>>,
    /// The last completed collective, kept until every waiting rank took it.
    completed: Option<Completed>,
    /// The first failure; once set, every collective returns it.
    aborted: Option<String>,
    /// Ranks whose closure has returned successfully.
    finished: Vec<bool>,
    /// What long work each rank said it is busy with: waiting for a busy
    /// rank is not charged to the timeout.
    busy: Vec<Option<String>>,
    /// Point-to-point tensors sent and not yet received, by (src, dst), in
    /// the order they were sent.
    mailboxes: HashMap<(usize, usize), VecDeque<Tensor>>,
    /// The rank each rank waits in a recv from, while it does.
    receiving: Vec<Option<usize>>,
    /// The subgroups split off this group, by split number and colour: an
    /// abort or a finished rank here is passed on to them.
    subgroups: HashMap<(u64, usize), Subgroup>,
}

impl State {
    /// The ranks from `dst` on, each with the rank it waits in a recv from,
    /// when that chain comes back to `dst` with no tensor waiting anywhere
    /// along it: then no rank on it can ever reach its send.
    fn receive_cycle(&self, dst: usize) -> Option<Vec<(usize, usize)>> {
        let mut chain = vec![];
        let mut at = dst;
        loop {
            let from = self.receiving[at]?;
            if self.mailboxes.get(&(from, at)).is_some_and(|queue| !queue.is_empty()) || self.busy[from].is_some() {
                return None;
            }
            chain.push((at, from));
            if from == dst {
                return Some(chain);
            }
            if chain.iter().any(|&(r, _)| r == from) {
                return None; // a cycle that does not pass through `dst`: its own ranks report it
            }
            at = from;
        }
    }

    /// What the ranks of `cycle` were sent by ranks other than the one each
    /// waits for: tensors no recv of theirs takes, in words (empty if none).
    fn unclaimed_in(&self, cycle: &[(usize, usize)]) -> String {
        let unclaimed: Vec<String> = cycle
            .iter()
            .flat_map(|&(rank, waits_for)| {
                let mut senders: Vec<usize> = self
                    .mailboxes
                    .iter()
                    .filter(|((from, to), queue)| *to == rank && *from != waits_for && !queue.is_empty())
                    .map(|((from, _), _)| *from)
                    .collect();
                senders.sort_unstable();
                senders.into_iter().map(move |from| format!("rank {rank} holds a tensor from rank {from}"))
            })
            .collect();
        match unclaimed.is_empty() {
            true => String::new(),
            false => format!(" ({}, which none of its recvs asks for)", unclaimed.join(", ")),
        }
    }
}

struct Subgroup {
    /// Its ranks, as this group numbers them, in order.
    members: Vec<usize>,
    rendezvous: Arc<Rendezvous>,
}

struct Arrival {
    call: Call,
    /// On the CPU; `None` for a barrier.
    input: Option<Tensor>,
}

struct Completed {
    generation: u64,
    outcome: Arc<Outcome>,
    /// Ranks still to pick the outcome up.
    unread: usize,
}

impl Rendezvous {
    pub(super) fn new(world_size: usize, timeout: Duration) -> Self {
        let state = State {
            generation: 0,
            arrived: (0..world_size).map(|_| None).collect(),
            completed: None,
            aborted: None,
            finished: vec![false; world_size],
            busy: vec![None; world_size],
            mailboxes: HashMap::new(),
            receiving: vec![None; world_size],
            subgroups: HashMap::new(),
        };
        Self { world_size, timeout, state: Mutex::new(state), changed: Condvar::new() }
    }

    pub(super) fn world_size(&self) -> usize {
        self.world_size
    }

    /// Rank `rank` takes part in collective number `generation`: waits until
    /// every rank has arrived, and returns what the collective produced.
    pub(super) fn meet(&self, rank: usize, generation: u64, call: Call, input: Option<Tensor>) -> Result<Arc<Outcome>> {
        let mut state = self.lock();
        if let Some(reason) = &state.aborted {
            return Err(Error::Msg(reason.clone()));
        }
        if state.generation != generation {
            let reason = format!(
                "rank {rank} issued collective #{generation} while the group is at #{} (a bug in the CPU backend)",
                state.generation
            );
            return Err(self.fail(&mut state, reason));
        }
        let arrival = Arrival { call, input };
        if let Some(conflict) = state.conflict(rank, &arrival) {
            return Err(self.fail(&mut state, conflict));
        }
        state.arrived[rank] = Some(arrival);
        if state.arrived.iter().all(Option::is_some) {
            return self.complete(&mut state, call);
        }
        self.wait(state, rank, generation, call)
    }

    /// Leaves `t` (on the CPU) for rank `dst` to receive from rank `src`.
    pub(super) fn post(&self, src: usize, dst: usize, t: Tensor) -> Result<()> {
        let mut state = self.lock();
        if let Some(reason) = &state.aborted {
            return Err(Error::Msg(reason.clone()));
        }
        state.mailboxes.entry((src, dst)).or_default().push_back(t);
        self.changed.notify_all();
        Ok(())
    }

    /// Waits for the next tensor rank `src` sent to rank `dst`.
    pub(super) fn collect(&self, src: usize, dst: usize) -> Result<Tensor> {
        let mut deadline = Instant::now() + self.timeout;
        let mut state = self.lock();
        state.receiving[dst] = Some(src);
        loop {
            if let Some(t) = state.mailboxes.get_mut(&(src, dst)).and_then(VecDeque::pop_front) {
                state.receiving[dst] = None;
                return Ok(t);
            }
            if let Some(reason) = &state.aborted {
                return Err(Error::Msg(reason.clone()));
            }
            if state.finished[src] {
                let reason =
                    format!("rank {src} finished without sending the tensor rank {dst} waits for in recv(src {src})");
                return Err(self.fail(&mut state, reason));
            }
            if let Some(cycle) = state.receive_cycle(dst) {
                let waits: Vec<String> =
                    cycle.iter().map(|&(r, from)| format!("rank {r} waits in recv(src {from})")).collect();
                let reason = format!(
                    "recv(src {src}) on rank {dst} can never complete: {}, and none has been sent anything by the \
                     rank it waits for: the ranks wait for each other in a cycle, so no send can end it{}",
                    waits.join(", "),
                    state.unclaimed_in(&cycle)
                );
                return Err(self.fail(&mut state, reason));
            }
            state = match self.wait_until(state, deadline) {
                Ok(state) => state,
                Err(state) if state.busy[src].is_some() => {
                    deadline = Instant::now() + self.timeout;
                    state
                }
                Err(mut state) => {
                    let reason = format!(
                        "recv(src {src}) timed out after {:?} on rank {dst}: rank {src} did not send (stuck, or its send is missing)",
                        self.timeout
                    );
                    return Err(self.fail(&mut state, reason));
                }
            };
        }
    }

    /// Waits, with the lock released, until collective `generation` is
    /// complete, the group is aborted, or it is clear that it never will be.
    fn wait(&self, mut state: MutexGuard<'_, State>, rank: usize, generation: u64, call: Call) -> Result<Arc<Outcome>> {
        let mut deadline = Instant::now() + self.timeout;
        loop {
            if let Some(outcome) = state.take_outcome(generation) {
                return Ok(outcome);
            }
            if let Some(reason) = &state.aborted {
                return Err(Error::Msg(reason.clone()));
            }
            let missing = state.missing();
            if let Some(&gone) = missing.iter().find(|&&r| state.finished[r]) {
                let reason = format!(
                    "rank {gone} finished without calling {} #{generation}, which rank {rank} is waiting in: every rank must issue the same collectives in the same order",
                    call.kind()
                );
                return Err(self.fail(&mut state, reason));
            }
            state = match self.wait_until(state, deadline) {
                Ok(state) => state,
                Err(state) if missing.iter().any(|&r| state.busy[r].is_some()) => {
                    deadline = Instant::now() + self.timeout;
                    state
                }
                Err(mut state) => {
                    let reason = format!(
                        "{} #{generation} timed out after {:?} on rank {rank}: {} did not arrive (stuck, or skipped this collective: every rank must issue the same collectives in the same order)",
                        call.kind(),
                        self.timeout,
                        list_ranks(&missing)
                    );
                    return Err(self.fail(&mut state, reason));
                }
            };
        }
    }

    /// Waits, with the lock released, for the next change or until
    /// `deadline`; `Err`, with the lock held again, once the deadline has passed.
    fn wait_until<'a>(
        &self,
        state: MutexGuard<'a, State>,
        deadline: Instant,
    ) -> std::result::Result<MutexGuard<'a, State>, MutexGuard<'a, State>> {
        let now = Instant::now();
        if now >= deadline {
            return Err(state);
        }
        Ok(self.changed.wait_timeout(state, deadline - now).unwrap_or_else(PoisonError::into_inner).0)
    }

    /// Marks the group as failed, unless it already is: the first reason is
    /// the root cause, and the one every rank reports from then on.
    pub(super) fn abort(&self, reason: String) {
        let mut state = self.lock();
        self.fail(&mut state, reason);
    }

    /// Rank `rank`'s closure has returned: nobody should wait for it any
    /// more, here or in a subgroup.
    pub(super) fn finish(&self, rank: usize) {
        let mut state = self.lock();
        state.finished[rank] = true;
        for subgroup in state.subgroups.values() {
            if let Some(place) = subgroup.members.iter().position(|&r| r == rank) {
                subgroup.rendezvous.finish(place);
            }
        }
        self.changed.notify_all();
    }

    /// Where the ranks `members` of split number `number` that passed
    /// `color` meet: made by the first of them to ask.
    pub(super) fn subgroup(&self, number: u64, color: usize, members: Vec<usize>) -> Arc<Rendezvous> {
        let mut state = self.lock();
        let aborted = state.aborted.clone();
        let subgroup = state.subgroups.entry((number, color)).or_insert_with(|| {
            let rendezvous = Arc::new(Rendezvous::new(members.len(), self.timeout));
            if let Some(reason) = aborted {
                rendezvous.abort(reason);
            }
            Subgroup { members, rendezvous }
        });
        Arc::clone(&subgroup.rendezvous)
    }

    /// Rank `rank` is busy with `what` (`None`: no longer); see
    /// [`ProcessGroup::set_busy`](crate::distributed::ProcessGroup::set_busy).
    pub(super) fn set_busy(&self, rank: usize, what: Option<&str>) {
        self.lock().busy[rank] = what.map(str::to_string);
    }

    /// Why the group was aborted, if it was.
    pub(super) fn failure(&self) -> Option<String> {
        self.lock().aborted.clone()
    }

    /// The last rank to arrive runs the collective for everyone.
    fn complete(&self, state: &mut State, call: Call) -> Result<Arc<Outcome>> {
        let generation = state.generation;
        let inputs: Vec<Tensor> =
            state.arrived.iter_mut().filter_map(|slot| slot.take().and_then(|a| a.input)).collect();
        let outcome = match combine(call, &inputs) {
            Ok(outcome) => Arc::new(outcome),
            Err(e) => return Err(self.fail(state, format!("{call} #{generation} failed: {e}"))),
        };
        state.generation += 1;
        if self.world_size > 1 {
            let unread = self.world_size - 1;
            state.completed = Some(Completed { generation, outcome: Arc::clone(&outcome), unread });
        }
        self.changed.notify_all();
        Ok(outcome)
    }

    fn fail(&self, state: &mut State, reason: String) -> Error {
        let reason = state.aborted.get_or_insert(reason).clone();
        for subgroup in state.subgroups.values() {
            subgroup.rendezvous.abort(reason.clone());
        }
        self.changed.notify_all();
        Error::Msg(reason)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A rank that panics while holding the lock (a bug) poisons it; its
        // launcher then aborts the group, so carry on and let every rank see that.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl State {
    /// Why `arrival` cannot join the collective the ranks already in it make.
    fn conflict(&self, rank: usize, arrival: &Arrival) -> Option<String> {
        let (other, theirs) = self.arrived.iter().enumerate().find_map(|(r, slot)| Some((r, slot.as_ref()?)))?;
        // Name the lower rank first, whoever arrived first.
        let ((lo, a), (hi, b)) =
            if other < rank { ((other, theirs), (rank, arrival)) } else { ((rank, arrival), (other, theirs)) };
        let generation = self.generation;
        if a.call.kind() != b.call.kind() {
            return Some(format!(
                "collective #{generation}: rank {lo} called {} while rank {hi} called {}: every rank must issue the same collectives in the same order",
                a.call.kind(),
                b.call.kind()
            ));
        }
        let kind = a.call.kind();
        if a.call != b.call {
            return Some(format!(
                "{kind} #{generation}: rank {lo} called {} while rank {hi} called {}: every rank must pass the same arguments",
                a.call, b.call
            ));
        }
        let (Some(x), Some(y)) = (&a.input, &b.input) else {
            return None;
        };
        if x.dims() != y.dims() || x.dtype() != y.dtype() {
            return Some(format!(
                "{kind} #{generation}: rank {lo} passed a {:?} {} tensor while rank {hi} passed a {:?} {} one: every rank must pass a tensor of the same shape and dtype",
                x.dims(),
                x.dtype().as_str(),
                y.dims(),
                y.dtype().as_str()
            ));
        }
        None
    }

    /// The ranks that have not yet arrived at the current collective.
    fn missing(&self) -> Vec<usize> {
        (0..self.arrived.len()).filter(|&r| self.arrived[r].is_none()).collect()
    }

    /// The outcome of collective `generation`, once it is complete.
    fn take_outcome(&mut self, generation: u64) -> Option<Arc<Outcome>> {
        let done = self.completed.as_mut().filter(|c| c.generation == generation)?;
        let outcome = Arc::clone(&done.outcome);
        done.unread -= 1;
        if done.unread == 0 {
            self.completed = None; // free the buffers as soon as all have them
        }
        Some(outcome)
    }
}

/// "rank 3" or "ranks 1, 3".
fn list_ranks(ranks: &[usize]) -> String {
    let names: Vec<String> = ranks.iter().map(usize::to_string).collect();
    match names.len() {
        1 => format!("rank {}", names[0]),
        _ => format!("ranks {}", names.join(", ")),
    }
}
