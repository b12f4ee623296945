//! Reference solution of exercise 27: sequence parallelism.

use candle_core::{Result, Tensor};

use crate::autograd::with_backward;
use crate::distributed::SharedGroup;
use crate::model::RmsNorm;
use crate::parallel::tensor::{gather_sequence, scatter_sequence, TensorParallelBlock};
use crate::phase4_under_the_hood::copy_to_tensor_parallel;

pub fn all_gather_tokens(tp: &SharedGroup, chunk: &Tensor) -> Result<Tensor> {
    let back = tp.clone();
    // Every rank's partial read every token: the chunk's gradient is the sum of their parts.
    with_backward(chunk, &gather_sequence(tp, chunk)?, move |grad| scatter_sequence(&back, grad))
}

pub fn reduce_scatter_tokens(tp: &SharedGroup, t: &Tensor) -> Result<Tensor> {
    let back = tp.clone();
    // Each token's sum read every rank's partial: each partial's gradient is every token's.
    with_backward(t, &scatter_sequence(tp, t)?, move |grad| gather_sequence(&back, grad))
}

/// `norm` on this rank's tokens, its weight's gradient summed over the ranks' tokens.
fn norm_of_own_tokens(tp: &SharedGroup, norm: &RmsNorm, chunk: &Tensor) -> Result<Tensor> {
    RmsNorm::new(copy_to_tensor_parallel(tp, &norm.weight)?, norm.eps).forward(chunk)
}

pub fn sequence_parallel_block(tp: &SharedGroup, block: &TensorParallelBlock, x: &Tensor) -> Result<Tensor> {
    let normed = all_gather_tokens(tp, &norm_of_own_tokens(tp, &block.input_layernorm, x)?)?;
    let h = (x + reduce_scatter_tokens(tp, &block.attention_partial(&normed)?)?)?;
    let normed = all_gather_tokens(tp, &norm_of_own_tokens(tp, &block.post_attention_layernorm, &h)?)?;
    h + reduce_scatter_tokens(tp, &block.mlp.partial(&normed)?)?
}
