//! Reference solution of exercise 20: a SwiGLU MLP split across ranks, Megatron style.

use candle_core::{bail, Result, Tensor};

use crate::autograd::with_backward;
use crate::distributed::{ProcessGroup, ReduceOp, SharedGroup};
use crate::kernels;
use crate::parallel::tensor::TensorParallelMlp;

/// f: every rank already holds the whole input; each rank's part of its gradient sums to the whole.
pub fn copy_to_tensor_parallel(tp: &SharedGroup, x: &Tensor) -> Result<Tensor> {
    let tp = tp.clone();
    with_backward(x, x, move |grad| tp.all_reduce(grad, ReduceOp::Sum))
}

/// g: the ranks' partial outputs sum to the output; its gradient is whole on every rank already.
pub fn reduce_from_tensor_parallel(tp: &SharedGroup, x: &Tensor) -> Result<Tensor> {
    with_backward(x, &tp.all_reduce(x, ReduceOp::Sum)?, |grad| Ok(grad.clone()))
}

impl TensorParallelMlp {
    pub fn shard(gate_proj: &Tensor, up_proj: &Tensor, down_proj: &Tensor, rank: usize, world: usize) -> Result<Self> {
        let intermediate = gate_proj.dim(0)?;
        if !intermediate.is_multiple_of(world) {
            bail!("the MLP's width {intermediate} does not split across {world} ranks");
        }
        let part = intermediate / world;
        Ok(Self {
            // Column-parallel: each rank computes its own I/N of the hidden units.
            gate_proj: gate_proj.narrow(0, rank * part, part)?,
            up_proj: up_proj.narrow(0, rank * part, part)?,
            // Row-parallel: it reads only those units, giving a partial sum of the output.
            down_proj: down_proj.narrow(1, rank * part, part)?,
        })
    }

    pub fn partial(&self, x: &Tensor) -> Result<Tensor> {
        let gate = kernels::silu(&x.broadcast_matmul(&self.gate_proj.t()?)?)?; // (B, T, I/N)
        let up = x.broadcast_matmul(&self.up_proj.t()?)?; // (B, T, I/N)
        (gate * up)?.broadcast_matmul(&self.down_proj.t()?) // (B, T, C), this rank's share
    }

    pub fn forward(&self, tp: &SharedGroup, x: &Tensor) -> Result<Tensor> {
        reduce_from_tensor_parallel(tp, &self.partial(&copy_to_tensor_parallel(tp, x)?)?)
    }
}
