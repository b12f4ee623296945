//! This rank's shard of a block as a module: the learner's exercise 23 runs
//! it, or 27 with the activations cut along the sequence. The collectives
//! inside are recorded in the graph (exercise 20's f and g, exercise 27's
//! gathers and scatters), so the block runs once per micro-batch and
//! candle's backward does the rest.
//!
//! Every rank of the group must call its backward collectives in the same
//! order. candle's backward visits the graph's nodes in an order that
//! depends only on the graph's shape (a depth-first walk over each op's
//! operands, in operand order), and every rank builds the same shape: the
//! same code on tensors of the same shapes. `tests/graded/phase_4.rs`
//! checks the order on a traced run.

use std::sync::Arc;

use candle_core::{Module, Result, Tensor};

use super::TensorParallelBlock;
use crate::autograd::Checkpointed;
use crate::distributed::SharedGroup;
use crate::phase4_under_the_hood::{sequence_parallel_block, tensor_parallel_block};

/// Which exercise runs a split block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BlockStep {
    /// Exercise 23: activations whole on every rank of the group.
    #[default]
    TensorParallel,
    /// Exercise 27: outside the split matrices, each rank's chunk of the tokens.
    SequenceParallel,
}

impl BlockStep {
    /// `block` on `x` across `tp`, by this exercise.
    pub fn run(self, tp: &SharedGroup, block: &TensorParallelBlock, x: &Tensor) -> Result<Tensor> {
        match self {
            Self::TensorParallel => tensor_parallel_block(tp, block, x),
            Self::SequenceParallel => sequence_parallel_block(tp, block, x),
        }
    }

    /// The exercise that writes this block.
    pub fn exercise(self) -> u32 {
        match self {
            Self::TensorParallel => 23,
            Self::SequenceParallel => 27,
        }
    }
}

/// This rank's shard of a block across `tp`, run by `step`'s exercise.
#[derive(Clone)]
pub struct SplitBlock {
    block: Arc<TensorParallelBlock>,
    tp: SharedGroup,
    step: BlockStep,
}

impl SplitBlock {
    pub fn new(block: TensorParallelBlock, tp: SharedGroup, step: BlockStep) -> Self {
        Self { block: Arc::new(block), tp, step }
    }

    /// The shard's parameters, by the whole model's names.
    pub fn block(&self) -> &TensorParallelBlock {
        &self.block
    }
}

impl Module for SplitBlock {
    /// `x` through the block: whole (B, T, C), or under sequence
    /// parallelism this rank's chunk (B, T/N, C), in and out.
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.step.run(&self.tp, &self.block, x)
    }
}

impl Checkpointed for SplitBlock {
    fn variables(&self) -> Option<Vec<Tensor>> {
        Some(self.block.params().iter().map(|(_, var)| var.as_tensor().clone()).collect())
    }
}
