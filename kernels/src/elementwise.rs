//! Whole-tensor arithmetic between the model's passes: summing the gradients
//! of a batch's parts, scaling and accumulating gradients, the optimizer's
//! update, the gradients' norm and their check for infs and NaNs.
//!
//! At GPT-2 124M's size each of these is a pass over half a gigabyte. When a
//! batch is split across threads, each part's kernels run on one thread
//! (candle's elementwise pool serves one caller at a time), so candle runs
//! these passes on the step's thread alone while the cores that ran the parts
//! wait: about a fifth of a 124M step on 2 cores. Here a pass is cut into
//! chunks spread over the threads [`set_threads_between_passes`] gives it, and
//! its outputs are written once, never zero-filled first. Each element gets
//! the f32 operation candle's op gives it, so the results are candle's; the
//! reductions' sums are grouped by chunk, so they are the same whatever the
//! threads, but not candle's to the last bit. Their results are fresh
//! tensors outside any graph, as gradients and parameter updates are: no
//! backward runs through them.

use std::mem::MaybeUninit;
use std::ops::Range;
use std::sync::OnceLock;

use candle_core::{DType, Error, Result, Storage, Tensor};
use rayon::prelude::*;

use super::rows::{as_f32, dot};

/// Elements per unit of work: a pass of one unit runs on the calling thread.
const CHUNK: usize = 1 << 16;

static POOL: OnceLock<rayon::ThreadPool> = OnceLock::new();

/// Gives the passes between the model's passes `threads` threads of their own:
/// for a process whose model runs on more threads than each of its kernels
/// uses (a batch split across threads, one kernel thread per part). Without
/// it these passes use the current rayon pool. The first call decides; later
/// ones change nothing.
pub fn set_threads_between_passes(threads: usize) -> Result<()> {
    if threads > 1 && POOL.get().is_none() {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("between passes {i}"))
            .build()
            .map_err(Error::wrap)?;
        let _ = POOL.set(pool);
    }
    Ok(())
}

/// `a + b`, for two tensors of one shape.
pub fn add(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    if !in_one_pass(&[a, b]) {
        return a + b;
    }
    let [sum] = with_f32s([a, b], "add", |[x, y]| {
        map_chunks(x.len(), |r: Range<usize>| x[r.clone()].iter().zip(&y[r]).map(|(x, y)| [x + y]))
    })?;
    Tensor::from_vec(sum, a.shape(), a.device())
}

/// `a · factor`: candle's `a * factor`, which is `affine(factor, 0)`, an f32
/// multiply plus an f32 zero (which turns −0 into +0).
pub fn scale(a: &Tensor, factor: f64) -> Result<Tensor> {
    if !in_one_pass(&[a]) {
        return a * factor;
    }
    let factor = factor as f32;
    let [scaled] = with_f32s([a], "scale", |[x]| map_chunks(x.len(), |r| x[r].iter().map(|x| [x * factor + 0.0])))?;
    Tensor::from_vec(scaled, a.shape(), a.device())
}

/// The sum of the squares of the elements of all `tensors`, added in f64
/// across tensors: on the CPU each chunk summed in f32, the chunks' sums in
/// f64; elsewhere each tensor summed where it lives, in f32.
pub fn sum_of_squares(tensors: &[&Tensor]) -> Result<f64> {
    let (one_pass, elsewhere): (Vec<&Tensor>, Vec<&Tensor>) = tensors.iter().partition(|t| in_one_pass(&[t]));
    let mut total = 0.0;
    for t in one_pass {
        total += with_f32s([t], "sum_of_squares", |[x]| {
            per_chunk(x.len(), |r| dot(&x[r.clone()], &x[r]) as f64).iter().sum::<f64>()
        })?;
    }
    Ok(total + sums_read_back(&elsewhere, Tensor::sqr)?.iter().sum::<f64>())
}

