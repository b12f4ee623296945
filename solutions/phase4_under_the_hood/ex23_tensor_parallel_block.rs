//! Reference solution of exercise 23: a tensor-parallel block.

use candle_core::{Result, Tensor};

use crate::distributed::SharedGroup;
use crate::parallel::tensor::TensorParallelBlock;
use crate::phase4_under_the_hood::{copy_to_tensor_parallel, reduce_from_tensor_parallel};

pub fn tensor_parallel_block(tp: &SharedGroup, block: &TensorParallelBlock, x: &Tensor) -> Result<Tensor> {
    // f after the norm: the norm's weight then gets the whole of ∂L/∂(its output).
    let normed = copy_to_tensor_parallel(tp, &block.input_layernorm.forward(x)?)?;
    let h = (x + reduce_from_tensor_parallel(tp, &block.attention_partial(&normed)?)?)?;
    let mlp = block.mlp.forward(tp, &block.post_attention_layernorm.forward(&h)?)?;
    h + mlp
}
