//! Reference solution of exercise 5: causal scaled dot-product attention.

use candle_core::{DType, Result, Tensor};

use crate::kernels;

pub fn causal_attention(q: &Tensor, k: &Tensor, v: &Tensor) -> Result<Tensor> {
    let (_, _, t, d) = q.dims4()?;
    // (B, H, T, T): q · kᵀ, and (T, T): key j visible to query i iff j <= i.
    let scores = q.matmul(&k.t()?)?;
    let visible = Tensor::tril2(t, DType::U8, q.device())?;
    // softmax over the keys of scores / sqrt(D), the future at -inf: the composed
    // scale, mask and softmax in one pass (7-15% more tokens/s on the tiny config).
    let weights = kernels::scaled_masked_softmax(&scores, &visible, 1.0 / (d as f64).sqrt())?;
    weights.matmul(&v.contiguous()?) // (B, H, T, D)
}
