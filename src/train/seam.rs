//! The seam between a training loop and a trainer: what the loop needs,
//! whichever way the ranks share the work.
//!
//! [`Trainer`](super::Trainer) (whole replicas, exercise 10's step) and
//! [`MeshTrainer`](crate::parallel::MeshTrainer) (the model over a
//! mesh: sharded, pipelined, split, or all three) implement [`Train`]; the
//! trainer binary's loop, its checkpoints and its reports see nothing else.

use std::path::Path;

use candle_core::{Result, Tensor};

use super::{DataPosition, StepCounters, StepStats};
use crate::distributed::{CommStats, DeviceMesh, ProcessGroup};

/// What a training loop needs of a trainer.
pub trait Train {
    /// One optimizer step over `micro_batches`, each (B, T) token ids.
    fn train_step(&mut self, micro_batches: &[Tensor]) -> Result<StepStats>;
    fn save_checkpoint(&self, dir: &Path, data: Option<DataPosition>) -> Result<()>;
    fn load_checkpoint(&mut self, dir: &Path) -> Result<Option<DataPosition>>;
    fn counters(&self) -> StepCounters;
    /// Every rank of the job.
    fn process_group(&self) -> &dyn ProcessGroup;
    /// The mesh the ranks are laid out on, for a trainer that splits the
    /// model across some of them (a pipeline, tensor parallelism).
    fn mesh(&self) -> Option<&DeviceMesh> {
        None
    }
    /// This rank's replica and how many replicas read different data: every
    /// rank is one under DDP and FSDP; the ranks of one pipeline or one
    /// tensor-parallel group read the same batch.
    fn replica(&self) -> (usize, usize) {
        match self.mesh() {
            Some(mesh) => (mesh.coords().dp, mesh.shape().dp),
            None => (self.process_group().rank(), self.process_group().world_size()),
        }
    }
    /// What this rank has sent so far, through every group it belongs to.
    fn comm_stats(&self) -> CommStats {
        self.mesh().map_or_else(|| self.process_group().stats(), DeviceMesh::stats)
    }
    /// The mean next-token loss of `tokens` (B, T) under the current
    /// parameters, with no gradient kept and nothing changed: the held-out
    /// evaluation. Every rank of a replica calls it with the same batch.
    fn eval_loss(&mut self, tokens: &Tensor) -> Result<f64>;
    /// How the trainer splits the work across ranks, in words.
    fn layout(&self) -> String;
    /// Bytes of parameters, gradients and optimizer state this rank holds,
    /// where the trainer shards them; `None` when every rank holds the
    /// whole model's.
    fn model_states_bytes(&self) -> Option<u64> {
        None
    }
    /// What the run should print at its end about how it used memory and the network.
    fn report(&self) -> Option<String>;
}
