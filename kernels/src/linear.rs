//! `x · wᵀ` as one node of the autograd graph.

use candle_core::{bail, CpuStorage, CustomOp2, DType, Device, Layout, Result, Shape, Tensor};
use gemm::Parallelism;
use rayon::prelude::*;

#[cfg(feature = "cuda")]
use super::cuda::{self, Matrix};
use super::on_gpu_path;
use super::rows::as_f32;
#[cfg(feature = "cuda")]
use candle_core::cuda_backend::CudaStorage;

/// (..., k) with its last dimension replaced by `n`.
fn with_last_dim(layout: &Layout, n: usize) -> Shape {
    let mut dims = layout.dims().to_vec();
    *dims.last_mut().expect("x has at least one dimension") = n;
    Shape::from(dims)
}

/// A contiguous tensor read as a matrix, as is (`false`) or transposed.
#[cfg(feature = "cuda")]
fn matrix<'a>(storage: &'a CudaStorage, layout: &'a Layout, transposed: bool) -> Matrix<'a> {
    Matrix { storage, layout, transposed }
}

/// `x · wᵀ` for `x` (..., C) and `w` (O, C): (..., O), with a backward pass.
///
/// candle's `Linear` broadcasts `w` over the batch, transposes it and runs a
/// batched product: three nodes in the graph, each adding a pass over its
/// gradient in backward, and a weight gradient summed over the batch. Here the
/// leading dimensions fold into the rows of one matrix product, one node,
/// whose backward is two products: dx = dy · w and dw = dyᵀ · x. f32 on the
/// CPU, any dtype on an NVIDIA GPU (cuBLAS); other devices take candle's
/// composed path.
pub fn linear(x: &Tensor, w: &Tensor) -> Result<Tensor> {
    let (out_features, in_features) = w.dims2()?;
    let dims = x.dims();
    if dims.last() != Some(&in_features) {
        bail!("linear: input of shape {dims:?} does not end in the weight's {in_features} input features");
    }
    let mut out_dims = dims.to_vec();
    *out_dims.last_mut().expect("checked above") = out_features;
    let on_cpu = matches!(x.device(), Device::Cpu) && x.dtype() == DType::F32 && w.dtype() == DType::F32;
    if on_cpu || (on_gpu_path(x) && x.dtype() == w.dtype()) {
        return x.contiguous()?.apply_op2(&w.contiguous()?, Linear);
    }
    let rows = x.elem_count() / in_features;
    x.reshape((rows, in_features))?.matmul(&w.t()?)?.reshape(out_dims)
}

/// A row-major or transposed view of an f32 matrix: element (i, j) is at
/// `i * row_stride + j * col_stride`.
#[derive(Clone, Copy)]
struct View<'a> {
    values: &'a [f32],
    row_stride: usize,
    col_stride: usize,
}

impl<'a> View<'a> {
    fn rows(values: &'a [f32], width: usize) -> Self {
        Self { values, row_stride: width, col_stride: 1 }
    }

    /// The transpose of a row-major matrix of `width` columns.
    fn transposed(values: &'a [f32], width: usize) -> Self {
        Self { values, row_stride: 1, col_stride: width }
    }

    /// Whether every element of a `rows`×`cols` matrix lies inside `values`.
    fn covers(&self, rows: usize, cols: usize) -> bool {
        rows == 0 || cols == 0 || (rows - 1) * self.row_stride + (cols - 1) * self.col_stride < self.values.len()
    }
}

/// a (m×k) · b (k×n), row-major, on the kernel threads when `parallel`.
fn product(m: usize, n: usize, k: usize, a: View, b: View, parallel: bool) -> Vec<f32> {
    // gemm reads through raw pointers: a view too short would be read past its end.
    assert!(a.covers(m, k) && b.covers(k, n), "linear kernel: operands smaller than {m}x{k} and {k}x{n}");
    let threads = rayon::current_num_threads();
    let parallelism = if parallel && threads > 1 { Parallelism::Rayon(threads) } else { Parallelism::None };
    // Not zero-filled: with read_dst false, gemm writes every element of the
    // output without reading it.
    let mut out = Vec::<f32>::with_capacity(m * n);
    // SAFETY: the assert above keeps every read inside a and b; out's capacity
    // is m×n, and gemm has initialised all of it when set_len runs.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            out.spare_capacity_mut().as_mut_ptr().cast::<f32>(),
            1,
            n as isize,
            false,
            a.values.as_ptr(),
            a.col_stride as isize,
            a.row_stride as isize,
            b.values.as_ptr(),
            b.col_stride as isize,
            b.row_stride as isize,
            0.0,
            1.0,
            false,
            false,
            false,
            parallelism,
        );
        out.set_len(m * n);
    }
    out
}

/// Rows of x per block of the weight gradient's sum.
const ROW_BLOCK: usize = 512;

