//! AdamW's update of one parameter in one pass over memory.
//!
//! Composed from candle's ops the update is about a dozen operations, each a
//! pass over the whole parameter and a freshly allocated result: at GPT-2
//! 124M's size, passes over half a gigabyte each, on one thread, every step.
//! Here the parameter, its gradient and both moments are read once and the
//! three results written once, with the same f32 operations in the same
//! order as the composed version (no fused multiply-adds), so the results are
//! the same.

use std::ops::Range;

use candle_core::{bail, Result, Tensor};

use super::elementwise::{in_one_pass, map_chunks, with_f32s};

/// The constants of one AdamW step.
#[derive(Debug, Clone, Copy)]
pub struct AdamWStep {
    pub lr: f64,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    /// `1 − β₁ᵗ` and `1 − β₂ᵗ`, the bias corrections at step t.
    pub correction1: f64,
    pub correction2: f64,
}

/// AdamW's update of a parameter already decayed (`p · (1 − lr · wd)`):
///
/// ```text
/// m ← β₁ m + (1 − β₁) g
/// v ← β₂ v + (1 − β₂) g²
/// p ← decayed − lr · (m / c₁) / (√(v / c₂) + ε)
/// ```
///
/// Returns the new parameter, `m` and `v`. One pass for contiguous f32
/// tensors on the CPU or an NVIDIA GPU; candle's composed ops elsewhere.
pub fn adamw_update(
    decayed: &Tensor,
    grad: &Tensor,
    exp_avg: &Tensor,
    exp_avg_sq: &Tensor,
    step: AdamWStep,
) -> Result<(Tensor, Tensor, Tensor)> {
    let inputs = [decayed, grad, exp_avg, exp_avg_sq];
    #[cfg(feature = "cuda")]
    if inputs.iter().all(|t| {
        super::on_gpu_path(t)
            && t.dtype() == candle_core::DType::F32
            && t.is_contiguous()
            && t.shape() == decayed.shape()
    }) {
        let [p, m, v] = super::cuda::adamw_update(inputs, &step)?;
        return Ok((p, m, v));
    }
    if !in_one_pass(&inputs) {
        if inputs.iter().any(|t| t.shape() != decayed.shape()) {
            bail!("adamw_update: the parameter, its gradient and its moments must have one shape");
        }
        return composed(decayed, grad, exp_avg, exp_avg_sq, step);
    }
    let [p, m, v] = with_f32s(inputs, "adamw_update", |[d, g, m, v]| {
        map_chunks(d.len(), |r: Range<usize>| {
            let (d, g, m, v) = (&d[r.clone()], &g[r.clone()], &m[r.clone()], &v[r]);
            d.iter().zip(g).zip(m).zip(v).map(move |(((&d, &g), &m), &v)| update_one(step, d, g, m, v))
        })
    })?;
    let (shape, device) = (decayed.shape(), decayed.device());
    Ok((Tensor::from_vec(p, shape, device)?, Tensor::from_vec(m, shape, device)?, Tensor::from_vec(v, shape, device)?))
}

/// The update of one element: the new parameter, `m` and `v`. Each line is
/// one of the composed version's ops: candle multiplies a tensor by an f64
/// scalar (and divides by one) as an f32 multiply by the scalar (or its
/// reciprocal) plus an f32 zero.
#[inline(always)]
fn update_one(s: AdamWStep, d: f32, g: f32, m: f32, v: f32) -> [f32; 3] {
    let (b1, one_minus_b1) = (s.beta1 as f32, (1.0 - s.beta1) as f32);
    let (b2, one_minus_b2) = (s.beta2 as f32, (1.0 - s.beta2) as f32);
    let (inv_c1, inv_c2) = ((1.0 / s.correction1) as f32, (1.0 / s.correction2) as f32);
    let (eps, lr) = (s.eps as f32, s.lr as f32);
    let exp_avg = (m * b1 + 0.0) + (g * one_minus_b1 + 0.0);
    let exp_avg_sq = (v * b2 + 0.0) + ((g * g) * one_minus_b2 + 0.0);
    let denom = (exp_avg_sq * inv_c2 + 0.0).sqrt() * 1.0 + eps;
    let update = (exp_avg * inv_c1 + 0.0) / denom;
    [d - (update * lr + 0.0), exp_avg, exp_avg_sq]
}

/// The same update from candle's ops, for other devices and dtypes.
fn composed(
    decayed: &Tensor,
    grad: &Tensor,
    exp_avg: &Tensor,
    exp_avg_sq: &Tensor,
    s: AdamWStep,
) -> Result<(Tensor, Tensor, Tensor)> {
    let exp_avg = ((exp_avg * s.beta1)? + (grad * (1.0 - s.beta1))?)?;
    let exp_avg_sq = ((exp_avg_sq * s.beta2)? + (grad.sqr()? * (1.0 - s.beta2))?)?;
    let denom = ((&exp_avg_sq / s.correction2)?.sqrt()? + s.eps)?;
    let update = ((&exp_avg / s.correction1)? / denom)?;
    let new_p = (decayed - (update * s.lr)?)?;
    Ok((new_p, exp_avg, exp_avg_sq))
}
