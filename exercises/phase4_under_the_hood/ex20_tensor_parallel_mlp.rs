//! # Exercise 20: a SwiGLU MLP split across ranks (tensor parallelism)
//!
//! Data parallelism copies the model and splits the batch; when one layer's
//! weights no longer fit a device, or one layer's compute should be spread,
//! **tensor parallelism** splits the layer itself. Megatron-LM's split of an
//! MLP needs a single collective per forward pass, and a single one per
//! backward.
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
//! **Backward comes from autograd**, once each collective is recorded with
//! the gradient it owes. Megatron wraps the split in two operators, f where
//! the whole input enters it and g where the partial outputs leave it:
//!
//! ```text
//! y = g( partial_r( f(x) ) )
//! ```
//!
//! Each is a collective one way and the identity the other. Which way is
//! which follows from two facts: every rank reads the whole x, but only
//! through its own units, so its ∂L/∂x is only its units' part; and every
//! rank holds the whole y and computes the same loss from it, so its ∂L/∂y
//! is already the whole. The pair is conjugate: what one does forward, the
//! other does backward.
//!
//! A worked example of the backward, scalars, 2 ranks: x = 2, rank r's
//! partial is p_r = w_r·x with w₀ = 3 and w₁ = −1, and ∂L/∂y = 2. Then
//! y = 3·2 + (−1)·2 = 4 on both ranks; rank 0's part of ∂L/∂x is 2·3 = 6 and
//! rank 1's is 2·(−1) = −2, and the gradient both must hold is 4.
//!
//! Read first: Shoeybi et al. 2019, "Megatron-LM: Training Multi-Billion
//! Parameter Language Models Using Model Parallelism", section 3 and figure 3.
//! Guide: `guide/src/phase4/20-tensor-parallel-mlp.md`. Test: `cargo test exercise_20`.

use candle_core::{Result, Tensor};

use crate::distributed::SharedGroup;
use crate::parallel::tensor::TensorParallelMlp;

/// f: `x`, whole on every rank of `tp`, entering a split layer: forward the
/// identity; backward ∂L/∂x whole on every rank from each rank's part of it.
///
/// Pieces: `crate::autograd::with_backward(x, value, backward)` (`value`'s
/// numbers, recorded as a function of `x` whose gradient is
/// `backward(∂L/∂output)`; `backward` is a closure that owns what it uses:
/// `move`, with its own clone of `tp`), `tp.all_reduce(t, op)` with a
/// `crate::distributed::ReduceOp` (`ProcessGroup` in scope).
pub fn copy_to_tensor_parallel(tp: &SharedGroup, x: &Tensor) -> Result<Tensor> {
    let _ = (&tp, &x);
    todo!("Exercise 20: Tensor-parallel MLP; run `cargo xtask hint 20`")
}

/// g: `x`, this rank's partial output of a split layer, leaving it: forward
/// the whole output on every rank of `tp`; backward ∂L/∂x from ∂L/∂output.
///
/// Pieces: as for [`copy_to_tensor_parallel`].
pub fn reduce_from_tensor_parallel(tp: &SharedGroup, x: &Tensor) -> Result<Tensor> {
    let _ = (&tp, &x);
    todo!("Exercise 20: Tensor-parallel MLP; run `cargo xtask hint 20`")
}

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

    /// This rank's units on `x` (B, T, C), with no communication: its part
    /// of the MLP's output, (B, T, C). The parts of all ranks sum to the
    /// whole MLP's output.
    ///
    /// Pieces: `x.broadcast_matmul(&w.t()?)` (a linear layer without bias),
    /// `crate::kernels::silu`, `*` (elementwise).
    pub fn partial(&self, x: &Tensor) -> Result<Tensor> {
        let _ = &x;
        todo!("Exercise 20: Tensor-parallel MLP; run `cargo xtask hint 20`")
    }

    /// The whole MLP's output for `x` (B, T, C), which every rank of `tp`
    /// holds whole, on every rank; backward gives every rank the whole ∂L/∂x
    /// and its shard's gradients.
    ///
    /// Pieces: `self.partial`, [`copy_to_tensor_parallel`],
    /// [`reduce_from_tensor_parallel`].
    pub fn forward(&self, tp: &SharedGroup, x: &Tensor) -> Result<Tensor> {
        let _ = (&tp, &x);
        todo!("Exercise 20: Tensor-parallel MLP; run `cargo xtask hint 20`")
    }
}
