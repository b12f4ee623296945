//! What a mesh run prints at its end: what one rank holds, and what its
//! last step sent along each axis of the mesh.

use std::fmt;

use crate::distributed::{Axis, CommStats, DeviceMesh};
use crate::parallel::fsdp::{MemoryLedger, Peaks};

/// A rank's memory and its last step's communication, by axis.
pub(super) struct MeshReport {
    pub shape: String,
    /// Parameters, gradients and AdamW state this rank holds; `None` for a whole replica.
    pub memory: Option<MemoryLedger>,
    /// The most bytes of gathered FSDP units and of activations held at
    /// once in the last step, when the blocks are units.
    pub peaks: Option<MemoryLedger>,
    /// What the last step sent along each axis with more than one rank.
    pub last_step: Vec<(Axis, CommStats)>,
}

/// What each group of `mesh` has sent so far, by axis, for the axes with
/// more than one rank; `dp` is what the dp axis sent, the groups split out
/// of it (HYBRID_SHARD's shard and replica groups) included.
pub(super) fn sent_by_axis(mesh: &DeviceMesh, dp: &CommStats) -> Vec<(Axis, CommStats)> {
    [Axis::Dp, Axis::Pp, Axis::Tp]
        .into_iter()
        .filter(|&axis| mesh.group(axis).world_size() > 1)
        .map(|axis| match axis {
            Axis::Dp => (axis, dp.clone()),
            _ => (axis, mesh.group(axis).stats()),
        })
        .collect()
}

impl fmt::Display for MeshReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mib = |bytes: u64| bytes as f64 / (1u64 << 20) as f64;
        writeln!(f, "mesh {}, rank 0's last step:", self.shape)?;
        writeln!(f, "memory per rank (MiB):")?;
        match &self.memory {
            Some(memory) => writeln!(f, "{memory}")?,
            None => writeln!(f, "  model states           a whole replica's")?,
        }
        if let Some(peaks) = &self.peaks {
            writeln!(f, "{}", Peaks(peaks))?;
        }
        write!(f, "communication per step:")?;
        if self.last_step.is_empty() {
            write!(f, " none (one rank)")?;
        }
        for (axis, sent) in &self.last_step {
            let axis = match axis {
                Axis::Dp => "dp",
                Axis::Pp => "pp",
                Axis::Tp => "tp",
            };
            write!(f, "\n  along {axis}:")?;
            for line in sent.to_string().lines() {
                write!(f, "\n    {line}")?;
            }
            write!(f, "\n    ring volume {:.2} MiB", mib(sent.ring_volume()))?;
        }
        Ok(())
    }
}
