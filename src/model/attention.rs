//! Multi-head causal self-attention: projections and head bookkeeping around
//! exercises 3 (RoPE) and 5 (causal attention).

use super::{Linear, RotaryCache};
use crate::kernels::{merge_heads, split_heads};
use crate::phase1_model::{apply_rotary_pos_emb, causal_attention};
use candle_core::{Module, Result, Tensor};

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
    pub fn new([q_proj, k_proj, v_proj, o_proj]: [Linear; 4], num_heads: usize, rotary: RotaryCache) -> Self {
        Self { q_proj, k_proj, v_proj, o_proj, num_heads, rotary }
    }
}

impl Module for CausalSelfAttention {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let t = x.dim(1)?;
        let q = split_heads(&self.q_proj.forward(x)?, self.num_heads)?; // (B, H, T, D)
        let k = split_heads(&self.k_proj.forward(x)?, self.num_heads)?;
        let v = split_heads(&self.v_proj.forward(x)?, self.num_heads)?;
        let (cos, sin) = self.rotary.get(t, x.dtype())?; // (T, D)
        let (q, k) = apply_rotary_pos_emb(&q, &k, &cos, &sin)?;
        let y = causal_attention(&q, &k, &v)?; // (B, H, T, D)
        self.o_proj.forward(&merge_heads(&y)?) // (B, T, C)
    }
}
