//! # Exercise 2: rotate_half
//!
//! Rotary embeddings (exercise 3) turn pairs of channels by a position-dependent
//! angle. Pair i of a vector of length D is (x[i], x[i + D/2]), for
//! i = 0 … D/2 − 1: channel i of the first half with channel i of the second.
//! `rotate_half` turns every pair by 90° counter-clockwise, which maps a point
//! (a, b) of the plane to (−b, a). The turned pair i goes back to channels i
//! and i + D/2: its first coordinate to channel i, its second to i + D/2.
//! For example, with D = 6:
//!
//! ```text
//! [1, 2, 3, 4, 5, 6]: pairs (1, 4), (2, 5), (3, 6) → turned (−4, 1), (−5, 2), (−6, 3)
//! ```
//!
//! Writing the turned pairs back into their channels, and seeing what the
//! output's two halves are as tensors cut from x, is the exercise.
//!
//! The function must be built from whole-tensor operations that autograd can
//! follow, for any D and any number of leading dimensions: no loop over pairs.
//!
//! This is the "halves" layout (Llama, GPT-NeoX). The "interleaved" layout pairs
//! adjacent channels (x0, x1), (x2, x3), … instead; the two are not
//! interchangeable, and the cos/sin cache the model uses is laid out for halves.
//!
//! Shapes: any (…, D) with D even, usually (B, H, T, D); the output has the same shape.
//!
//! Guide: `guide/src/phase1/02-rotate-half.md`. Test: `cargo test exercise_02`.

use candle_core::{Result, Tensor};

/// Turns every pair (x[i], x[i + D/2]) of the last dimension of `x` (…, D) by
/// 90°; returns a tensor of the same shape and dtype.
///
/// Useful: `x.dim(D::Minus1)`, `narrow(dim, start, len)`, `neg`,
/// `Tensor::cat(&[a, b], dim)`, `D::Minus1`.
pub fn rotate_half(x: &Tensor) -> Result<Tensor> {
    let _ = &x;
    todo!("Exercise 2: rotate_half; run `cargo xtask hint 2`")
}
