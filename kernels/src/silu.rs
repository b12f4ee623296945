//! SiLU, `x · sigmoid(x)`, forward and backward each in one pass.

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CustomOp1, CustomOp2, DType, Layout, Result, Shape, Tensor};

use super::exp::exp;
use super::rows::{as_f32, compute_rows, RowKernel};
use super::runs_fused;
#[cfg(feature = "cuda")]
use candle_core::cuda_backend::CudaStorage;

/// Elements per unit of work: SiLU has no rows, any split will do.
const CHUNK: usize = 1 << 14;

/// `x · sigmoid(x)` elementwise, with a backward pass: the fused counterpart
/// of `candle_nn::ops::silu`.
pub fn silu(x: &Tensor) -> Result<Tensor> {
    if !runs_fused(x, &[DType::F32]) {
        return candle_nn::ops::silu(x);
    }
    x.contiguous()?.apply_op1(Silu)
}

#[inline(always)]
fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + exp(-x))
}

struct Silu;

impl CustomOp1 for Silu {
    fn name(&self) -> &'static str {
        "workbook-silu"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let x = as_f32(storage, layout, self.name())?;
        let y = compute_rows(x.len(), CHUNK, &Chunks { x: &x }, storage.dtype())?;
        Ok((y, layout.shape().clone()))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(&self, storage: &CudaStorage, layout: &Layout) -> Result<(CudaStorage, Shape)> {
        super::cuda::silu(storage, layout)
    }

    fn bwd(&self, x: &Tensor, _y: &Tensor, dy: &Tensor) -> Result<Option<Tensor>> {
        Ok(Some(x.apply_op2_no_bwd(&dy.contiguous()?, &SiluBackward)?))
    }
}

struct Chunks<'a> {
    x: &'a [f32],
}

impl RowKernel for Chunks<'_> {
    #[inline(always)]
    fn row(&self, i: usize, out: &mut [f32]) {
        for (o, &x) in out.iter_mut().zip(&self.x[i * CHUNK..]) {
            *o = x * sigmoid(x);
        }
    }
}

struct SiluBackward;

impl CustomOp2 for SiluBackward {
    fn name(&self) -> &'static str {
        "workbook-silu-backward"
    }

    fn cpu_fwd(&self, xs: &CpuStorage, xl: &Layout, dys: &CpuStorage, dyl: &Layout) -> Result<(CpuStorage, Shape)> {
        let x = as_f32(xs, xl, self.name())?;
        let dy = as_f32(dys, dyl, self.name())?;
        let dx = compute_rows(x.len(), CHUNK, &BackwardChunks { x: &x, dy: &dy }, xs.dtype())?;
        Ok((dx, xl.shape().clone()))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(&self, xs: &CudaStorage, xl: &Layout, dys: &CudaStorage, dyl: &Layout) -> Result<(CudaStorage, Shape)> {
        super::cuda::silu_backward(xs, xl, dys, dyl)
    }
}

/// dx = dy · s · (1 + x · (1 − s)), with s = sigmoid(x).
struct BackwardChunks<'a> {
    x: &'a [f32],
    dy: &'a [f32],
}

impl RowKernel for BackwardChunks<'_> {
    #[inline(always)]
    fn row(&self, i: usize, out: &mut [f32]) {
        for ((o, &x), &dy) in out.iter_mut().zip(&self.x[i * CHUNK..]).zip(&self.dy[i * CHUNK..]) {
            let s = sigmoid(x);
            *o = dy * s * (1.0 + x * (1.0 - s));
        }
    }
}