/// Whether no element of any of `tensors` is an inf or a NaN.
pub fn all_finite(tensors: &[&Tensor]) -> Result<bool> {
    let (one_pass, elsewhere): (Vec<&Tensor>, Vec<&Tensor>) = tensors.iter().partition(|t| in_one_pass(&[t]));
    // A chunk's elements are checked 16 at a time without branching, so the check vectorizes.
    let finite = |x: &[f32]| x.chunks(16).all(|lanes| lanes.iter().fold(true, |ok, v| ok & v.is_finite()));
    for t in one_pass {
        if !with_f32s([t], "all_finite", |[x]| per_chunk(x.len(), |r| finite(&x[r])).into_iter().all(|ok| ok))? {
            return Ok(false);
        }
    }
    // An inf or a NaN makes the sum of magnitudes one too, so a finite sum
    // settles it; finite elements can still overflow it, so the elements
    // decide the rest.
    for (t, sum) in elsewhere.iter().zip(sums_read_back(&elsewhere, Tensor::abs)?) {
        if !sum.is_finite() && !t.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?.iter().all(|v| v.is_finite()) {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Σ f(t) over each tensor's elements, in f32, reduced where the tensor
/// lives and read back once per device rather than once per tensor: on a GPU
/// each read-back waits for every kernel queued before it.
fn sums_read_back(tensors: &[&Tensor], f: impl Fn(&Tensor) -> Result<Tensor>) -> Result<Vec<f64>> {
    let sums = tensors.iter().map(|t| sum_by_rows(&f(&t.to_dtype(DType::F32)?)?)).collect::<Result<Vec<_>>>()?;
    let mut values = Vec::with_capacity(sums.len());
    for group in sums.chunk_by(|a, b| a.device().same_device(b.device())) {
        values.extend(Tensor::stack(group, 0)?.to_vec1::<f32>()?.into_iter().map(f64::from));
    }
    Ok(values)
}

/// The sum of `v`'s elements, rows of [`ROW`] first: on a GPU candle sums a
/// whole tensor in one thread block, but each row in a block of its own.
fn sum_by_rows(v: &Tensor) -> Result<Tensor> {
    const ROW: usize = 1024;
    let flat = v.flatten_all()?;
    let (n, rows) = (flat.elem_count(), flat.elem_count() / ROW);
    if rows == 0 {
        return flat.sum_all();
    }
    let whole_rows = flat.narrow(0, 0, rows * ROW)?.reshape((rows, ROW))?.sum(1)?.sum_all()?;
    if n == rows * ROW {
        return Ok(whole_rows);
    }
    whole_rows + flat.narrow(0, rows * ROW, n - rows * ROW)?.sum_all()?
}

/// Whether `tensors` take the one-pass path: contiguous f32 on the CPU, of one shape.
pub(crate) fn in_one_pass(tensors: &[&Tensor]) -> bool {
    let shape = tensors[0].shape();
    tensors.iter().all(|t| t.device().is_cpu() && t.dtype() == DType::F32 && t.is_contiguous() && t.shape() == shape)
}

/// `f` of the elements of `tensors`, each contiguous f32 on the CPU.
pub(crate) fn with_f32s<const N: usize, R>(
    tensors: [&Tensor; N],
    op: &str,
    f: impl FnOnce([&[f32]; N]) -> R,
) -> Result<R> {
    let guards = tensors.map(|t| t.storage_and_layout());
    let mut slices = Vec::with_capacity(N);
    for (storage, layout) in &guards {
        let Storage::Cpu(storage) = &**storage else {
            candle_core::bail!("{op}: expected a tensor on the CPU");
        };
        slices.push(as_f32(storage, layout, op)?);
    }
    let views: [&[f32]; N] = std::array::from_fn(|i| &*slices[i]);
    Ok(f(views))
}

/// `K` vectors of `len` elements: the items `values(range)` yields, in order,
/// are elements `range` of the outputs. Chunk by chunk, spread over the
/// threads between passes; each element is written once.
pub(crate) fn map_chunks<const K: usize, I: Iterator<Item = [f32; K]>>(
    len: usize,
    values: impl Fn(Range<usize>) -> I + Sync,
) -> [Vec<f32>; K] {
    let mut outputs: [Vec<f32>; K] = std::array::from_fn(|_| Vec::with_capacity(len));
    {
        let mut chunks = outputs.each_mut().map(|out| out.spare_capacity_mut()[..len].chunks_mut(CHUNK));
        let units: Vec<(usize, [&mut [MaybeUninit<f32>]; K])> = (0..len.div_ceil(CHUNK))
            .map(|i| (i * CHUNK, std::array::from_fn(|k| chunks[k].next().expect("one chunk per unit"))))
            .collect();
        let fill = |(start, mut outs): (usize, [&mut [MaybeUninit<f32>]; K])| {
            let n = outs[0].len();
            let mut written = 0;
            for (j, item) in values(start..start + n).enumerate().take(n) {
                for (out, value) in outs.iter_mut().zip(item) {
                    out[j].write(value);
                }
                written += 1;
            }
            assert_eq!(written, n, "map_chunks: {n} values were due for elements {start}.., {written} came");
        };
        spread(units, fill);
    }
    for out in &mut outputs {
        // SAFETY: the units' chunks cover elements 0..len of every output, and
        // `fill` wrote each element of its chunks (it panics otherwise).
        unsafe { out.set_len(len) };
    }
    outputs
}

/// `f` of each chunk of the elements `0..len`, in order.
fn per_chunk<T: Send>(len: usize, f: impl Fn(Range<usize>) -> T + Sync) -> Vec<T> {
    spread((0..len).step_by(CHUNK).map(|start| start..len.min(start + CHUNK)).collect(), f)
}

/// `f` of each unit of work, in order: on the threads between passes when
/// there are two units or more.
fn spread<U: Send, T: Send>(units: Vec<U>, f: impl Fn(U) -> T + Sync) -> Vec<T> {
    if units.len() < 2 {
        return units.into_iter().map(f).collect();
    }
    between_passes(|| units.into_par_iter().map(&f).collect())
}

/// Runs `work` on the threads between passes, or where it is called when none were set.
fn between_passes<R: Send>(work: impl FnOnce() -> R + Send) -> R {
    match POOL.get() {
        Some(pool) => pool.install(work),
        None => work(),
    }
}
