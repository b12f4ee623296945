//! # Exercise 20: a SwiGLU MLP split across ranks (tensor parallelism)
//!
//! Data parallelism copies the model and splits the batch; when one layer's
//! weights no longer fit a device, or one layer's compute should be spread,
//! **tensor parallelism** splits the layer itself. Megatron-LM's split of an
//! MLP needs a single collective per forward pass.
//!
//! ```text
//! whole:  y = down( silu(gate x) ⊙ up x )      gate, up: (I, C)   down: (C, I)
//!
//! split I (the hidden units) into N parts; rank r holds
//!   gate_r, up_r = rows r·I/N..(r+1)·I/N of gate, up     (I/N, C)  column-parallel
//!   down_r       = columns r·I/N..(r+1)·I/N of down      (C, I/N)  row-parallel
//!
//! rank r:  h_r = silu(gate_r x) ⊙ up_r x        (B, T, I/N)  its own hidden units, no communication
//!          y_r = down_r h_r                      (B, T, C)    a partial sum over its units
//! all:     y   = Σ_r y_r                         one all-reduce (sum)
//! ```
//!
//! Why this split: SwiGLU's product ⊙ is elementwise, so hidden unit i needs
//! row i of gate and of up and nothing else: splitting gate and up by rows
//! (their outputs) lets every rank compute its units alone. down then reads
//! the units, so it is split by its columns (its inputs), and the output is a
//! sum over the ranks' units: one all-reduce of (B, T, C). Splitting the
//! other way would need the whole hidden vector on every rank: a second
//! collective in the middle.
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
    /// (I, C), `down_proj` (C, I) split across `world` ranks as above; an
    /// error when I does not divide by `world`.
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