/// dw = dyᵀ · x (n×k) for dy (m×n) and x (m×k). A long sum into a small
/// matrix splits poorly inside one product, so the rows go in fixed blocks,
/// one product each, spread over the kernel threads and added in block
/// order: the same result on any number of threads.
fn weight_gradient(dy: &[f32], x: &[f32], m: usize, n: usize, k: usize) -> Vec<f32> {
    let block = |start: usize| {
        let rows = ROW_BLOCK.min(m - start);
        let dy_t = View::transposed(&dy[start * n..(start + rows) * n], n);
        product(n, k, rows, dy_t, View::rows(&x[start * k..(start + rows) * k], k), false)
    };
    let starts: Vec<usize> = (0..m).step_by(ROW_BLOCK).collect();
    let partials: Vec<Vec<f32>> = if rayon::current_num_threads() > 1 {
        starts.par_iter().map(|&s| block(s)).collect()
    } else {
        starts.iter().map(|&s| block(s)).collect()
    };
    let mut partials = partials.into_iter();
    let mut total = partials.next().unwrap_or_else(|| vec![0.0; n * k]);
    for partial in partials {
        total.iter_mut().zip(&partial).for_each(|(t, p)| *t += p);
    }
    total
}

struct Linear;

impl CustomOp2 for Linear {
    fn name(&self) -> &'static str {
        "workbook-linear"
    }

    fn cpu_fwd(&self, xs: &CpuStorage, xl: &Layout, ws: &CpuStorage, wl: &Layout) -> Result<(CpuStorage, Shape)> {
        let (x, w) = (as_f32(xs, xl, self.name())?, as_f32(ws, wl, self.name())?);
        let (n, k) = wl.shape().dims2()?;
        let m = x.len() / k;
        let y = product(m, n, k, View::rows(&x, k), View::transposed(&w, k), true);
        Ok((CpuStorage::F32(y), with_last_dim(xl, n)))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(&self, xs: &CudaStorage, xl: &Layout, ws: &CudaStorage, wl: &Layout) -> Result<(CudaStorage, Shape)> {
        let (n, k) = wl.shape().dims2()?;
        let m = xl.shape().elem_count() / k;
        let y = cuda::matmul(matrix(xs, xl, false), matrix(ws, wl, true), (m, n, k), self.name())?;
        Ok((y, with_last_dim(xl, n)))
    }

    fn bwd(&self, x: &Tensor, w: &Tensor, _y: &Tensor, dy: &Tensor) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let dy = dy.contiguous()?;
        let dx = dy.apply_op2_no_bwd(w, &InputGradient { x_shape: x.shape().clone() })?;
        let dw = dy.apply_op2_no_bwd(x, &WeightGradient)?;
        Ok((Some(dx), Some(dw)))
    }
}

/// dx = dy · w, in the shape of x.
struct InputGradient {
    x_shape: Shape,
}

impl CustomOp2 for InputGradient {
    fn name(&self) -> &'static str {
        "workbook-linear-input-gradient"
    }

    fn cpu_fwd(&self, dys: &CpuStorage, dyl: &Layout, ws: &CpuStorage, wl: &Layout) -> Result<(CpuStorage, Shape)> {
        let (dy, w) = (as_f32(dys, dyl, self.name())?, as_f32(ws, wl, self.name())?);
        let (n, k) = wl.shape().dims2()?;
        let dx = product(dy.len() / n, k, n, View::rows(&dy, n), View::rows(&w, k), true);
        Ok((CpuStorage::F32(dx), self.x_shape.clone()))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(&self, dys: &CudaStorage, dyl: &Layout, ws: &CudaStorage, wl: &Layout) -> Result<(CudaStorage, Shape)> {
        let (n, k) = wl.shape().dims2()?;
        let m = dyl.shape().elem_count() / n;
        let dx = cuda::matmul(matrix(dys, dyl, false), matrix(ws, wl, false), (m, k, n), self.name())?;
        Ok((dx, self.x_shape.clone()))
    }
}

/// dw = dyᵀ · x, the weight's (O, C) gradient.
struct WeightGradient;

impl CustomOp2 for WeightGradient {
    fn name(&self) -> &'static str {
        "workbook-linear-weight-gradient"
    }

    fn cpu_fwd(&self, dys: &CpuStorage, dyl: &Layout, xs: &CpuStorage, xl: &Layout) -> Result<(CpuStorage, Shape)> {
        let (dy, x) = (as_f32(dys, dyl, self.name())?, as_f32(xs, xl, self.name())?);
        let n = dyl.dims().last().copied().unwrap_or(1);
        let k = xl.dims().last().copied().unwrap_or(1);
        let m = x.len() / k;
        Ok((CpuStorage::F32(weight_gradient(&dy, &x, m, n, k)), Shape::from((n, k))))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(&self, dys: &CudaStorage, dyl: &Layout, xs: &CudaStorage, xl: &Layout) -> Result<(CudaStorage, Shape)> {
        let n = dyl.dims().last().copied().unwrap_or(1);
        let k = xl.dims().last().copied().unwrap_or(1);
        let m = xl.shape().elem_count() / k;
        let dw = cuda::matmul(matrix(dys, dyl, true), matrix(xs, xl, false), (n, k, m), self.name())?;
        Ok((dw, Shape::from((n, k))))
    }
}
