//! Reference solution of exercise 20: a SwiGLU MLP split across ranks, Megatron style.

use candle_core::{bail, Result, Tensor};

use crate::distributed::{ProcessGroup, ReduceOp};
use crate::kernels;
use crate::parallel::tensor::TensorParallelMlp;

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

    pub fn forward(&self, pg: &dyn ProcessGroup, x: &Tensor) -> Result<Tensor> {
        let gate = kernels::silu(&x.broadcast_matmul(&self.gate_proj.t()?)?)?; // (B, T, I/N)
        let up = x.broadcast_matmul(&self.up_proj.t()?)?; // (B, T, I/N)
        let partial = (gate * up)?.broadcast_matmul(&self.down_proj.t()?)?; // (B, T, C), this rank's share
        pg.all_reduce(&partial, ReduceOp::Sum)
    }
}
