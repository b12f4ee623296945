//! What every kernel needs: its input as f32 rows, its output back in the
//! input's dtype, and the rows spread over the kernel threads.

use std::borrow::Cow;

use candle_core::backend::BackendStorage;
use candle_core::{bail, CpuStorage, DType, Layout, Result};
use half::{bf16, f16};
use rayon::prelude::*;

/// Below this many elements a kernel runs on the calling thread: splitting
/// would cost more than it saves.
const PARALLEL_MIN: usize = 1 << 15;

/// The elements of a contiguous float tensor as f32 (borrowed when already f32).
pub fn as_f32<'a>(storage: &'a CpuStorage, layout: &Layout, op: &str) -> Result<Cow<'a, [f32]>> {
    let Some((start, end)) = layout.contiguous_offsets() else {
        bail!("{op}: the input must be contiguous (call .contiguous() first)");
    };
    Ok(match storage {
        CpuStorage::F32(v) => Cow::Borrowed(&v[start..end]),
        CpuStorage::BF16(v) => Cow::Owned(v[start..end].iter().map(|x| x.to_f32()).collect()),
        CpuStorage::F16(v) => Cow::Owned(v[start..end].iter().map(|x| x.to_f32()).collect()),
        CpuStorage::F64(v) => Cow::Owned(v[start..end].iter().map(|&x| x as f32).collect()),
        other => bail!("{op}: expected a float tensor, got {:?}", other.dtype()),
    })
}

/// f32 results stored in `dtype`.
pub fn from_f32(values: Vec<f32>, dtype: DType) -> Result<CpuStorage> {
    Ok(match dtype {
        DType::F32 => CpuStorage::F32(values),
        DType::BF16 => CpuStorage::BF16(values.iter().map(|&x| bf16::from_f32(x)).collect()),
        DType::F16 => CpuStorage::F16(values.iter().map(|&x| f16::from_f32(x)).collect()),
        DType::F64 => CpuStorage::F64(values.iter().map(|&x| x as f64).collect()),
        other => bail!("expected a float dtype, got {other:?}"),
    })
}

/// An output of `len` elements written row by row by `kernel` (see
/// [`for_each_row`]), stored in `dtype`.
pub fn compute_rows(len: usize, width: usize, kernel: &impl RowKernel, dtype: DType) -> Result<CpuStorage> {
    let mut out = vec![0f32; len];
    for_each_row(&mut out, width, kernel);
    from_f32(out, dtype)
}

/// An op that only moves elements, so it runs on any float dtype as it is.
pub trait Rearrange {
    fn apply<T: Copy>(&self, src: &[T]) -> Vec<T>;
}

/// `op` applied to the elements of a contiguous float tensor, in its dtype.
pub fn rearrange(storage: &CpuStorage, layout: &Layout, op: &impl Rearrange, name: &str) -> Result<CpuStorage> {
    let Some((start, end)) = layout.contiguous_offsets() else {
        bail!("{name}: the input must be contiguous");
    };
    Ok(match storage {
        CpuStorage::F32(v) => CpuStorage::F32(op.apply(&v[start..end])),
        CpuStorage::BF16(v) => CpuStorage::BF16(op.apply(&v[start..end])),
        CpuStorage::F16(v) => CpuStorage::F16(op.apply(&v[start..end])),
        CpuStorage::F64(v) => CpuStorage::F64(op.apply(&v[start..end])),
        other => bail!("{name}: expected a float tensor, got {:?}", other.dtype()),
    })
}

/// A kernel's work on one row of its output; `row` should be `#[inline(always)]`
/// so that it is compiled into [`for_each_row`]'s vectorised copy.
pub trait RowKernel: Sync {
    /// Writes row `i` of the output into `out`.
    fn row(&self, i: usize, out: &mut [f32]);
}

/// Runs `kernel` on every row of `out` (rows of `width` elements), vectorised,
/// and in parallel when there is enough work.
pub fn for_each_row(out: &mut [f32], width: usize, kernel: &impl RowKernel) {
    let run = |(i, row): (usize, &mut [f32])| vectorized(kernel, i, row);
    if out.len() < PARALLEL_MIN || rayon::current_num_threads() == 1 {
        out.chunks_mut(width).enumerate().for_each(run);
    } else {
        out.par_chunks_mut(width).enumerate().for_each(run);
    }
}

/// Runs the kernel on one row compiled for AVX-512 or AVX2 when the CPU has
/// them (the check is cached), else for the baseline target. The kernels are
/// plain Rust loops; what makes them fast is 16- or 8-wide vector instructions,
/// which the default x86-64 target (SSE2) leaves out. The arithmetic is the
/// same either way (no fused multiply-adds, reductions in a fixed order), and
/// so are the results.
#[inline(always)]
fn vectorized(kernel: &impl RowKernel, i: usize, out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    {
        #[target_feature(enable = "avx512f")]
        fn avx512(kernel: &impl RowKernel, i: usize, out: &mut [f32]) {
            kernel.row(i, out)
        }
        #[target_feature(enable = "avx2")]
        fn avx2(kernel: &impl RowKernel, i: usize, out: &mut [f32]) {
            kernel.row(i, out)
        }
        // SAFETY: each runs only on a CPU that has its feature, checked first.
        if std::is_x86_feature_detected!("avx512f") {
            return unsafe { avx512(kernel, i, out) };
        }
        if std::is_x86_feature_detected!("avx2") {
            return unsafe { avx2(kernel, i, out) };
        }
    }
    kernel.row(i, out)
}

/// Lanes of the reductions below: independent partial results let the
/// compiler use vector instructions, which a single running f32 total forbids.
const LANES: usize = 8;

/// Folds `values` into `LANES` partial results with `f`, then those into one.
#[inline(always)]
fn reduce(values: &[f32], init: f32, f: impl Fn(f32, f32) -> f32) -> f32 {
    let mut lanes = [init; LANES];
    let chunks = values.chunks_exact(LANES);
    let tail = chunks.remainder();
    for chunk in chunks {
        for (lane, &v) in lanes.iter_mut().zip(chunk) {
            *lane = f(*lane, v);
        }
    }
    tail.iter().chain(&lanes).fold(init, |acc, &v| f(acc, v))
}

/// The largest element (-inf for an empty slice).
#[inline(always)]
pub fn max(values: &[f32]) -> f32 {
    reduce(values, f32::NEG_INFINITY, |m, v| if v > m { v } else { m })
}

#[inline(always)]
pub fn sum(values: &[f32]) -> f32 {
    reduce(values, 0.0, |a, v| a + v)
}

/// Σ a·b.
#[inline(always)]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut lanes = [0f32; LANES];
    let (ca, cb) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    let tail: f32 = ca.remainder().iter().zip(cb.remainder()).map(|(x, y)| x * y).sum();
    for (x, y) in ca.zip(cb) {
        for ((lane, &x), &y) in lanes.iter_mut().zip(x).zip(y) {
            *lane += x * y;
        }
    }
    tail + lanes.iter().sum::<f32>()
}
