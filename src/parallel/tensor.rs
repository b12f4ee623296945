//! Tensor parallelism, Megatron style: one layer's weights split across the
//! ranks, each computing its part of every token. The MLP's split and
//! forward are exercise 20 (`exercises/phase4_under_the_hood/ex20_tensor_parallel_mlp.rs`).

use candle_core::Tensor;

/// One rank's shard of a SwiGLU MLP (`down(silu(gate x) * up x)`) split
/// across N ranks along the intermediate dimension I.
#[derive(Debug, Clone)]
pub struct TensorParallelMlp {
    /// This rank's rows of gate_proj's (I, C) weight: (I/N, C).
    pub gate_proj: Tensor,
    /// This rank's rows of up_proj's (I, C) weight: (I/N, C).
    pub up_proj: Tensor,
    /// This rank's columns of down_proj's (C, I) weight: (C, I/N).
    pub down_proj: Tensor,
}
