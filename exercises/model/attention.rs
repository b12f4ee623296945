//! Multi-head causal self-attention: projections and head bookkeeping around
//! exercises 3 (RoPE) and 5 (causal attention).

use candle_core::{Module, Result, Tensor};
use super::{Linear, RotaryCache};
use crate::phase1_model::{apply_rotary_pos_emb, causal_attention};

#[derive(Debug, Clone)]
pub struct CausalSelfAttention {
    q_proj: Linear,
    k_proj: Linear,
    v_proj: Linear,
    o_proj: Linear,
    num_heads: usize,
    rotary: RotaryCache,
}

impl CausalSelfAttention {
    pub fn new(
        [q_proj, k_proj, v_proj, o_proj]: [Linear; 4],
        num_heads: usize,
        rotary: RotaryCache,
    ) -> Self {
        Self { q_proj, k_proj, v_proj, o_proj, num_heads, rotary }
    }

    /// (B, T, C) → (B, H, T, D): one slice of the channels per head.
    fn split_heads(&self, x: &Tensor) -> Result<Tensor> {
        let (b, t, c) = x.dims3()?;
        x.reshape((b, t, self.num_heads, c / self.num_heads))?
            .transpose(1, 2)?
            .contiguous()
    }
}

impl Module for CausalSelfAttention {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let (b, t, c) = x.dims3()?;
        let q = self.split_heads(&self.q_proj.forward(x)?)?; // (B, H, T, D)
        let k = self.split_heads(&self.k_proj.forward(x)?)?;
        let v = self.split_heads(&self.v_proj.forward(x)?)?;
        let (cos, sin) = self.rotary.get(t, x.dtype())?; // (T, D)
        let (q, k) = apply_rotary_pos_emb(&q, &k, &cos, &sin)?;
        let y = causal_attention(&q, &k, &v)?; // (B, H, T, D)
        let y = y.transpose(1, 2)?.reshape((b, t, c))?; // (B, T, C)
        self.o_proj.forward(&y)
    }
}
