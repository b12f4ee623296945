//! Softmax over the last dimension, forward and backward each in one pass;
//! optionally scaled and masked in the same pass, as attention needs.

use candle_core::backend::BackendStorage;
#[cfg(feature = "cuda")]
use candle_core::CudaStorage;
use candle_core::{bail, CpuStorage, CustomOp1, CustomOp2, DType, Layout, Result, Shape, Tensor, D};

use super::exp::exp;
use super::rows::{as_f32, compute_rows, dot, max, sum, RowKernel};
use super::{runs_fused, ROW_DTYPES};

/// `softmax(x)` over the last dimension, with a backward pass: the fused
/// counterpart of `candle_nn::ops::softmax(x, D::Minus1)`, which it equals to
/// rounding. (candle's fused `softmax_last_dim` has no backward pass.) A row
/// that is entirely -inf gives NaN, as in PyTorch.
pub fn softmax(x: &Tensor) -> Result<Tensor> {
    if !runs_fused(x, ROW_DTYPES) {
        return candle_nn::ops::softmax(x, D::Minus1);
    }
    x.contiguous()?.apply_op1(Softmax { scale: 1.0 })
}

/// `softmax(scale · scores)` over the last dimension, where only the positions
/// that `allowed` marks may receive weight: the others get exactly 0.
///
/// `scores` is (..., Tq, Tk) and `allowed` a (Tq, Tk) u8 tensor, 1 where query
/// i may see key j, broadcast over the leading dimensions. It computes what
/// scaling, adding a mask of 0 and -inf and a softmax compute, in one pass
/// over the (..., Tq, Tk) tensor forward and one backward, instead of three
/// and three; the mask gets no gradient. A row with nothing allowed gives NaN,
/// as the composed ops do. Megatron-LM fuses the same three steps of attention
/// for the same reason: they are bound by memory, not arithmetic.
pub fn scaled_masked_softmax(scores: &Tensor, allowed: &Tensor, scale: f64) -> Result<Tensor> {
    let dims = scores.dims();
    let fits = dims.len() >= 2 && allowed.dims() == &dims[dims.len() - 2..];
    if !fits {
        bail!(
            "scaled_masked_softmax: a mask of shape {:?} does not fit scores of shape {dims:?}: it must be (Tq, Tk), the scores' last two dims, and broadcasts over the rest",
            allowed.dims()
        );
    }
    if allowed.dtype() != DType::U8 {
        bail!(
            "scaled_masked_softmax: the mask must be u8, 1 where a key may be seen (e.g. Tensor::tril2(t, DType::U8, device)), not {:?}",
            allowed.dtype()
        );
    }
    if !runs_fused(scores, ROW_DTYPES) {
        let blocked = Tensor::full(f32::NEG_INFINITY, dims, scores.device())?.to_dtype(scores.dtype())?;
        let masked = allowed.broadcast_as(dims)?.where_cond(&(scores * scale)?, &blocked)?;
        return candle_nn::ops::softmax(&masked, D::Minus1);
    }
    scores.contiguous()?.apply_op2(&allowed.contiguous()?, MaskedSoftmax { scale: scale as f32 })
}

fn last_dim(layout: &Layout) -> usize {
    layout.dims().last().copied().unwrap_or(1).max(1)
}

/// Softmax of `scale · x` and, when `mask` is given, with the masked positions
/// set to -inf first.
fn forward(x: &CpuStorage, layout: &Layout, scale: f32, mask: Option<&[u8]>) -> Result<(CpuStorage, Shape)> {
    let values = as_f32(x, layout, "workbook-softmax")?;
    let width = last_dim(layout);
    let y = compute_rows(values.len(), width, &Rows { x: &values, width, scale, mask }, x.dtype())?;
    Ok((y, layout.shape().clone()))
}

fn backward(y: &Tensor, dy: &Tensor, scale: f32) -> Result<Tensor> {
    y.apply_op2_no_bwd(&dy.contiguous()?, &SoftmaxBackward { scale })
}

struct Softmax {
    scale: f32,
}

impl CustomOp1 for Softmax {
    fn name(&self) -> &'static str {
        "workbook-softmax"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        forward(storage, layout, self.scale, None)
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(&self, storage: &CudaStorage, layout: &Layout) -> Result<(CudaStorage, Shape)> {
        super::cuda::softmax(storage, layout, None, self.scale)
    }

