//! # Exercise 3: rotary position embedding (RoPE)
//!
//! Attention compares queries with keys by dot products, which know nothing of
//! order. RoPE encodes position by rotating each (x1[i], x2[i]) pair of q and k
//! by the angle `t · θᵢ`, where t is the token's position. Because rotations
//! compose, `rot(t₁)q · rot(t₂)k` depends only on `t₁ - t₂`: attention sees
//! relative positions, and nothing is added to the token embeddings.
//!
//! With the cache of `cos(t · θᵢ)` and `sin(t · θᵢ)` (each repeated over both
//! halves), the rotation is one line per tensor:
//!
//! ```text
//! q' = q * cos + rotate_half(q) * sin
//! k' = k * cos + rotate_half(k) * sin
//! ```
//!
//! Shapes: `q`, `k` are (B, H, T, D); `cos`, `sin` are (T, D) and must be
//! broadcast over batch and heads. Outputs have the shapes of `q` and `k`.
//!
//! Read first: Su et al. 2021, "RoFormer", section 3.2.
//! Guide: `guide/src/phase1/03-rotary-embedding.md`. Test: `cargo test exercise_03`.

use candle_core::{Result, Tensor};

/// Rotates `q` and `k` (B, H, T, D) by their positions' angles, given the
/// cache's `cos` and `sin` (T, D). Returns `(q', k')`.
///
/// - Uses [`crate::rotate_half`] (exercise 2).
/// - `q * cos` needs `broadcast_mul`: candle does not stretch (T, D) to (B, H, T, D) by itself.
/// - Do not use `candle_nn::rotary_emb::rope`: it has no backward pass, and it
///   takes its cache in a different layout.
pub fn apply_rotary_pos_emb(q: &Tensor, k: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<(Tensor, Tensor)> {
    let _ = (&q, &k, &cos, &sin);
    todo!("Exercise 3: Rotary position embedding; run `cargo xtask hint 3`")
}
