//! # Exercise 23: a tensor-parallel block, forward and backward
//!
//! Exercise 20 split the MLP so that its forward costs one all-reduce. The
//! scaffolding splits a whole decoder block the same way twice, attention by
//! heads and the MLP by hidden units, so that each sublayer's share on a
//! rank is a partial sum of its output. The norms are small and stay whole
//! on every rank.
//!
//! ```text
//! h = x + g(attn_r(f(norm₁(x))))        y = h + g(mlp_r(f(norm₂(h))))
//!
//! f: forward the identity (every rank already holds the whole input);
//!    backward an all-reduce (each rank's heads or units give a part of ∂L/∂input)
//! g: forward an all-reduce (the shares sum to the sublayer's output);
//!    backward the identity (every rank needs the whole ∂L/∂output, and has it)
//! ```
//!
//! Megatron's f and g (Shoeybi et al. 2019, figure 3) are conjugate: one
//! all-reduce per sublayer in forward (g) and one in backward (f), four per
//! block in all, each of a (B, T, C) activation.
//!
//! candle's autograd does not see through a collective (the result of an
//! all-reduce carries no graph), so the backward is yours to write:
//! `crate::autograd::vjp` gives ∂L/∂(what a graph was computed from) given
//! ∂L/∂(its output), and the gradient crosses each collective by hand. The
//! trap: a graph that reaches a norm's weight while ∂L/∂(the norm's output)
//! is still only this rank's part gives that weight a partial gradient. Where
//! each stretch of graph begins decides which parameters a `vjp` reaches, and
//! with which part of the gradient.
//!
//! The contract the tests check, on every rank: the block's output (whole);
//! the gradients of this rank's parameters (its shards, equal to the rows or
//! columns of one process's gradients, and both norms' weights, whole); and
//! ∂L/∂x (whole). Exactly four all-reduces, all `ReduceOp::Sum`, and no other
//! collective.
//!
//! A worked example, one sublayer, scalars, 2 ranks. The "norm" here only
//! scales: n = γ·input, γ = 0.5. Each rank's share is s_r = w_r·n, with
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

use crate::distributed::ProcessGroup;
use crate::parallel::tensor::{TensorParallelBlock, TensorParallelStep};

/// One step of `block`, this rank's shard of a decoder block, on `x`
/// (B, T, C), whole on every rank: the block's output, whole on every rank,
/// then the backward from `grad_output` (∂L/∂y, (B, T, C), whole on every
/// rank): the gradients of this rank's parameters and ∂L/∂x.
///
/// Pieces: `block.input_layernorm` and `block.post_attention_layernorm`
/// (`Module::forward`), `block.attention_share(n)` and `block.mlp_share(n)`
/// (this rank's part of each sublayer's output), `block.params()`,
/// `pg.all_reduce(t, ReduceOp::Sum)` (`crate::distributed::ReduceOp`),
/// `candle_core::Var::from_tensor`, `Tensor::detach`,
/// `crate::autograd::vjp(y, grad_y)` (a `GradStore`), `store.get(t)`,
/// `crate::autograd::Gradients::from_store(params, &store)` and `accumulate`.
pub fn tensor_parallel_step(
    pg: &dyn ProcessGroup,
    block: &TensorParallelBlock,
    x: &Tensor,
    grad_output: &Tensor,
) -> Result<TensorParallelStep> {
    let _ = (&pg, &block, &x, &grad_output);
    todo!("Exercise 23: A tensor-parallel block, forward and backward; run `cargo xtask hint 23`")
}
