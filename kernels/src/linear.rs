//! `x · wᵀ` as one node of the autograd graph.

use candle_core::{bail, CpuStorage, CustomOp2, DType, Device, Layout, Result, Shape, Tensor};
use gemm::Parallelism;

use super::rows::as_f32;

/// `x · wᵀ` for `x` (..., C) and `w` (O, C): (..., O), with a backward pass.
///
/// candle's `Linear` broadcasts `w` over the batch, transposes it and runs a
/// batched product: three nodes in the graph, each adding a pass over its
/// gradient in backward, and a weight gradient summed over the batch. Here the
/// leading dimensions fold into the rows of one matrix product, one node,
/// whose backward is two products: dx = dy · w and dw = dyᵀ · x. f32 on the
/// CPU; other dtypes and devices take candle's composed path.
pub fn linear(x: &Tensor, w: &Tensor) -> Result<Tensor> {
    let (out_features, in_features) = w.dims2()?;
    let dims = x.dims();
    if dims.last() != Some(&in_features) {
        bail!("linear: input of shape {dims:?} does not end in the weight's {in_features} input features");
    }
    let mut out_dims = dims.to_vec();
    *out_dims.last_mut().expect("checked above") = out_features;
    if matches!(x.device(), Device::Cpu) && x.dtype() == DType::F32 && w.dtype() == DType::F32 {
        return x.contiguous()?.apply_op2(&w.contiguous()?, Linear);
    }
    let rows = x.elem_count() / in_features;
    x.reshape((rows, in_features))?.matmul(&w.t()?)?.reshape(out_dims)
}

struct Linear;

impl CustomOp2 for Linear {
    fn name(&self) -> &'static str {
        "workbook-linear"
    }

    fn cpu_fwd(&self, xs: &CpuStorage, xl: &Layout, ws: &CpuStorage, wl: &Layout) -> Result<(CpuStorage, Shape)> {
        let x = as_f32(xs, xl, self.name())?;
        let w = as_f32(ws, wl, self.name())?;
        let (n, k) = wl.shape().dims2()?;
        let m = x.len() / k;
        // Not zero-filled: with read_dst false, gemm writes every element of y
        // without reading it.
        let mut y = Vec::<f32>::with_capacity(m * n);
        let threads = rayon::current_num_threads();
        let parallelism = if threads > 1 { Parallelism::Rayon(threads) } else { Parallelism::None };
        // SAFETY: the pointers cover m×k, n×k and m×n f32s with the strides given;
        // y's capacity is m×n, and gemm has initialised all of it when set_len runs.
        unsafe {
            gemm::gemm(
                m, n, k,
                y.spare_capacity_mut().as_mut_ptr().cast::<f32>(), 1, n as isize, false, // y: m×n, row-major
                x.as_ptr(), 1, k as isize,             // x: m×k, row-major
                w.as_ptr(), k as isize, 1,             // wᵀ: k×n, the transpose of row-major w
                0.0, 1.0, false, false, false, parallelism,
            );
            y.set_len(m * n);
        }
        let mut dims = xl.dims().to_vec();
        *dims.last_mut().expect("x has at least one dimension") = n;
        Ok((CpuStorage::F32(y), Shape::from(dims)))
    }

    fn bwd(&self, x: &Tensor, w: &Tensor, _y: &Tensor, dy: &Tensor) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let (n, k) = w.dims2()?;
        let m = x.elem_count() / k;
        let dy = dy.reshape((m, n))?;
        let x2 = x.detach().reshape((m, k))?;
        let dx = dy.matmul(&w.detach())?.reshape(x.dims())?;
        let dw = dy.t()?.matmul(&x2)?;
        Ok((Some(dx), Some(dw)))
    }
}
