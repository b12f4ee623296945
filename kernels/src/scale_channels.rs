//! Scaling every channel of (..., C) activations by a (C) vector, with a
//! backward pass that sums the weight's gradient over the rows in one
//! vectorised pass.

use candle_core::backend::BackendStorage;
use candle_core::{bail, CpuStorage, CustomOp1, Device, Layout, Result, Shape, Tensor, D};

use super::on_gpu_path;
use super::rows::{as_f32, from_f32, rearrange, Rearrange};
#[cfg(feature = "cuda")]
use candle_core::cuda_backend::CudaStorage;

/// `x * weight` for `x` (..., C) and `weight` (C): what `x.broadcast_mul(&weight)`
/// computes, value for value, with a faster backward.
///
/// candle's backward of a broadcast sums the (N, C) gradient over its leading
/// dimension element by element, about sixty times slower than a sum over the
/// last. Here the weight is repeated over the rows by an op whose backward
/// adds whole rows. The RMSNorm weight's gradient is such a sum, once per
/// norm and step.
pub fn scale_channels(x: &Tensor, weight: &Tensor) -> Result<Tensor> {
    let width = x.dim(D::Minus1)?;
    if weight.dims() != [width] {
        bail!("scale_channels: the weight is {:?}; for x {:?} it must be ({width})", weight.dims(), x.dims());
    }
    let rows = x.elem_count() / width.max(1);
    x.reshape((rows, width))?.mul(&broadcast_rows(weight, rows)?)?.reshape(x.dims())
}

/// `v` (C) repeated into (rows, C), with a backward pass that sums the rows.
fn broadcast_rows(v: &Tensor, rows: usize) -> Result<Tensor> {
    let width = v.dims1()?;
    if !matches!(v.device(), Device::Cpu) && !on_gpu_path(v) {
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

    /// One strided copy that reads the vector `rows` times.
    #[cfg(feature = "cuda")]
    fn cuda_fwd(&self, storage: &CudaStorage, layout: &Layout) -> Result<(CudaStorage, Shape)> {
        let (start, _) = super::cuda::contiguous_range(layout, self.name())?;
        let shape = Shape::from((self.rows, layout.shape().elem_count()));
        let source = Layout::contiguous_with_offset(layout.shape().elem_count(), start).broadcast_as(shape.clone())?;
        super::cuda::copy_strided(storage, &source, shape)
    }

    fn bwd(&self, _v: &Tensor, _y: &Tensor, dy: &Tensor) -> Result<Option<Tensor>> {
        let dy = dy.contiguous()?;
        if dy.device().is_cuda() {
            // The sum of the rows as the product (1 × rows) · dy: one cuBLAS call.
            let ones = Tensor::ones((1, self.rows), dy.dtype(), dy.device())?;
            return Ok(Some(ones.matmul(&dy)?.squeeze(0)?));
        }
        Ok(Some(dy.apply_op1_no_bwd(&SumRows)?))
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
