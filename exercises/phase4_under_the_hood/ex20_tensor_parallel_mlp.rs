//! # Exercise 20: a SwiGLU MLP split across ranks (tensor parallelism)
//!
//! Data parallelism copies the model and splits the batch; when one layer's
//! weights no longer fit a device, or one layer's compute should be spread,
//! **tensor parallelism** splits the layer itself. Megatron-LM's split of an
//! MLP needs a single collective per forward pass.
//!
//! ```text
//! y = down( silu(gate x) ⊙ up x )      x: (B, T, C)   gate, up: (I, C)   down: (C, I)
//! ```
//!
//! The I hidden units are split into N equal runs: rank r owns units
//! r·I/N..(r+1)·I/N, and holds of each weight exactly the part that only its
//! own units need. Which part of gate, of up and of down is that, given
//! that ⊙ and silu work unit by unit? Then each rank computes something from
//! the whole x, which every rank holds, without talking to the others, and
//! one collective at the very end turns the ranks' results into the whole y
//! on every rank. Splitting a weight the other way would need the ranks to
//! talk in the middle of the MLP: that is the trap to avoid.
//!
//! A worked example, C = 2, I = 4, N = 2 (rank 0 owns units 0 and 1), one
//! token x = [1, 2], with each unit's activation silu(gate x) ⊙ up x already
//! worked out as h = [0.5, -1, 2, 0]:
//!
//! ```text
//!   down (C, I) = [[1, 0, 1,  2],
//!                  [0, 1, 1, -1]]
//!   whole:   y = down · h = [2.5, 1]
//! ```
//!
//! Which numbers of down does each rank hold, what does each compute from
//! its own two units, and how do the two results make [2.5, 1]?
//!
//! Backward mirrors it (Megatron's f and g operators): the all-reduce's
//! gradient is the identity, and the gradient of the input x, which every
//! rank uses whole, is a sum over ranks: one all-reduce in backward.
//!
//! Read first: Shoeybi et al. 2019, "Megatron-LM: Training Multi-Billion
//! Parameter Language Models Using Model Parallelism", section 3 and figure 3.
//! Guide: `guide/src/phase4/20-tensor-parallel-mlp.md`. Test: `cargo test exercise_20`.

use candle_core::{Result, Tensor};

use crate::distributed::ProcessGroup;
use crate::parallel::tensor::TensorParallelMlp;

impl TensorParallelMlp {
    /// Rank `rank`'s shard of the whole MLP `gate_proj` (I, C), `up_proj`
    /// (I, C), `down_proj` (C, I) split across `world` ranks by hidden units
    /// as above, each piece a tensor of its own; an error when I does not
    /// divide by `world`.
    ///
    /// Pieces: `Tensor::dim`, `Tensor::narrow(dim, start, len)`,
    /// `candle_core::bail!`, `usize::is_multiple_of`.
    pub fn shard(gate_proj: &Tensor, up_proj: &Tensor, down_proj: &Tensor, rank: usize, world: usize) -> Result<Self> {
        let _ = (&gate_proj, &up_proj, &down_proj, &rank, &world);
        todo!("Exercise 20: Tensor-parallel MLP; run `cargo xtask hint 20`")
    }

    /// The whole MLP's output for `x` (B, T, C), which every rank holds whole,
    /// on every rank: its own units' partial output, summed over the ranks.
    ///
    /// Pieces: `x.broadcast_matmul(&w.t()?)` (a linear layer without bias),
    /// `crate::kernels::silu`, `*` (elementwise), `pg.all_reduce(&t, op)`
    /// with a `crate::distributed::ReduceOp`.
    pub fn forward(&self, pg: &dyn ProcessGroup, x: &Tensor) -> Result<Tensor> {
        let _ = (&pg, &x);
        todo!("Exercise 20: Tensor-parallel MLP; run `cargo xtask hint 20`")
    }
}
