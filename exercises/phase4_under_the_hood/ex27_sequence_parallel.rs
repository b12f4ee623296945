//! # Exercise 27: sequence parallelism
//!
//! Tensor parallelism (exercise 23) splits a block's matrices across the N
//! ranks of its group, but outside them every rank still holds every token:
//! the norms' inputs and outputs and the residual stream are whole (B, T, C)
//! tensors, the same on all N ranks. Those copies are what a rank's
//! activation memory is made of once the matrices are split, and they grow
//! with T. Sequence parallelism (Korthikanti et al. 2022) cuts them along the
//! sequence instead: outside the split matrices rank r keeps only its chunk
//! of the tokens, [r·T/N, (r+1)·T/N), and every per-token operation there
//! (the norm, the residual add) runs on that chunk alone.
//!
//! ```text
//! h = x + attn(norm₁(x))        y = h + mlp(norm₂(h))
//!
//! x, norm₁(x), h, norm₂(h), y   this rank's chunk of the tokens, (B, T/N, C)
//! attn_r, mlp_r                 this rank's heads and hidden units (exercise 23's
//!                               shares), on every token
//! ```
//!
//! A share reads every token and gives a partial sum over the ranks, as in
//! exercise 23; a chunk holds some of the tokens, whole. Between the two,
//! tensor parallelism's all-reduces turn into other collectives: an
//! all-reduce is a reduce-scatter followed by an all-gather, and here each
//! half lands at a different place. The volume per rank stays that of
//! exercise 23's four all-reduces; what shrinks is the activation memory
//! outside the matrices, by N.
//!
//! The contract the tests check, on every rank: `x` and `grad_output` are
//! this rank's chunks (B, T/N, C) of the block's input and of ∂L/∂y; the
//! step returns this rank's chunk of the block's output and of ∂L/∂x, and
//! the gradients of its parameters: its shards (the rows or columns of one
//! process's gradients, as in exercise 23) and both norms' weights, whole,
//! the same on every rank. The collectives: four all-gathers and four
//! reduce-scatters of (B, T, C) activations, and besides them nothing larger
//! than a norm's weight (C elements).
//!
//! A worked example, one sublayer, one number per token, 2 ranks, T = 2:
//! rank 0 holds token 0, rank 1 token 1. The "norm" only scales,
//! n = γ·input with γ = 0.5; rank r's share is s_r = w_r·n with w₀ = 3 and
//! w₁ = −1 (together w = 2). Inputs x = (2, 4), ∂L/∂out = (2, 1).
//!
//! ```text
//!                                rank 0      rank 1      one process, w = (3, −1)
//! input (its token)              2           4           (2, 4)
//! ∂L/∂out (its token)            2           1           (2, 1)
//! n = γ·input (its token)        1           2           (1, 2)
//! out (its token)                4           8           (4, 8) = x + 2·γ·x
//! ∂L/∂w_r                        4           4           (4, 4)
//! ∂L/∂n (its token)              4           2           (4, 2) = 2·∂L/∂out
//! γ's gradient from its token    8           8           16
//! ∂L/∂input (its token)          4           2           (4, 2)
//! ```
//!
//! Read first: Korthikanti et al. 2022, "Reducing Activation Recomputation in
//! Large Transformer Models", section 4.2.2 and figure 5.
//! Guide: `guide/src/phase4/27-sequence-parallel.md`. Test: `cargo test exercise_27`.

use candle_core::{Result, Tensor};

use crate::distributed::ProcessGroup;
use crate::parallel::tensor::{TensorParallelBlock, TensorParallelStep};

/// One step of `block`, this rank's shard of a decoder block, on `x`, this
/// rank's chunk (B, T/N, C) of the block's input: the chunk of the block's
/// output, then the backward from `grad_output` (this rank's chunk of
/// ∂L/∂y): the gradients of this rank's parameters (norms whole) and its
/// chunk of ∂L/∂x.
///
/// Pieces: `block.input_layernorm` and `block.post_attention_layernorm`
/// (`Module::forward`), `block.attention_share(n)` and `block.mlp_share(n)`
/// (this rank's part of a sublayer's output for every token it is given),
/// `block.params()` (the norms' weights are the names ending in
/// `input_layernorm.weight` and `post_attention_layernorm.weight`), `crate::parallel::tensor::gather_sequence(pg, chunk)`
/// and `scatter_sequence(pg, t)` (an all-gather and a reduce-scatter along
/// T), `pg.all_reduce(t, ReduceOp::Sum)` (`crate::distributed::ReduceOp`),
/// `candle_core::Var::from_tensor`, `Tensor::detach`,
/// `crate::autograd::vjp(y, grad_y)` (a `GradStore`), `store.get(t)`,
/// `crate::autograd::Gradients::from_store(params, &store)`, `accumulate`,
/// `insert` and `iter`.
pub fn sequence_parallel_step(
    pg: &dyn ProcessGroup,
    block: &TensorParallelBlock,
    x: &Tensor,
    grad_output: &Tensor,
) -> Result<TensorParallelStep> {
    let _ = (&pg, &block, &x, &grad_output);
    todo!("Exercise 27: Sequence parallelism; run `cargo xtask hint 27`")
}
