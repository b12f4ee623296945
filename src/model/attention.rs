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
    kv_heads: usize,
    rotary: RotaryCache,
}

impl CausalSelfAttention {
    /// Attention with `num_heads` query heads sharing `kv_heads` key/value heads.
    pub fn new(
        [q_proj, k_proj, v_proj, o_proj]: [Linear; 4],
        (num_heads, kv_heads): (usize, usize),
        rotary: RotaryCache,
    ) -> Self {
        Self { q_proj, k_proj, v_proj, o_proj, num_heads, kv_heads, rotary }
    }

    /// The four projections: q, k, v and o.
    pub fn projections(&self) -> [&Linear; 4] {
        [&self.q_proj, &self.k_proj, &self.v_proj, &self.o_proj]
    }

    /// (B, H_kv, T, D) → (B, H, T, D): query head h reads key/value head
    /// `h / (H / H_kv)`, as grouped-query attention (and Hugging Face's `repeat_kv`) has it.
    fn repeat_kv(&self, x: Tensor) -> Result<Tensor> {
        let groups = self.num_heads / self.kv_heads;
        if groups == 1 {
            return Ok(x);
        }
        let (b, h_kv, t, d) = x.dims4()?;
        x.unsqueeze(2)?.broadcast_as((b, h_kv, groups, t, d))?.reshape((b, self.num_heads, t, d))
    }
}

impl Module for CausalSelfAttention {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let t = x.dim(1)?;
        let q = split_heads(&self.q_proj.forward(x)?, self.num_heads)?; // (B, H, T, D)
        let k = self.repeat_kv(split_heads(&self.k_proj.forward(x)?, self.kv_heads)?)?;
        let v = self.repeat_kv(split_heads(&self.v_proj.forward(x)?, self.kv_heads)?)?;
        let (cos, sin) = self.rotary.get(t, x.dtype())?; // (T, D)
        let (q, k) = apply_rotary_pos_emb(&q, &k, &cos, &sin)?;
        let y = causal_attention(&q, &k, &v)?; // (B, H, T, D)
        self.o_proj.forward(&merge_heads(&y)?) // (B, T, C)
    }
}
