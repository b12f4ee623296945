//! Mean cross-entropy of logits against class indices, forward and backward
//! each in one pass over the logits.

use std::borrow::Cow;

use candle_core::backend::BackendStorage;
#[cfg(feature = "cuda")]
use candle_core::CudaStorage;
use candle_core::{bail, CpuStorage, CustomOp2, CustomOp3, DType, Layout, Result, Shape, Tensor};

use super::exp::exp;
use super::rows::{as_f32, compute_rows, for_each_row, from_f32, max, sum, RowKernel};
use super::{runs_fused, ROW_DTYPES};

/// The mean over rows of `−log softmax(logits)[target]`, for `logits` (N, V)
/// and `targets` (N) class indices: the fused counterpart of
/// `candle_nn::loss::cross_entropy`. The loss has the logits' dtype; compute
/// it on f32 logits.
pub fn cross_entropy(logits: &Tensor, targets: &Tensor) -> Result<Tensor> {
    let (n, _) = logits.dims2()?;
    if targets.dims() != [n] {
        bail!("cross_entropy: targets have shape {:?}, expected ({n}) for logits {:?}", targets.dims(), logits.dims());
    }
    // The GPU kernels take u32 class indices.
    if !runs_fused(logits, ROW_DTYPES) || (!logits.device().is_cpu() && targets.dtype() != DType::U32) {
        return candle_nn::loss::cross_entropy(logits, targets);
    }
    logits.contiguous()?.apply_op2(&targets.contiguous()?, CrossEntropy)
}

/// The targets as indices, each checked against the number of classes.
fn indices<'a>(storage: &'a CpuStorage, layout: &Layout, classes: usize) -> Result<Cow<'a, [u32]>> {
    let Some((start, end)) = layout.contiguous_offsets() else {
        bail!("cross_entropy: the targets must be contiguous");
    };
    let targets: Cow<[u32]> = match storage {
        CpuStorage::U32(v) => Cow::Borrowed(&v[start..end]),
        CpuStorage::U8(v) => Cow::Owned(v[start..end].iter().map(|&t| t as u32).collect()),
        CpuStorage::I64(v) => Cow::Owned(v[start..end].iter().map(|&t| t.clamp(-1, u32::MAX as i64) as u32).collect()),
        other => bail!("cross_entropy: targets must be integer class indices, got {:?}", other.dtype()),
    };
    if let Some(bad) = targets.iter().find(|&&t| t as usize >= classes) {
        bail!("cross_entropy: target {bad} is not a class index below {classes}");
    }
    Ok(targets)
}

/// log Σ exp(x) of one row, computed as max + log Σ exp(x − max); `scratch` is row-sized.
#[inline(always)]
fn log_sum_exp(row: &[f32], scratch: &mut [f32]) -> f32 {
    let max = max(row);
    for (e, &v) in scratch.iter_mut().zip(row) {
        *e = exp(v - max);
    }
    max + sum(scratch).ln()
}

struct CrossEntropy;

impl CustomOp2 for CrossEntropy {
    fn name(&self) -> &'static str {
        "workbook-cross-entropy"
    }

    fn cpu_fwd(&self, ls: &CpuStorage, ll: &Layout, ts: &CpuStorage, tl: &Layout) -> Result<(CpuStorage, Shape)> {
        let logits = as_f32(ls, ll, self.name())?;
        let (n, classes) = ll.shape().dims2()?;
        let targets = indices(ts, tl, classes)?;
        // Each row's exponentials go to its slot in `scratch`, then its loss to the slot's first element.
        let mut scratch = vec![0f32; logits.len()];
        for_each_row(&mut scratch, classes, &Losses { logits: &logits, targets: &targets, classes });
        let total: f64 = scratch.iter().step_by(classes).map(|&loss| loss as f64).sum();
        Ok((from_f32(vec![(total / n as f64) as f32], ls.dtype())?, Shape::from(())))
    }

    /// Refuses a target that is no class index, as the CPU does, rather than
    /// a NaN loss a step would skip in silence. The targets are read back
    /// for it: a few bytes per row, and a wait for the work queued before.
    #[cfg(feature = "cuda")]
    fn cuda_fwd(&self, ls: &CudaStorage, ll: &Layout, ts: &CudaStorage, tl: &Layout) -> Result<(CudaStorage, Shape)> {
        let (_, classes) = ll.shape().dims2()?;
        indices(&ts.to_cpu_storage()?, tl, classes)?;
        super::cuda::cross_entropy(ls, ll, ts, tl)
    }

    /// d logits = (softmax(logits) − onehot(target)) · dloss / N; the targets
    /// get none. dloss stays where it is: on a GPU, reading it here would
    /// make the host wait for the whole forward pass.
    fn bwd(
        &self,
        logits: &Tensor,
        targets: &Tensor,
        _loss: &Tensor,
        dloss: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        Ok((Some(logits.apply_op3_no_bwd(targets, &dloss.contiguous()?, &CrossEntropyBackward)?), None))
    }
}

/// Row i's loss, log Σ exp(logits) − logits[target], left in `out[0]`.
struct Losses<'a> {
    logits: &'a [f32],
    targets: &'a [u32],
    classes: usize,
}

impl RowKernel for Losses<'_> {
    #[inline(always)]
    fn row(&self, i: usize, out: &mut [f32]) {
        let row = &self.logits[i * self.classes..(i + 1) * self.classes];
        out[0] = log_sum_exp(row, out) - row[self.targets[i] as usize];
    }
}

/// Takes (logits, targets, dloss).
struct CrossEntropyBackward;

impl CustomOp3 for CrossEntropyBackward {
    fn name(&self) -> &'static str {
        "workbook-cross-entropy-backward"
    }

    fn cpu_fwd(
        &self,
        ls: &CpuStorage,
        ll: &Layout,
        ts: &CpuStorage,
        tl: &Layout,
        gs: &CpuStorage,
        gl: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let logits = as_f32(ls, ll, self.name())?;
        let (n, classes) = ll.shape().dims2()?;
        let targets = indices(ts, tl, classes)?;
        let scale = as_f32(gs, gl, self.name())?[0] / n as f32;
        let rows = Gradients { logits: &logits, targets: &targets, classes, scale };
        Ok((compute_rows(logits.len(), classes, &rows, ls.dtype())?, ll.shape().clone()))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        ls: &CudaStorage,
        ll: &Layout,
        ts: &CudaStorage,
        tl: &Layout,
        gs: &CudaStorage,
        gl: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        super::cuda::cross_entropy_backward(ls, ll, ts, tl, (gs, gl))
    }
}

/// Row i of (softmax(logits) − onehot(target)) · scale.
struct Gradients<'a> {
    logits: &'a [f32],
    targets: &'a [u32],
    classes: usize,
    scale: f32,
}

impl RowKernel for Gradients<'_> {
    #[inline(always)]
    fn row(&self, i: usize, out: &mut [f32]) {
        let row = &self.logits[i * self.classes..(i + 1) * self.classes];
        let shift = log_sum_exp(row, out);
        for (o, &x) in out.iter_mut().zip(row) {
            *o = exp(x - shift) * self.scale;
        }
        out[self.targets[i] as usize] -= self.scale;
    }
}