    fn bwd(&self, _x: &Tensor, y: &Tensor, dy: &Tensor) -> Result<Option<Tensor>> {
        Ok(Some(backward(y, dy, self.scale)?))
    }
}

struct MaskedSoftmax {
    scale: f32,
}

impl CustomOp2 for MaskedSoftmax {
    fn name(&self) -> &'static str {
        "workbook-scaled-masked-softmax"
    }

    fn cpu_fwd(&self, xs: &CpuStorage, xl: &Layout, ms: &CpuStorage, ml: &Layout) -> Result<(CpuStorage, Shape)> {
        let (CpuStorage::U8(mask), Some((start, end))) = (ms, ml.contiguous_offsets()) else {
            bail!("{}: the mask must be a contiguous u8 tensor", self.name());
        };
        forward(xs, xl, self.scale, Some(&mask[start..end]))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(&self, xs: &CudaStorage, xl: &Layout, ms: &CudaStorage, ml: &Layout) -> Result<(CudaStorage, Shape)> {
        super::cuda::softmax(xs, xl, Some((ms, ml)), self.scale)
    }

    fn bwd(&self, _x: &Tensor, _mask: &Tensor, y: &Tensor, dy: &Tensor) -> Result<(Option<Tensor>, Option<Tensor>)> {
        Ok((Some(backward(y, dy, self.scale)?), None))
    }
}

/// y = exp(v − max v) / Σ exp(v − max v) with v = scale · x, or -inf where the
/// mask is 0, row by row. Row i of the scores is query i mod Tq, which picks
/// the mask's row.
struct Rows<'a> {
    x: &'a [f32],
    width: usize,
    scale: f32,
    mask: Option<&'a [u8]>,
}

impl RowKernel for Rows<'_> {
    #[inline(always)]
    fn row(&self, i: usize, out: &mut [f32]) {
        let row = &self.x[i * self.width..(i + 1) * self.width];
        match self.mask {
            Some(mask) => {
                let queries = mask.len() / self.width;
                let allowed = &mask[(i % queries) * self.width..][..self.width];
                for ((o, &v), &keep) in out.iter_mut().zip(row).zip(allowed) {
                    *o = if keep != 0 { self.scale * v } else { f32::NEG_INFINITY };
                }
            }
            None => out.iter_mut().zip(row).for_each(|(o, &v)| *o = self.scale * v),
        }
        let max = max(out);
        out.iter_mut().for_each(|o| *o = exp(*o - max));
        let inv = 1.0 / sum(out);
        out.iter_mut().for_each(|o| *o *= inv);
    }
}

struct SoftmaxBackward {
    scale: f32,
}

impl CustomOp2 for SoftmaxBackward {
    fn name(&self) -> &'static str {
        "workbook-softmax-backward"
    }

    fn cpu_fwd(&self, ys: &CpuStorage, yl: &Layout, dys: &CpuStorage, dyl: &Layout) -> Result<(CpuStorage, Shape)> {
        let y = as_f32(ys, yl, self.name())?;
        let dy = as_f32(dys, dyl, self.name())?;
        let width = last_dim(yl);
        let rows = BackwardRows { y: &y, dy: &dy, width, scale: self.scale };
        Ok((compute_rows(y.len(), width, &rows, ys.dtype())?, yl.shape().clone()))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(&self, ys: &CudaStorage, yl: &Layout, dys: &CudaStorage, dyl: &Layout) -> Result<(CudaStorage, Shape)> {
        super::cuda::softmax_backward(ys, yl, dys, dyl, self.scale)
    }
}

/// dx = scale · y ⊙ (dy − Σ dy ⊙ y), row by row; masked positions have y = 0
/// and so get no gradient.
struct BackwardRows<'a> {
    y: &'a [f32],
    dy: &'a [f32],
    width: usize,
    scale: f32,
}

impl RowKernel for BackwardRows<'_> {
    #[inline(always)]
    fn row(&self, i: usize, out: &mut [f32]) {
        let range = i * self.width..(i + 1) * self.width;
        let (y, dy) = (&self.y[range.clone()], &self.dy[range]);
        let dot = dot(y, dy);
        for ((o, &y), &dy) in out.iter_mut().zip(y).zip(dy) {
            *o = self.scale * (y * (dy - dot));
        }
    }
}
