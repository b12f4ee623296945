//! # Exercise 4: the SwiGLU MLP
//!
//! After attention mixes information between positions, the MLP transforms each
//! position on its own. Modern models use a gated MLP (a GLU variant): two
//! parallel projections of the input, one passed through an activation and
//! used as an elementwise gate on the other, then a projection back to the
//! model width. Shazeer's SwiGLU, with biases dropped:
//!
//! ```text
//! silu(z)            = z · sigmoid(z)          (Swish with β = 1)
//! FFN_SwiGLU(x)      = (silu(x·W) ⊙ x·V) · W₂
//! ```
//!
//! The layer's fields are Llama's: `gate_proj`, `up_proj` and `down_proj`.
//! Which of them plays W, which V and which W₂ follows from what each name
//! says and from the shapes; the tests give the two input projections
//! different weights, so a swap does not go unnoticed.
//!
//! Shapes: `x` (B, T, C); the two input projections map C to I, `down_proj`
//! maps I back to C; the output is (B, T, C). `I` is `intermediate_size`,
//! about 8/3 · C so that the three matrices cost as much as the classic 4·C
//! two-matrix MLP.
//!
//! One position, three intermediate features: if the activated branch gives
//! (2, 0, −2) and the other branch (3, 3, 3), the activations are
//! (1.762, 0, −0.238) and the gated product (5.285, 0, −0.715), which the last
//! projection maps back to C features.
//!
//! Read first: Shazeer 2020, "GLU Variants Improve Transformer".
//! Guide: `guide/src/phase1/04-swiglu-mlp.md`. Test: `cargo test exercise_04`.

use candle_core::{Result, Tensor};

use crate::model::Mlp;

impl Mlp {
    /// The SwiGLU MLP of `x` (B, T, C); returns (B, T, C).
    ///
    /// `self.gate_proj`, `self.up_proj` and `self.down_proj` are linear layers
    /// (`crate::model::Linear`, like `candle_nn::Linear`), each with `.forward`
    /// (bring `candle_core::Module` into scope).
    /// `crate::kernels::silu` is SiLU as one fused pass (`candle_nn::ops::silu` and
    /// `Tensor::silu` compute the same, slower).
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let _ = &x;
        todo!("Exercise 4: SwiGLU MLP; run `cargo xtask hint 4`")
    }
}
