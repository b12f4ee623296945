//! A vector repeated over rows, with a backward pass that sums the rows in
//! one vectorised pass.

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CustomOp1, Device, Layout, Result, Shape, Tensor};

use super::rows::{as_f32, from_f32, rearrange, Rearrange};

/// `v` (C) repeated into (rows, C), with a backward pass.
///
/// `x.broadcast_mul(&v)` for x (N, C) gives the same values, but candle's
/// backward of a broadcast sums the (N, C) gradient over its leading dimension
/// element by element, about sixty times slower than a sum over the last.
/// Here the rows are summed as whole vectors. The RMSNorm weight's gradient
/// is such a sum, once per norm and step.
pub fn broadcast_rows(v: &Tensor, rows: usize) -> Result<Tensor> {
    let width = v.dims1()?;
    if !matches!(v.device(), Device::Cpu) {
        return v.unsqueeze(0)?.broadcast_as((rows, width))?.contiguous();
    }
    v.contiguous()?.apply_op1(BroadcastRows { rows })
}

struct BroadcastRows {
    rows: usize,
}

impl Rearrange for BroadcastRows {
    fn apply<T: Copy>(&self, src: &[T]) -> Vec<T> {
        src.repeat(self.rows)
    }
}

impl CustomOp1 for BroadcastRows {
    fn name(&self) -> &'static str {
        "workbook-broadcast-rows"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let width = layout.shape().elem_count();
        Ok((rearrange(storage, layout, self, self.name())?, Shape::from((self.rows, width))))
    }

    fn bwd(&self, _v: &Tensor, _y: &Tensor, dy: &Tensor) -> Result<Option<Tensor>> {
        Ok(Some(dy.contiguous()?.apply_op1_no_bwd(&SumRows)?))
    }
}

/// (rows, C) → (C): the sum of the rows, accumulated in f32.
struct SumRows;

impl CustomOp1 for SumRows {
    fn name(&self) -> &'static str {
        "workbook-sum-rows"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let (_, width) = layout.shape().dims2()?;
        let values = as_f32(storage, layout, self.name())?;
        let mut total = vec![0f32; width];
        for row in values.chunks_exact(width.max(1)) {
            total.iter_mut().zip(row).for_each(|(t, &v)| *t += v);
        }
        Ok((from_f32(total, storage.dtype())?, Shape::from(width)))
    }
}
