//! # Exercise 2: rotate_half
//!
//! Rotary embeddings (exercise 3) turn pairs of channels by a position-dependent
//! angle. Split the last dimension into two halves, `x1 = x[..., :D/2]` and
//! `x2 = x[..., D/2:]`; channel i of `x1` and channel i of `x2` form pair i.
//! Turning every pair by 90° maps (a, b) to (-b, a), which on the whole vector is
//!
//! ```text
//! rotate_half([x1, x2]) = [-x2, x1]          e.g. [1, 2, 3, 4] -> [-3, -4, 1, 2]
//! ```
//!
//! This is the "halves" layout (Llama, GPT-NeoX). The "interleaved" layout pairs
//! adjacent channels (x0, x1), (x2, x3), … instead; the two are not
//! interchangeable, and the cos/sin cache the model uses is laid out for halves.
//!
//! Shapes: any (…, D) with D even, usually (B, H, T, D); the output has the same shape.
//!
//! Guide: `guide/src/phase1/02-rotate-half.md`. Test: `cargo test exercise_02`.

use candle_core::{Result, Tensor};

/// Maps `[x1, x2]` to `[-x2, x1]` along the last dimension of `x` (…, D).
///
/// Useful: `x.dim(D::Minus1)`, `narrow(D::Minus1, start, len)`, `neg`,
/// `Tensor::cat(&[a, b], D::Minus1)`.
pub fn rotate_half(x: &Tensor) -> Result<Tensor> {
    let _ = &x;
    todo!("Exercise 2: rotate_half; run `cargo xtask hint 2`")
}
