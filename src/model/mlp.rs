//! The SwiGLU MLP's layers; its forward pass is exercise 4.

use super::Linear;

/// The gated MLP of a Llama block: three projections, C → I, C → I and I → C.
///
/// The forward pass is exercise 4 (`exercises/phase1_model/ex04_swiglu_mlp.rs`).
#[derive(Debug, Clone)]
pub struct Mlp {
    pub gate_proj: Linear,
    pub up_proj: Linear,
    pub down_proj: Linear,
}

impl Mlp {
    pub fn new(gate_proj: Linear, up_proj: Linear, down_proj: Linear) -> Self {
        Self { gate_proj, up_proj, down_proj }
    }
}

impl candle_core::Module for Mlp {
    fn forward(&self, x: &candle_core::Tensor) -> candle_core::Result<candle_core::Tensor> {
        Mlp::forward(self, x)
    }
}
