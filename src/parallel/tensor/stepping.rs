//! A run of split blocks, forward and backward, each stepped by the
//! learner's exercise 23, or 27 with the activations cut along the sequence.
//! Both take a block's forward and backward in one call, so the way up calls
//! each with a zero gradient, for its output, and the way down calls it
//! again, from the input the way up kept: every block runs twice, as under
//! activation checkpointing.

use candle_core::{Result, Tensor};

use super::{TensorParallelBlock, TensorParallelStep};
use crate::autograd::Gradients;
use crate::distributed::ProcessGroup;
use crate::phase4_under_the_hood::{sequence_parallel_step, tensor_parallel_step};

/// Which exercise steps a split block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BlockStep {
    /// Exercise 23: activations whole on every rank of the group.
    #[default]
    TensorParallel,
    /// Exercise 27: outside the split matrices, each rank's chunk of the tokens.
    SequenceParallel,
}

impl BlockStep {
    /// One step of `block` on `x` from `grad_output`, by this exercise.
    pub fn run(
        self,
        pg: &dyn ProcessGroup,
        block: &TensorParallelBlock,
        x: &Tensor,
        grad_output: &Tensor,
    ) -> Result<TensorParallelStep> {
        match self {
            Self::TensorParallel => tensor_parallel_step(pg, block, x, grad_output),
            Self::SequenceParallel => sequence_parallel_step(pg, block, x, grad_output),
        }
    }
}

/// `x` through `blocks`: each block's input, and the last block's output.
pub fn forward_through(
    pg: &dyn ProcessGroup,
    blocks: &[TensorParallelBlock],
    step: BlockStep,
    x: &Tensor,
) -> Result<(Vec<Tensor>, Tensor)> {
    let mut inputs = Vec::with_capacity(blocks.len());
    let mut h = x.detach();
    for block in blocks {
        let output = step.run(pg, block, &h, &h.zeros_like()?)?.output;
        inputs.push(std::mem::replace(&mut h, output));
    }
    Ok((inputs, h))
}

/// Back through `blocks`, last first, from `grad` (∂L/∂ the last output),
/// from the `inputs` [`forward_through`] kept: hands each block's parameter
/// gradients to `take`, and returns ∂L/∂ the first block's input.
pub fn backward_through(
    pg: &dyn ProcessGroup,
    blocks: &[TensorParallelBlock],
    step: BlockStep,
    inputs: &[Tensor],
    grad: Tensor,
    mut take: impl FnMut(&Gradients) -> Result<()>,
) -> Result<Tensor> {
    let mut grad = grad;
    for (block, input) in blocks.iter().zip(inputs).rev() {
        let stepped = step.run(pg, block, input, &grad)?;
        take(&stepped.grads)?;
        grad = stepped.grad_input;
    }
    Ok(grad)
}
