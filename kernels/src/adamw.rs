//! AdamW's update of one parameter in one pass over memory.
//!
//! Composed from candle's ops the update is about a dozen operations, each a
//! pass over the whole parameter and a freshly allocated result: at GPT-2
//! 124M's size, passes over half a gigabyte each, on one thread, every step.
//! Here the parameter, its gradient and both moments are read once and the
//! three results written once, with the same f32 operations in the same
//! order as the composed version (no fused multiply-adds), so the results are
//! the same.

use candle_core::{bail, DType, Result, Storage, Tensor};
use rayon::prelude::*;

use super::rows::as_f32;

/// Elements per unit of work when the update is spread over the kernel threads.
const CHUNK: usize = 1 << 16;

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
/// tensors on the CPU; candle's composed ops elsewhere.
pub fn adamw_update(
    decayed: &Tensor,
    grad: &Tensor,
    exp_avg: &Tensor,
    exp_avg_sq: &Tensor,
    step: AdamWStep,
) -> Result<(Tensor, Tensor, Tensor)> {
    let inputs = [decayed, grad, exp_avg, exp_avg_sq];
    if inputs.iter().any(|t| !t.device().is_cpu() || t.dtype() != DType::F32 || !t.is_contiguous()) {
        return composed(decayed, grad, exp_avg, exp_avg_sq, step);
    }
    if inputs.iter().any(|t| t.shape() != decayed.shape()) {
        bail!("adamw_update: the parameter, its gradient and its moments must have one shape");
    }
    let guards = inputs.map(|t| t.storage_and_layout());
    let [d, g, m, v] = [0, 1, 2, 3].map(|i| match &*guards[i].0 {
        Storage::Cpu(storage) => as_f32(storage, guards[i].1, "adamw_update"),
        _ => bail!("adamw_update: expected a tensor on the CPU"),
    });
    let (d, g, m, v) = (d?, g?, m?, v?);
    let n = d.len();
    let (mut p_out, mut m_out, mut v_out) = (vec![0f32; n], vec![0f32; n], vec![0f32; n]);
    let run = |i: usize, p_out: &mut [f32], m_out: &mut [f32], v_out: &mut [f32]| {
        let at = i * CHUNK..i * CHUNK + p_out.len();
        update_chunk(step, [&d[at.clone()], &g[at.clone()], &m[at.clone()], &v[at]], p_out, m_out, v_out);
    };
    let chunks = p_out.chunks_mut(CHUNK).zip(m_out.chunks_mut(CHUNK)).zip(v_out.chunks_mut(CHUNK)).enumerate();
    if n < 2 * CHUNK || rayon::current_num_threads() == 1 {
        chunks.for_each(|(i, ((p, m), v))| run(i, p, m, v));
    } else {
        chunks.collect::<Vec<_>>().into_par_iter().for_each(|(i, ((p, m), v))| run(i, p, m, v));
    }
    drop(guards);
    let shape = decayed.shape();
    let device = decayed.device();
    Ok((
        Tensor::from_vec(p_out, shape, device)?,
        Tensor::from_vec(m_out, shape, device)?,
        Tensor::from_vec(v_out, shape, device)?,
    ))
}

/// The update on one chunk. Each line is one of the composed version's ops:
/// candle multiplies a tensor by an f64 scalar (and divides by one) as an
/// f32 multiply by the scalar (or its reciprocal) plus an f32 zero.
#[inline(always)]
fn update_chunk(s: AdamWStep, [d, g, m, v]: [&[f32]; 4], p_out: &mut [f32], m_out: &mut [f32], v_out: &mut [f32]) {
    let (b1, one_minus_b1) = (s.beta1 as f32, (1.0 - s.beta1) as f32);
    let (b2, one_minus_b2) = (s.beta2 as f32, (1.0 - s.beta2) as f32);
    let (inv_c1, inv_c2) = ((1.0 / s.correction1) as f32, (1.0 / s.correction2) as f32);
    let (eps, lr) = (s.eps as f32, s.lr as f32);
    for i in 0..p_out.len() {
        let exp_avg = (m[i] * b1 + 0.0) + (g[i] * one_minus_b1 + 0.0);
        let exp_avg_sq = (v[i] * b2 + 0.0) + ((g[i] * g[i]) * one_minus_b2 + 0.0);
        let denom = (exp_avg_sq * inv_c2 + 0.0).sqrt() * 1.0 + eps;
        let update = (exp_avg * inv_c1 + 0.0) / denom;
        p_out[i] = d[i] - (update * lr + 0.0);
        m_out[i] = exp_avg;
        v_out[i] = exp_avg_sq;
    }
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
