//! # Exercise 1: RMSNorm
//!
//! Deep networks stay trainable when every layer sees inputs of a predictable
//! scale. RMSNorm rescales each C-dimensional vector so that its root mean
//! square is one, then multiplies by a learned per-channel `weight`:
//!
//! ```text
//! rms(x) = sqrt(mean(x², over the last dim) + eps)
//! y      = x / rms(x) * weight            = x * rsqrt(mean(x²) + eps) * weight
//! ```
//!
//! Unlike LayerNorm it does not subtract the mean: it is cheaper and works as well.
//!
//! Example, with eps small enough to ignore: x = (0, 3, 0, 4) has
//! mean(x²) = 25 / 4 = 6.25 and rms = 2.5, so x / rms = (0, 1.2, 0, 1.6); with
//! weight = (1, 1, 1, 0.5) the output is (0, 1.2, 0, 0.8).
//!
//! Shapes: `x` is (..., C) — usually (B, T, C) — and `weight` is always (C).
//! Every vector along the last dimension is normalised on its own. The output
//! has the shape and dtype of `x`.
//!
//! Read first: Zhang & Sennrich 2019, "Root Mean Square Layer Normalization".
//! Guide: `guide/src/phase1/01-rms-norm.md`. Test: `cargo test exercise_01`.

use candle_core::{Result, Tensor};

use crate::model::RmsNorm;

impl RmsNorm {
    /// Normalises `x` (…, C) by its root mean square over the last dimension
    /// and scales it by `self.weight` (C); `self.eps` goes *inside* the square root.
    /// The output has the shape and the dtype of `x`.
    ///
    /// - `x` may be bf16 with C = 4096, and the result must then agree with an
    ///   f32 computation to bf16 rounding. In candle a reduction accumulates in
    ///   the tensor's own dtype, and a bf16 sum stalls: 2^20 ones sum to 256.
    /// - candle never broadcasts implicitly: `a / b` and `a * b` need equal
    ///   shapes, and it refuses to combine two dtypes in one operation.
    /// - The weight is stored in the model's dtype, which may be bf16.
    /// - Do not call `candle_nn::ops::rms_norm`: it has no backward pass, so the
    ///   gradients of everything before it would silently be zero.
    /// - Once your version passes: candle sums the weight's gradient over the
    ///   rows slowly; `crate::kernels::scale_channels(x, weight)` gives what
    ///   `broadcast_mul` gives with a fast backward (the trainer is quicker).
    ///
    /// Useful: `to_dtype`, `sqr`, `mean`, `mean_keepdim`, `D::Minus1`, `+ f64`,
    /// `sqrt`, `recip`, `broadcast_div`, `broadcast_mul`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let _ = &x;
        todo!("Exercise 1: RMSNorm; run `cargo xtask hint 1`")
    }
}
