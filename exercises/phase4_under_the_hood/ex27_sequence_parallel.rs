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
//!                               partials), on every token
//! ```
//!
//! A partial reads every token and gives a part of a sum over the ranks, as
//! in exercise 23; a chunk holds some of the tokens, whole. Between the two,
//! tensor parallelism's f and g turn into other collectives: an all-reduce
//! is a reduce-scatter followed by an all-gather, and here each half lands
//! at a different place. As with f and g, each operator is a collective
//! forward and its conjugate backward; which conjugate follows from what the
//! gradient on the other side is (a part of a sum, or a rank's own tokens).
//! The volume per rank stays that of exercise 23's four all-reduces; what
//! shrinks is the activation memory outside the matrices, by N.
//!
//! One more parameter needs thought: a norm's weight is whole on every rank
//! but now reads only this rank's tokens, so each rank's gradient of it is
//! only its tokens' part. Exercise 20 has the operator for a whole tensor
//! whose gradient arrives in parts.
//!
//! The contract the tests check, on every rank: `x` is this rank's chunk
//! (B, T/N, C) of the block's input; the block returns this rank's chunk of
//! its output, recorded so that a backward from it gives this rank's chunk
//! of ∂L/∂x and the gradients of its parameters: its shards (the rows or
//! columns of one process's gradients, as in exercise 23) and both norms'
//! weights, whole, the same on every rank. The collectives: four
//! all-gathers of (B, T/N, C) chunks and four reduce-scatters of (B, T, C)
//! partials (two of each forward, two of each backward), and besides them
//! nothing larger than a norm's weight (C elements). The tests also run
//! each operator alone, on 2 and 3 ranks.
//!
//! A worked example, one sublayer, one number per token, 2 ranks, T = 2:
//! rank 0 holds token 0, rank 1 token 1. The "norm" only scales,
//! n = γ·input with γ = 0.5; rank r's partial is s_r = w_r·n with w₀ = 3 and
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

use crate::distributed::SharedGroup;
use crate::parallel::tensor::TensorParallelBlock;

/// Every rank's chunk `chunk` (B, T/N, C) of the tokens, put together:
/// (B, T, C), the same on every rank of `tp`, read next by a split
/// sublayer; backward gives this rank's chunk of ∂L/∂chunk.
///
/// Pieces: `crate::autograd::with_backward(x, value, backward)` (as in
/// exercise 20), `crate::parallel::tensor::gather_sequence(tp, chunk)` and
/// `scatter_sequence(tp, t)` (an all-gather and a reduce-scatter along T,
/// recording nothing).
pub fn all_gather_tokens(tp: &SharedGroup, chunk: &Tensor) -> Result<Tensor> {
    let _ = (&tp, &chunk);
    todo!("Exercise 27: Sequence parallelism; run `cargo xtask hint 27`")
}

/// This rank's chunk (B, T/N, C) of the sum over the ranks of `t`, a split
/// sublayer's partial output for every token, (B, T, C); backward gives
/// ∂L/∂t.
///
/// Pieces: as for [`all_gather_tokens`].
pub fn reduce_scatter_tokens(tp: &SharedGroup, t: &Tensor) -> Result<Tensor> {
    let _ = (&tp, &t);
    todo!("Exercise 27: Sequence parallelism; run `cargo xtask hint 27`")
}

/// `block`, this rank's shard of a decoder block, on `x`, this rank's chunk
/// (B, T/N, C) of the block's input: its chunk of the block's output,
/// recorded so that a backward gives its chunk of ∂L/∂x, its shards'
/// gradients and the norms' whole gradients, the same on every rank.
///
/// Pieces: `block.input_layernorm` and `block.post_attention_layernorm`
/// (`crate::model::RmsNorm`, with `weight` and `eps`; `RmsNorm::new` and
/// its own `forward`, exercise 1's), `block.attention_partial(n)` and
/// `block.mlp.partial(n)` (this rank's part of a sublayer's output for every
/// token it is given), [`all_gather_tokens`], [`reduce_scatter_tokens`],
/// `crate::phase4_under_the_hood::copy_to_tensor_parallel` (exercise 20's f).
pub fn sequence_parallel_block(tp: &SharedGroup, block: &TensorParallelBlock, x: &Tensor) -> Result<Tensor> {
    let _ = (&tp, &block, &x);
    todo!("Exercise 27: Sequence parallelism; run `cargo xtask hint 27`")
}
