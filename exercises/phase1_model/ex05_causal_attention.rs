//! # Exercise 5: causal scaled dot-product attention
//!
//! Each position builds its output as a weighted average of the values of the
//! positions it may see. The weights come from how well its query matches each key:
//!
//! ```text
//! scores  = q · kᵀ / sqrt(D)                 (B, H, T, T): row i = query i, column j = key j
//! scores += mask, mask[i][j] = -inf if j > i  (a token may not see the future)
//! weights = softmax(scores) over the last dim (each row sums to one)
//! out     = weights · v                       (B, H, T, D)
//! ```
//!
//! Dividing by sqrt(D) keeps the scores' variance near one whatever the head
//! size, so softmax does not saturate. The causal mask is what makes a language
//! model: position i predicts token i+1, so it must not see token i+1.
//! Position 0 sees only itself; the diagonal is always allowed.
//!
//! Example, D = 4 (so sqrt(D) = 2), query 1 of a sequence of 3: the dot
//! products with keys 0, 1, 2 are 0, 2·ln 3 ≈ 2.197 and 10; scaled, 0, ln 3
//! and 5; key 2 is in the future and masked, so the weights are
//! (1, 3, 0) / 4 = (0.25, 0.75, 0) and output 1 is 0.25·v₀ + 0.75·v₁. Output 0
//! is always exactly v₀.
//!
//! Shapes: `q`, `k`, `v` are (B, H, T, D); the output is (B, H, T, D), in the
//! inputs' dtype (f32 or bf16).
//!
//! Read first: Vaswani et al. 2017, "Attention Is All You Need", section 3.2.1.
//! Guide: `guide/src/phase1/05-causal-attention.md`. Test: `cargo test exercise_05`.

use candle_core::{Result, Tensor};

/// Causal attention of `q`, `k`, `v` (B, H, T, D); returns (B, H, T, D).
///
/// Write the composed version first, from general tensor operations; the fused
/// kernel at the end of this list comes after it passes.
///
/// - `k.t()` transposes the last two dims; `matmul` batches over (B, H).
/// - `Tensor::tril2(n, DType::U8, device)` is an (n, n) matrix of ones on and
///   below the diagonal, zeros above. `Tensor::full(f32::NEG_INFINITY,
///   shape, device)` is a tensor of -inf. `cond.where_cond(on_true, on_false)`
///   picks element by element from one of two tensors; all three must have
///   one shape (`broadcast_as` stretches a tensor to a shape). `broadcast_add`
///   adds tensors of different shapes.
/// - Softmax over the last dim: `crate::kernels::softmax(&scores)`, a fused
///   kernel with its own backward pass. `candle_nn::ops::softmax(&scores, D::Minus1)`
///   computes the same from five primitives, a few times slower. Not candle's
///   `softmax_last_dim`: it has no backward pass, so q, k and v would get no gradient.
/// - candle does not mix dtypes, and `Tensor::full` of an `f32` value is f32,
///   while the scores of bf16 inputs are bf16.
/// - Once it passes, the fast route: scaling, masking and softmax are three
///   passes over the (B, H, T, T) scores, forward and again backward, bound by
///   memory. `crate::kernels::scaled_masked_softmax(&scores, &allowed, scale)`
///   does all three in one, given the unscaled scores, the (T, T) u8 mask of
///   allowed positions and the scale: which positions and which scale are
///   still yours to get right.
pub fn causal_attention(q: &Tensor, k: &Tensor, v: &Tensor) -> Result<Tensor> {
    let _ = (&q, &k, &v);
    todo!("Exercise 5: Causal scaled dot-product attention; run `cargo xtask hint 5`")
}
