//! Softmax over the last dimension, forward and backward each in one pass.

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CustomOp1, CustomOp2, Device, Layout, Result, Shape, Tensor, D};

use super::exp::exp;
use super::rows::{as_f32, dot, for_each_row, from_f32, max, sum, RowKernel};

/// `softmax(x)` over the last dimension, with a backward pass: the fused
/// counterpart of `candle_nn::ops::softmax(x, D::Minus1)`, which it equals to
/// rounding. (candle's fused `softmax_last_dim` has no backward pass.) A row
/// that is entirely -inf gives NaN, as in PyTorch.
pub fn softmax(x: &Tensor) -> Result<Tensor> {
    if !matches!(x.device(), Device::Cpu) {
        return candle_nn::ops::softmax(x, D::Minus1);
    }
    x.contiguous()?.apply_op1(Softmax)
}

fn last_dim(layout: &Layout) -> usize {
    layout.dims().last().copied().unwrap_or(1).max(1)
}

struct Softmax;

impl CustomOp1 for Softmax {
    fn name(&self) -> &'static str {
        "workbook-softmax"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let x = as_f32(storage, layout, self.name())?;
        let width = last_dim(layout);
        let mut y = vec![0f32; x.len()];
        for_each_row(&mut y, width, &Rows { x: &x, width });
        Ok((from_f32(y, storage.dtype())?, layout.shape().clone()))
    }

    fn bwd(&self, _x: &Tensor, y: &Tensor, dy: &Tensor) -> Result<Option<Tensor>> {
        Ok(Some(y.apply_op2_no_bwd(&dy.contiguous()?, &SoftmaxBackward)?))
    }
}

/// y = exp(x − max) / Σ exp(x − max), row by row.
struct Rows<'a> {
    x: &'a [f32],
    width: usize,
}

impl RowKernel for Rows<'_> {
    #[inline(always)]
    fn row(&self, i: usize, out: &mut [f32]) {
        let row = &self.x[i * self.width..(i + 1) * self.width];
        let max = max(row);
        for (o, &v) in out.iter_mut().zip(row) {
            *o = exp(v - max);
        }
        let inv = 1.0 / sum(out);
        out.iter_mut().for_each(|o| *o *= inv);
    }
}

struct SoftmaxBackward;

impl CustomOp2 for SoftmaxBackward {
    fn name(&self) -> &'static str {
        "workbook-softmax-backward"
    }

    fn cpu_fwd(&self, ys: &CpuStorage, yl: &Layout, dys: &CpuStorage, dyl: &Layout) -> Result<(CpuStorage, Shape)> {
        let y = as_f32(ys, yl, self.name())?;
        let dy = as_f32(dys, dyl, self.name())?;
        let width = last_dim(yl);
        let mut dx = vec![0f32; y.len()];
        for_each_row(&mut dx, width, &BackwardRows { y: &y, dy: &dy, width });
        Ok((from_f32(dx, ys.dtype())?, yl.shape().clone()))
    }
}

/// dx = y ⊙ (dy − Σ dy ⊙ y), row by row.
struct BackwardRows<'a> {
    y: &'a [f32],
    dy: &'a [f32],
    width: usize,
}

impl RowKernel for BackwardRows<'_> {
    #[inline(always)]
    fn row(&self, i: usize, out: &mut [f32]) {
        let range = i * self.width..(i + 1) * self.width;
        let (y, dy) = (&self.y[range.clone()], &self.dy[range]);
        let dot = dot(y, dy);
        for ((o, &y), &dy) in out.iter_mut().zip(y).zip(dy) {
            *o = y * (dy - dot);
        }
    }
}
