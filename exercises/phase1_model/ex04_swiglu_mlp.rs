//! # Exercise 4: the SwiGLU MLP
//!
//! After attention mixes information between positions, the MLP transforms each
//! position on its own. Modern models use a gated MLP: two parallel projections
//! of the input, one passed through SiLU and used as an elementwise gate on the
//! other, then a projection back to the model width:
//!
//! ```text
//! silu(z)  = z * sigmoid(z)
//! mlp(x)   = down_proj( silu(gate_proj(x)) * up_proj(x) )
//! ```
//!
//! Shapes: `x` (B, T, C) → gate and up (B, T, I) → product (B, T, I) → output (B, T, C).
//! `I` is `intermediate_size`, about 8/3 · C so that the three matrices cost as
//! much as the classic 4·C two-matrix MLP.
//!
//! One position, three intermediate features: gate = (2, 0, −2) and
//! up = (3, 3, 3) give silu(gate) = (1.762, 0, −0.238) and a product
//! (5.285, 0, −0.715), which `down_proj` maps back to C features.
//!
//! Read first: Shazeer 2020, "GLU Variants Improve Transformer".
//! Guide: `guide/src/phase1/04-swiglu-mlp.md`. Test: `cargo test exercise_04`.

use candle_core::{Result, Tensor};

use crate::model::Mlp;

impl Mlp {
    /// `down_proj(silu(gate_proj(x)) * up_proj(x))` for `x` (B, T, C).
    ///
    /// `self.gate_proj`, `self.up_proj` and `self.down_proj` are linear layers
    /// (`crate::model::Linear`, like `candle_nn::Linear`): call `.forward(x)` on
    /// each (bring `candle_core::Module` into scope).
    /// `crate::kernels::silu` is SiLU as one fused pass (`candle_nn::ops::silu` and
    /// `Tensor::silu` compute the same, slower). The gate is the projection that
    /// goes through SiLU; the other is gated.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let _ = &x;
        todo!("Exercise 4: SwiGLU MLP; run `cargo xtask hint 4`")
    }
}
