//! Reference solution of exercise 23: a tensor-parallel block, forward and backward.

use candle_core::{bail, Result, Tensor, Var};

use crate::autograd::{vjp, Gradients};
use crate::distributed::{ProcessGroup, ReduceOp};
use crate::model::RmsNorm;
use crate::parallel::tensor::{TensorParallelBlock, TensorParallelStep};

/// One sublayer `out = input + g(share(f(norm(input))))`, its graph cut at f.
struct Sublayer {
    input: Var,
    normed: Tensor,
    /// The norm's output as a leaf: the share's graph ends here.
    cut: Var,
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
        let cut = Var::from_tensor(&normed.detach())?; // f: the identity forward
        let share = share(cut.as_tensor())?;
        let output = (input.as_tensor().detach() + pg.all_reduce(&share, ReduceOp::Sum)?)?; // g
        Ok(Self { input, normed, cut, share, output })
    }

    /// ∂L/∂input from ∂L/∂output; adds the gradients of the block's parameters to `grads`.
    fn backward(
        &self,
        pg: &dyn ProcessGroup,
        grad_output: &Tensor,
        block: &TensorParallelBlock,
        grads: &mut Gradients,
    ) -> Result<Tensor> {
        // g's backward is the identity: the share's output gradient is grad_output.
        let share = vjp(&self.share, grad_output)?;
        grads.accumulate(&Gradients::from_store(block.params(), &share)?)?;
        let Some(part) = share.get(self.cut.as_tensor()) else { bail!("the share did not read its input") };
        let grad_normed = pg.all_reduce(part, ReduceOp::Sum)?; // f's backward
        let norm = vjp(&self.normed, &grad_normed)?;
        grads.accumulate(&Gradients::from_store(block.params(), &norm)?)?;
        let Some(through_norm) = norm.get(self.input.as_tensor()) else { bail!("the norm did not read its input") };
        grad_output + through_norm // the residual path adds grad_output itself
    }
}

pub fn tensor_parallel_step(
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
    Ok(TensorParallelStep { output: mlp.output, grads, grad_input })
}
