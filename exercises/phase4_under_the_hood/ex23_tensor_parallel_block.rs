//! # Exercise 23: a tensor-parallel block
//!
//! Exercise 20 split the MLP so that its forward costs one all-reduce and
//! its backward another. A decoder block has two sublayers, each behind a
//! norm and beside a residual path; the scaffolding splits attention by
//! heads (each rank its rows of q, k and v, its columns of o) the way
//! exercise 20 split the MLP by hidden units, so that each sublayer's
//! result on a rank is a partial sum of its output. The norms are small and
//! stay whole on every rank.
//!
//! ```text
//! h = x + attn(norm₁(x))        y = h + mlp(norm₂(h))
//! ```
//!
//! You assemble the block from exercise 20's operators: f where a whole
//! tensor enters a split sublayer, g where its partial outputs leave it.
//! Backward comes from autograd, and it is only right when f and g sit in
//! the right places. Two questions decide them:
//! - which tensors are whole and the same on every rank (x, the norms'
//!   outputs, h, y) and which are a rank's partial sum;
//! - which parameters must see the whole of their gradient: a norm's
//!   weight, the same on every rank, must end with the same, whole gradient
//!   on every rank.
//!
//! The contract the tests check, on every rank: the block's output (whole);
//! after a backward from it, the gradients of this rank's parameters (its
//! shards, equal to the rows or columns of one process's gradients, and
//! both norms' weights, whole) and ∂L/∂x (whole). Two all-reduces in
//! forward and two in backward, all `ReduceOp::Sum`, each of a (B, T, C)
//! activation, and no other collective.
//!
//! A worked example, one sublayer, scalars, 2 ranks. The "norm" here only
//! scales: n = γ·input, γ = 0.5. Each rank's partial is s_r = w_r·n, with
//! w₀ = 3 and w₁ = −1. Input 2, ∂L/∂out = 2.
//!
//! ```text
//!                          rank 0    rank 1    one process, w = (3, −1)
//! n = γ·input                 1         1         1
//! s_r                         3        −1         —
//! out = input + Σ s_r         4         4         4 = 2 + 3 + (−1)
//! ∂L/∂w_r                     2         2         (2, 2)
//! rank's part of ∂L/∂n        6        −2         —
//! ∂L/∂n                       4         4         4 = 2·(3 + (−1))
//! ∂L/∂γ                       8         8         8
//! ∂L/∂input                   4         4         4 = 2 (residual) + 4·0.5
//! ```
//!
//! Taken from a rank's part of ∂L/∂n instead, ∂L/∂γ would be 12 and −4:
//! parts that sum to 8, the wrong number on each rank.
//!
//! Read first: Shoeybi et al. 2019, "Megatron-LM: Training Multi-Billion
//! Parameter Language Models Using Model Parallelism", section 3 and figures
//! 3 and 4. Guide: `guide/src/phase4/23-tensor-parallel-block.md`.
//! Test: `cargo test exercise_23`.

use candle_core::{Result, Tensor};

use crate::distributed::SharedGroup;
use crate::parallel::tensor::TensorParallelBlock;

/// `block`, this rank's shard of a decoder block, on `x` (B, T, C), whole
/// on every rank of `tp`: the block's output, whole on every rank, recorded
/// so that a backward from it gives every rank the whole ∂L/∂x, its shards'
/// gradients and the norms' whole gradients.
///
/// Pieces: `block.input_layernorm` and `block.post_attention_layernorm`
/// (`RmsNorm`s, with their own `forward`, exercise 1's),
/// `block.attention_partial(n)` (this rank's heads' part of attention's
/// output), `block.mlp` (exercise 20's `TensorParallelMlp`: `partial`,
/// `forward`),
/// `crate::phase4_under_the_hood::{copy_to_tensor_parallel, reduce_from_tensor_parallel}`
/// (exercise 20's f and g), `+` on tensors.
pub fn tensor_parallel_block(tp: &SharedGroup, block: &TensorParallelBlock, x: &Tensor) -> Result<Tensor> {
    let _ = (&tp, &block, &x);
    todo!("Exercise 23: A tensor-parallel block; run `cargo xtask hint 23`")
}
