//! Counting what a rank sends: calls and bytes per collective.

use std::fmt;

use super::Collective;

/// The calls this rank made of each collective and two byte counts:
///
/// - **payload bytes**: the size of the NCCL buffer it passed in (the tensor
///   for all-reduce, broadcast and send, the output for all-gather, the input
///   for reduce-scatter). The cost models of the ZeRO paper and of the FSDP
///   ledger are written in these.
/// - **wire bytes**: the tensor bytes this rank itself sent to other ranks.
///   A ring all-reduce of P bytes on N ranks sends 2(N−1)/N·P of them from
///   each rank; the thread backend hands its input over once.
///
/// Communication volume is the cost model of distributed training: DDP sends
/// the gradients once per step, FSDP sends parameters twice and gradients
/// once. Tests use these numbers to check that a trainer makes exactly the
/// collectives it should:
///
/// ```no_run
/// # use workbook::distributed::{Collective, CommStats, ProcessGroup};
/// # fn step(pg: &dyn ProcessGroup) {}
/// # fn check(pg: &dyn ProcessGroup) {
/// let before = pg.stats();
/// step(pg);
/// assert_eq!(pg.stats().since(&before).calls(Collective::AllReduce), 1);
/// # }
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CommStats {
    /// Indexed by `kind as usize`: the order of [`Collective::ALL`].
    counts: [Count; Collective::ALL.len()],
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Count {
    calls: u64,
    payload: u64,
    wire: u64,
}

impl CommStats {
    /// `(calls, bytes)` of one kind of collective.
    pub fn get(&self, kind: Collective) -> (u64, u64) {
        let count = self.counts[kind as usize];
        (count.calls, count.payload)
    }

    /// How many times this rank called `kind`.
    pub fn calls(&self, kind: Collective) -> u64 {
        self.get(kind).0
    }

    /// The payload bytes this rank passed to `kind`, over all its calls.
    pub fn bytes(&self, kind: Collective) -> u64 {
        self.get(kind).1
    }

    /// The payload bytes of every collective together.
    pub fn total_bytes(&self) -> u64 {
        self.counts.iter().map(|c| c.payload).sum()
    }

    /// Bytes each rank sends and receives in a ring implementation, with the
    /// (N-1)/N factor left out as in the ZeRO paper: an all-reduce moves its
    /// buffer twice (reduce-scatter then all-gather), the others once.
    pub fn ring_volume(&self) -> u64 {
        Collective::ALL
            .into_iter()
            .map(|kind| match kind {
                Collective::AllReduce => 2 * self.bytes(kind),
                Collective::AllGather | Collective::ReduceScatter | Collective::Broadcast | Collective::Send => {
                    self.bytes(kind)
                }
                // A received tensor is its sender's traffic, already counted there.
                Collective::Barrier | Collective::Recv => 0,
            })
            .sum()
    }

    /// The tensor bytes this rank sent to other ranks in `kind`, over all its calls.
    pub fn wire_bytes(&self, kind: Collective) -> u64 {
        self.counts[kind as usize].wire
    }

    /// The tensor bytes this rank sent to other ranks, all collectives together.
    pub fn total_wire_bytes(&self) -> u64 {
        self.counts.iter().map(|c| c.wire).sum()
    }

    /// What happened after the snapshot `earlier` was taken.
    pub fn since(&self, earlier: &CommStats) -> CommStats {
        let mut diff = self.clone();
        for (now, then) in diff.counts.iter_mut().zip(&earlier.counts) {
            now.calls = now.calls.saturating_sub(then.calls);
            now.payload = now.payload.saturating_sub(then.payload);
            now.wire = now.wire.saturating_sub(then.wire);
        }
        diff
    }

    /// Counts one call of `kind` with its payload bytes.
    pub(crate) fn record(&mut self, kind: Collective, payload: u64) {
        let count = &mut self.counts[kind as usize];
        count.calls += 1;
        count.payload += payload;
    }

    /// Counts tensor bytes sent to other ranks on behalf of `kind`.
    pub(crate) fn record_wire(&mut self, kind: Collective, bytes: u64) {
        self.counts[kind as usize].wire += bytes;
    }
}

/// The counts of several groups together: what a rank of a
/// [`DeviceMesh`](super::DeviceMesh) sent through all of its groups.
impl std::iter::Sum for CommStats {
    fn sum<I: Iterator<Item = CommStats>>(all: I) -> Self {
        all.fold(CommStats::default(), |mut total, one| {
            for (sum, count) in total.counts.iter_mut().zip(one.counts) {
                sum.calls += count.calls;
                sum.payload += count.payload;
                sum.wire += count.wire;
            }
            total
        })
    }
}

/// One line per collective used, e.g. `all_reduce: 2 calls, 96 bytes`.
impl fmt::Display for CommStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let used = Collective::ALL.into_iter().filter(|&kind| self.calls(kind) > 0);
        for (i, kind) in used.enumerate() {
            let (calls, bytes) = self.get(kind);
            let sep = if i == 0 { "" } else { "\n" };
            write!(f, "{sep}{kind}: {}, {bytes} bytes", crate::words::count(calls as usize, "call"))?;
        }
        Ok(())
    }
}
