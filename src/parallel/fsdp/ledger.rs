//! The ledger: what one rank held and sent during one optimizer step.

use std::fmt;

use crate::distributed::CommStats;

/// Bytes one rank held during a step, by what they were for.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemoryLedger {
    /// Parameters kept between steps in the compute dtype (unsharded replicas).
    pub params: u64,
    /// f32 master weights kept for the optimizer (beside low-precision replicas, or as the shards).
    pub master_params: u64,
    /// The gradient buffer at its largest.
    pub grads: u64,
    /// AdamW's two moments.
    pub optimizer_state: u64,
    /// Master weights and moments kept in a file between steps (`--offload`),
    /// counted in none of the above.
    pub offloaded: u64,
    /// Gathered parameters of units alive at once, at most.
    pub gathered_peak: u64,
    /// What the forward pass leaves allocated for backward, at most: the
    /// root's saved tensors, measured by
    /// [`CountingAllocator`](crate::memory::CountingAllocator), and the block
    /// inputs the unit step keeps, by their size. `None` when the running
    /// binary does not install the allocator.
    pub activations_peak: Option<u64>,
}

impl MemoryLedger {
    /// Parameters, master weights, gradients and optimizer state: what the
    /// ZeRO paper calls model states, the part sharding divides.
    pub fn model_states(&self) -> u64 {
        self.params + self.master_params + self.grads + self.optimizer_state
    }
}

/// What several units hold between steps, added up; the peaks are not.
impl std::iter::Sum for MemoryLedger {
    fn sum<I: Iterator<Item = Self>>(ledgers: I) -> Self {
        ledgers.fold(Self::default(), |total, m| Self {
            params: total.params + m.params,
            master_params: total.master_params + m.master_params,
            grads: total.grads + m.grads,
            optimizer_state: total.optimizer_state + m.optimizer_state,
            offloaded: total.offloaded + m.offloaded,
            ..total
        })
    }
}

/// What one rank held and sent during its last optimizer step.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StepLedger {
    pub memory: MemoryLedger,
    /// The collectives of the step: calls and payload bytes of each.
    pub comm: CommStats,
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

/// The model states part by part, one line each, in MiB (and what is
/// offloaded, if anything); the peaks are the caller's to say.
impl fmt::Display for MemoryLedger {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "  params (compute dtype) {:>10.2}", mib(self.params))?;
        writeln!(f, "  master params (f32)    {:>10.2}", mib(self.master_params))?;
        writeln!(f, "  gradients              {:>10.2}", mib(self.grads))?;
        writeln!(f, "  optimizer state        {:>10.2}", mib(self.optimizer_state))?;
        write!(f, "  = model states         {:>10.2}", mib(self.model_states()))?;
        if self.offloaded > 0 {
            write!(f, "\n  offloaded to a file    {:>10.2}", mib(self.offloaded))?;
        }
        Ok(())
    }
}

impl fmt::Display for StepLedger {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let m = &self.memory;
        writeln!(f, "memory per rank (MiB):")?;
        writeln!(f, "{m}")?;
        writeln!(f, "{}", Peaks(m))?;
        writeln!(f, "communication per step:")?;
        for line in self.comm.to_string().lines() {
            writeln!(f, "  {line}")?;
        }
        write!(f, "  ring volume {:.2} MiB", mib(self.comm.ring_volume()))
    }
}

/// A ledger's peaks, gathered units and activations, one line each in MiB.
pub struct Peaks<'a>(pub &'a MemoryLedger);

impl fmt::Display for Peaks<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "  gathered units, peak   {:>10.2}", mib(self.0.gathered_peak))?;
        match self.0.activations_peak {
            Some(bytes) => write!(f, "  activations, peak      {:>10.2}", mib(bytes)),
            None => write!(f, "  activations, peak      not measured (the host's CountingAllocator counts it: not installed, or the model is on a GPU)"),
        }
    }
}
