//! RMSNorm's parameters; its forward pass is exercise 1.

use candle_core::{Result, Tensor, D};

use crate::kernels::broadcast_rows;

/// Root-mean-square normalisation with a learned scale.
///
/// `weight` is (C); `eps` keeps the square root away from zero.
/// The forward pass is exercise 1 (`exercises/phase1_model/ex01_rms_norm.rs`).
#[derive(Debug, Clone)]
pub struct RmsNorm {
    pub weight: Tensor,
    pub eps: f64,
}

impl RmsNorm {
    pub fn new(weight: Tensor, eps: f64) -> Self {
        Self { weight, eps }
    }

    /// Exercise 1's forward pass on `x` (..., C) viewed as rows (N, C), with
    /// the weight repeated over the rows: the same values, a cheaper backward.
    /// The weight's gradient is a sum over the rows; candle computes the sum a
    /// broadcast needs element by element (about 1 ms per norm on the tiny
    /// config), `kernels::broadcast_rows` adds whole rows (a few hundredths of
    /// a millisecond).
    pub fn forward_rows(&self, x: &Tensor) -> Result<Tensor> {
        let width = x.dim(D::Minus1)?;
        let rows = x.elem_count() / width.max(1);
        let per_row = RmsNorm::new(broadcast_rows(&self.weight, rows)?, self.eps);
        RmsNorm::forward(&per_row, &x.reshape((rows, width))?)?.reshape(x.dims())
    }
}

impl candle_core::Module for RmsNorm {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.forward_rows(x)
    }
}
