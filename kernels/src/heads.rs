//! Splitting the channels into attention heads and merging them back, each one
//! node of the graph.

use candle_core::{bail, CpuStorage, CustomOp1, Device, Layout, Result, Shape, Tensor};

use super::on_gpu_path;
use super::rows::{rearrange, Rearrange};
#[cfg(feature = "cuda")]
use candle_core::cuda_backend::CudaStorage;

/// (B, T, C) → (B, H, T, D) with D = C / H, contiguous: each head's channels
/// become a sequence of their own.
///
/// candle's `reshape` + `transpose` + `contiguous` gives the same tensor in
/// three nodes, each of which adds a zero-filled buffer and a pass over the
/// gradient in backward. Here it is one copy forward and one backward.
pub fn split_heads(x: &Tensor, heads: usize) -> Result<Tensor> {
    let (b, t, c) = x.dims3()?;
    if heads == 0 || c % heads != 0 {
        bail!("split_heads: {c} channels do not split into {heads} heads");
    }
    let d = c / heads;
    if !matches!(x.device(), Device::Cpu) && !on_gpu_path(x) {
        return x.reshape((b, t, heads, d))?.transpose(1, 2)?.contiguous();
    }
    let swap = SwapMiddle { rows: t, cols: heads, width: d, out: Shape::from((b, heads, t, d)) };
    x.contiguous()?.apply_op1(swap)
}

/// (B, H, T, D) → (B, T, H·D): the inverse of [`split_heads`].
pub fn merge_heads(y: &Tensor) -> Result<Tensor> {
    let (b, h, t, d) = y.dims4()?;
    if !matches!(y.device(), Device::Cpu) && !on_gpu_path(y) {
        return y.transpose(1, 2)?.reshape((b, t, h * d));
    }
    let swap = SwapMiddle { rows: h, cols: t, width: d, out: Shape::from((b, t, h * d)) };
    y.contiguous()?.apply_op1(swap)
}

/// Reads the input as (batch, rows, cols, width) and writes it as
/// (batch, cols, rows, width) into a tensor of shape `out`.
struct SwapMiddle {
    rows: usize,
    cols: usize,
    width: usize,
    out: Shape,
}

impl Rearrange for SwapMiddle {
    fn apply<T: Copy>(&self, src: &[T]) -> Vec<T> {
        let (rows, cols, width) = (self.rows, self.cols, self.width);
        let mut dst = Vec::with_capacity(src.len());
        for matrix in src.chunks_exact(rows * cols * width) {
            for col in 0..cols {
                for row in 0..rows {
                    let at = (row * cols + col) * width;
                    dst.extend_from_slice(&matrix[at..at + width]);
                }
            }
        }
        dst
    }
}

impl SwapMiddle {
    fn check(&self, layout: &Layout) -> Result<()> {
        let elements = layout.shape().elem_count();
        if elements != self.out.elem_count() {
            bail!("workbook-swap-heads: {elements} elements do not fill the shape {:?}", self.out);
        }
        Ok(())
    }
}

impl CustomOp1 for SwapMiddle {
    fn name(&self) -> &'static str {
        "workbook-swap-heads"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        self.check(layout)?;
        Ok((rearrange(storage, layout, self, self.name())?, self.out.clone()))
    }

    /// One strided copy: the input read as (batch, cols, rows, width).
    #[cfg(feature = "cuda")]
    fn cuda_fwd(&self, storage: &CudaStorage, layout: &Layout) -> Result<(CudaStorage, Shape)> {
        self.check(layout)?;
        let (start, _) = super::cuda::contiguous_range(layout, self.name())?;
        let batch = self.out.elem_count() / (self.rows * self.cols * self.width).max(1);
        let source =
            Layout::contiguous_with_offset((batch, self.rows, self.cols, self.width), start).transpose(1, 2)?;
        super::cuda::copy_strided(storage, &source, self.out.clone())
    }

    fn bwd(&self, x: &Tensor, _y: &Tensor, dy: &Tensor) -> Result<Option<Tensor>> {
        let back = SwapMiddle { rows: self.cols, cols: self.rows, width: self.width, out: x.shape().clone() };
        Ok(Some(dy.contiguous()?.apply_op1_no_bwd(&back)?))
    }
}
