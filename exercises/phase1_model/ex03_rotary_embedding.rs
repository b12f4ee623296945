//! # Exercise 3: rotary position embedding (RoPE)
//!
//! Attention compares queries with keys by dot products, which know nothing of
//! order. RoPE encodes position by rotating each pair i of channels of q and k
//! by the angle `t · θᵢ`, where t is the token's position. Because rotations
//! compose, `rot(t₁)q · rot(t₂)k` depends only on `t₁ - t₂`: attention sees
//! relative positions, and nothing is added to the token embeddings.
//!
//! Pair i of a head vector is (x[i], x[i + D/2]), as in exercise 2. At position
//! t, with the angle φ = t · θᵢ, the pair (a, b) becomes
//!
//! ```text
//! a' = a · cos φ − b · sin φ
//! b' = a · sin φ + b · cos φ
//! ```
//!
//! for every pair of q and of k (v is not rotated). The cache gives row t of
//! `cos` as [cos(t·θ₀), …, cos(t·θ_{D/2−1}), cos(t·θ₀), …, cos(t·θ_{D/2−1})]:
//! the D/2 angles written out once for each half, so channels i and i + D/2
//! hold the same angle; `sin` is laid out the same way.
//!
//! Example, D = 4 (θ₀ = 1, θ₁ = 0.01), q = [1, 2, 3, 4] at t = 2: pair (1, 3)
//! turns by 2 rad to (−3.144, −0.339), pair (2, 4) by 0.02 rad to
//! (1.920, 4.039), so q' = [−3.144, 1.920, −0.339, 4.039].
//!
//! Shapes: `q`, `k` are (B, H, T, D); `cos`, `sin` are (T, D) and must be
//! broadcast over batch and heads. Outputs have the shapes and dtypes of `q`
//! and `k`; the tables arrive in the same dtype.
//!
//! Read first: Su et al. 2021, "RoFormer", section 3.2.
//! Guide: `guide/src/phase1/03-rotary-embedding.md`. Test: `cargo test exercise_03`.

use candle_core::{Result, Tensor};

/// Rotates `q` and `k` (B, H, T, D) by their positions' angles, given the
/// cache's `cos` and `sin` (T, D). Returns `(q', k')`.
///
/// - Uses [`crate::rotate_half`] (exercise 2).
/// - candle does not stretch (T, D) to (B, H, T, D) by itself: an elementwise
///   product of the two needs `broadcast_mul`.
/// - Do not use `candle_nn::rotary_emb::rope`: it has no backward pass, and it
///   takes its cache in a different layout.
pub fn apply_rotary_pos_emb(q: &Tensor, k: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<(Tensor, Tensor)> {
    let _ = (&q, &k, &cos, &sin);
    todo!("Exercise 3: Rotary position embedding; run `cargo xtask hint 3`")
}
