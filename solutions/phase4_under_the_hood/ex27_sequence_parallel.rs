//! Reference solution of exercise 27: sequence parallelism.

use candle_core::{bail, Result, Tensor, Var};

use crate::autograd::{vjp, Gradients};
use crate::distributed::{ProcessGroup, ReduceOp};
use crate::model::RmsNorm;
use crate::parallel::tensor::{gather_sequence, scatter_sequence, TensorParallelBlock, TensorParallelStep};

/// One sublayer `out = input + share(norm(input))` on this rank's tokens.
struct Sublayer {
    input: Var,
    /// The norm's output on this rank's tokens.
    normed: Tensor,
    /// Every token's norm output, gathered: the share's graph starts here.
    gathered: Var,
    /// This rank's share for every token: a part of the sum over ranks.
    share: Tensor,
    output: Tensor,
}

impl Sublayer {
    fn forward(
        pg: &dyn ProcessGroup,
        norm: &RmsNorm,
        share: impl Fn(&Tensor) -> Result<Tensor>,
        input: &Tensor,
    ) -> Result<Self> {
        let input = Var::from_tensor(&input.detach())?;
        let normed = norm.forward(input.as_tensor())?;
        let gathered = Var::from_tensor(&gather_sequence(pg, &normed.detach())?)?;
        let share = share(gathered.as_tensor())?;
        // The sum over ranks, of this rank's tokens only.
        let output = (input.as_tensor().detach() + scatter_sequence(pg, &share)?)?;
        Ok(Self { input, normed, gathered, share, output })
    }

    /// This rank's tokens of ∂L/∂input from its tokens of ∂L/∂output; adds
    /// the gradients of the block's parameters to `grads` (the norm's from
    /// this rank's tokens only).
    fn backward(
        &self,
        pg: &dyn ProcessGroup,
        grad_output: &Tensor,
        block: &TensorParallelBlock,
        grads: &mut Gradients,
    ) -> Result<Tensor> {
        // The share read every token: it needs every token's output gradient.
        let share = vjp(&self.share, &gather_sequence(pg, grad_output)?)?;
        grads.accumulate(&Gradients::from_store(block.params(), &share)?)?;
        let Some(part) = share.get(self.gathered.as_tensor()) else { bail!("the share did not read its input") };
        let grad_normed = scatter_sequence(pg, part)?;
        let norm = vjp(&self.normed, &grad_normed)?;
        grads.accumulate(&Gradients::from_store(block.params(), &norm)?)?;
        let Some(through_norm) = norm.get(self.input.as_tensor()) else { bail!("the norm did not read its input") };
        grad_output + through_norm
    }
}

pub fn sequence_parallel_step(
    pg: &dyn ProcessGroup,
    block: &TensorParallelBlock,
    x: &Tensor,
    grad_output: &Tensor,
) -> Result<TensorParallelStep> {
    let attention = Sublayer::forward(pg, &block.input_layernorm, |n| block.attention_share(n), x)?;
    let mlp = Sublayer::forward(pg, &block.post_attention_layernorm, |n| block.mlp_share(n), &attention.output)?;
    let mut grads = Gradients::default();
    let grad_hidden = mlp.backward(pg, grad_output, block, &mut grads)?;
    let grad_input = attention.backward(pg, &grad_hidden, block, &mut grads)?;
    // The norms saw this rank's tokens only: their gradients add up over the ranks.
    let mut whole = Gradients::default();
    for (name, grad) in grads.iter() {
        let grad = match name.contains("layernorm") {
            true => pg.all_reduce(grad, ReduceOp::Sum)?,
            false => grad.clone(),
        };
        whole.insert(name, grad);
    }
    Ok(TensorParallelStep { output: mlp.output, grads: whole, grad_input })
}
