//! RMSNorm's parameters; its forward pass is exercise 1.

use candle_core::{Result, Tensor};

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
}

impl candle_core::Module for RmsNorm {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        RmsNorm::forward(self, x)
    }
}
