//! Reference solution of exercise 4: the SwiGLU MLP.

use candle_core::{Module, Result, Tensor};

use crate::kernels;
use crate::model::Mlp;

impl Mlp {
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let gate = kernels::silu(&self.gate_proj.forward(x)?)?; // (B, T, I)
        let up = self.up_proj.forward(x)?; // (B, T, I)
        self.down_proj.forward(&(gate * up)?) // (B, T, C)
    }
}
