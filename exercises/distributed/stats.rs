//! Counting what a rank sends: calls and bytes per collective.

use std::fmt;

use super::Collective;

/// The calls this rank made of each collective and the payload bytes it
/// passed in: the size of the NCCL buffer (the tensor for all-reduce and
/// broadcast, the output for all-gather, the input for reduce-scatter).
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
    /// (calls, bytes), indexed by `kind as usize`: the order of [`Collective::ALL`].
    counts: [(u64, u64); Collective::ALL.len()],
}

impl CommStats {
    /// `(calls, bytes)` of one kind of collective.
    pub fn get(&self, kind: Collective) -> (u64, u64) {
        self.counts[kind as usize]
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
        self.counts.iter().map(|&(_, bytes)| bytes).sum()
    }

    /// What happened after the snapshot `earlier` was taken.
    pub fn since(&self, earlier: &CommStats) -> CommStats {
        let mut diff = self.clone();
        for (now, then) in diff.counts.iter_mut().zip(&earlier.counts) {
            now.0 = now.0.saturating_sub(then.0);
            now.1 = now.1.saturating_sub(then.1);
        }
        diff
    }

    pub(crate) fn record(&mut self, kind: Collective, bytes: u64) {
        let (calls, total) = &mut self.counts[kind as usize];
        *calls += 1;
        *total += bytes;
    }
}

/// One line per collective used, e.g. `all_reduce: 2 calls, 96 bytes`.
impl fmt::Display for CommStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let used = Collective::ALL
            .into_iter()
            .filter(|&kind| self.calls(kind) > 0);
        for (i, kind) in used.enumerate() {
            let (calls, bytes) = self.get(kind);
            let sep = if i == 0 { "" } else { "\n" };
            write!(f, "{sep}{kind}: {calls} calls, {bytes} bytes")?;
        }
        Ok(())
    }
}
