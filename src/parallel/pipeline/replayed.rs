//! A stage's blocks when their forward keeps no graph: split across a
//! tensor-parallel group (exercises 23 and 27 take a block's forward and
//! backward in one call), or sharded as FSDP units across the data-parallel
//! group (exercise 22 gathers, runs and frees each unit). Either way a
//! forward keeps each block's input, found by the output the stage handed
//! out, and the stage's backward replays the blocks from them.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, PoisonError};

use candle_core::{bail, Result, Tensor, TensorId, Var};

use crate::autograd::Gradients;
use crate::called_early::{fsdp_backward, fsdp_forward};
use crate::distributed::{ProcessGroup, SharedGroup};
use crate::parallel::fsdp_unit::BlockUnit;
use crate::parallel::tensor::{backward_through, forward_through, gather_sequence, BlockStep, TensorParallelBlock};

/// Blocks replayed in backward, and what each forward in flight kept.
pub(super) struct ReplayedBlocks {
    through: Through,
    in_flight: Mutex<HashMap<TensorId, Kept>>,
}

/// How the blocks are held and stepped.
pub(super) enum Through {
    /// This rank's shard of each block, across `tp`, stepped by `step`.
    Split { blocks: Vec<TensorParallelBlock>, tp: SharedGroup, step: BlockStep },
    /// Each block an FSDP unit across `shard`: this rank keeps its shard;
    /// under HYBRID_SHARD the shard groups are `replicas` of each other.
    Sharded { units: Mutex<Vec<BlockUnit>>, shard: SharedGroup, replicas: Option<SharedGroup> },
}

/// What one forward keeps for its backward.
pub(super) struct Kept {
    /// The stage's input: the embedding's output, with its graph (first
    /// stage), or the activation received, whose gradient goes back.
    pub input: Tensor,
    /// Each block's input, detached.
    pub block_inputs: Vec<Tensor>,
    /// On the last stage, the last block's output as the leaf the head read.
    pub top: Option<Var>,
}

impl ReplayedBlocks {
    pub(super) fn new(through: Through) -> Self {
        Self { through, in_flight: Mutex::new(HashMap::new()) }
    }

    /// `x` (B, T, C) through the blocks, no graph kept: each block's input,
    /// and the last block's output, (B, T, C) whole.
    pub(super) fn forward(&self, x: &Tensor) -> Result<(Vec<Tensor>, Tensor)> {
        match &self.through {
            Through::Split { blocks, tp, step } => {
                let (inputs, h) = forward_through(tp, blocks, *step, &own_tokens(tp, *step, x)?)?;
                Ok((inputs, all_tokens(tp, *step, &h)?))
            }
            Through::Sharded { units, shard, .. } => {
                let pass = fsdp_forward(shard, &mut lock(units), x)?;
                Ok((pass.inputs, pass.output))
            }
        }
    }

    /// Back through the blocks, last first, from `grad` (∂L/∂ the last
    /// output, whole), from the inputs [`forward`](Self::forward) kept: a
    /// split block's parameter gradients go to `take`, a unit keeps its own
    /// shard of them. Returns ∂L/∂ the first block's input, whole.
    pub(super) fn backward(
        &self,
        inputs: &[Tensor],
        grad: Tensor,
        take: impl FnMut(&Gradients) -> Result<()>,
    ) -> Result<Tensor> {
        match &self.through {
            Through::Split { blocks, tp, step } => {
                let grad = own_tokens(tp, *step, &grad)?;
                let grad = backward_through(tp, blocks, *step, inputs, grad, take)?;
                all_tokens(tp, *step, &grad)
            }
            Through::Sharded { units, shard, .. } => fsdp_backward(shard, &mut lock(units), inputs, &grad),
        }
    }

    /// Keeps what the forward that returned `output` needs for its backward.
    pub(super) fn keep(&self, output: &Tensor, kept: Kept) {
        lock(&self.in_flight).insert(output.id(), kept);
    }

    /// What the forward that returned `output` kept, handed over.
    pub(super) fn take(&self, output: &Tensor) -> Option<Kept> {
        lock(&self.in_flight).remove(&output.id())
    }

    /// The FSDP units and their groups, when the blocks are sharded.
    pub(super) fn units(&self) -> Option<HeldUnits<'_>> {
        match &self.through {
            Through::Sharded { units, shard, replicas } => {
                Some(HeldUnits { units: lock(units), shard, replicas: replicas.as_ref() })
            }
            Through::Split { .. } => None,
        }
    }
}

/// A stage's FSDP units, held for a step or a checkpoint, with the group
/// they are sharded over and, under HYBRID_SHARD, the group of ranks that
/// hold the same shards.
pub struct HeldUnits<'a> {
    pub units: MutexGuard<'a, Vec<BlockUnit>>,
    pub shard: &'a SharedGroup,
    pub replicas: Option<&'a SharedGroup>,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// This rank's chunk of the tokens of `t`, (B, T, C), under sequence
/// parallelism; `t` itself otherwise. Activations enter and leave a stage
/// whole, so pipelines and the head see the same tensors either way.
fn own_tokens(tp: &SharedGroup, step: BlockStep, t: &Tensor) -> Result<Tensor> {
    if step != BlockStep::SequenceParallel {
        return Ok(t.clone());
    }
    let (rank, ranks, seq_len) = (tp.rank(), tp.world_size(), t.dim(1)?);
    if !seq_len.is_multiple_of(ranks) {
        bail!(
            "--sequence-parallel cuts each sequence into {ranks} chunks, one per tensor-parallel rank, and \
             {seq_len} tokens do not split into {ranks}: use a --seq-len that {ranks} divides"
        );
    }
    t.narrow(1, rank * seq_len / ranks, seq_len / ranks)
}

/// Every rank's chunk put together under sequence parallelism; `t` itself otherwise.
fn all_tokens(tp: &SharedGroup, step: BlockStep, t: &Tensor) -> Result<Tensor> {
    match step {
        BlockStep::SequenceParallel => gather_sequence(tp, t),
        BlockStep::TensorParallel => Ok(t.clone()),
    }
}
