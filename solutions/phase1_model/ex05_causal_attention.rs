//! Reference solution of exercise 5: causal scaled dot-product attention.

use candle_core::{DType, Result, Tensor};

use crate::kernels;

pub fn causal_attention(q: &Tensor, k: &Tensor, v: &Tensor) -> Result<Tensor> {
    let (_, _, t, d) = q.dims4()?;
    let scores = (q.matmul(&k.t()?)? / (d as f64).sqrt())?; // (B, H, T, T)
    let allowed = Tensor::tril2(t, DType::U8, q.device())?; // 1 where key j <= query i
    let blocked = Tensor::full(f32::NEG_INFINITY, (t, t), q.device())?.to_dtype(q.dtype())?;
    let zeros = Tensor::zeros((t, t), q.dtype(), q.device())?;
    let mask = allowed.where_cond(&zeros, &blocked)?; // (T, T): 0 or -inf
    let weights = kernels::softmax(&scores.broadcast_add(&mask)?)?;
    weights.matmul(&v.contiguous()?) // (B, H, T, D)
}
