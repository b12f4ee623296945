//! The workbook's ops on an NVIDIA GPU: the fused softmax, cross-entropy and
//! SiLU as CUDA kernels that NVRTC compiles from the source below the first
//! time a process needs them, and the one-node linear layer, head reshapes
//! and channel broadcast as cuBLAS products and strided copies.
//!
//! On the GPU, candle composes these ops from elementwise kernels and
//! reductions, each a pass over the whole tensor in global memory: for
//! attention's (B, H, T, T) scores and the head's (B·T, vocabulary) logits
//! those passes, forward and backward, are much of a step. Here a thread
//! block owns a row: it finds the row's max and sum of exponentials with
//! warp shuffles, then writes the row once. And every node of the autograd
//! graph costs a zero-filled buffer and an addition per input in candle's
//! backward pass, so the ops that candle builds from reshapes and transposes
//! are one node each here.
//!
//! Which path runs on a GPU is chosen by `WORKBOOK_CUDA_KERNELS` (see
//! [`fused_enabled`]); the kernels are f32 only, other dtypes take candle's
//! composed ops.
//! `scripts/cuda-on-cpu/check.py` runs the kernels' source on the CPU against
//! NumPy, for a change made without a GPU at hand.

use std::sync::OnceLock;

use candle_core::backend::{BackendDevice, BackendStorage};
use candle_core::cuda_backend::cudarc::driver::{CudaSlice, CudaView, LaunchConfig, PushKernelArg};
use candle_core::cuda_backend::cudarc::nvrtc;
use candle_core::cuda_backend::{CudaDevice, CudaStorage, WrapErr};
use candle_core::op::BackpropOp;
use candle_core::{bail, Layout, Result, Shape, Storage, Tensor};

use super::AdamWStep;

/// The environment variable that picks the GPU path: `composed` for candle's
/// ops; unset or anything else for the workbook's.
pub const SWITCH: &str = "WORKBOOK_CUDA_KERNELS";

/// Whether the workbook's ops run on a GPU (the default), or candle's
/// composed ops (`WORKBOOK_CUDA_KERNELS=composed`), to compare or to rule
/// them out.
pub fn fused_enabled() -> bool {
    static FUSED: OnceLock<bool> = OnceLock::new();
    *FUSED.get_or_init(|| std::env::var(SWITCH).map_or(true, |value| value != "composed"))
}

const MODULE: &str = "workbook-fused";

/// The kernels' source: the element type's conversions to and from f32,
/// then [`ROWS`], then the kernels; `scripts/cuda-on-cpu/check.py` reads
/// the list too.
const F32_MODULE: [&str; 3] = [F32_ELEMENTS, ROWS, F32_KERNELS];

/// f32 elements are read and written as they are.
const F32_ELEMENTS: &str = r#"
__device__ float to_float(float v) { return v; }
__device__ void store(float* at, float v) { *at = v; }
"#;

/// The softmax and cross-entropy kernels give each row a thread block, of any
/// size that is a multiple of 32. They are templates over the element type
/// `T` they read and write, so that other element types than f32 can share
/// them, and keep every statistic (max, sums, log-sum-exp) in f32 whatever
/// `T` is, as the CPU's kernels do. `ROW_KERNELS(T, suffix)` makes them
/// kernels named `softmax_rows_<suffix>` and so on, since the launch code
/// finds a kernel by name and a template's instances have only mangled ones.
/// Masked positions are -inf before the softmax, so a row with nothing
/// allowed gives NaN, as the composed ops do.
const ROWS: &str = r#"
#define NEG_INF __int_as_float(0xff800000)
#define FULL_MASK 0xffffffffu

__device__ float warp_max(float v) {
    for (int offset = 16; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(FULL_MASK, v, offset));
    return v;
}

__device__ float warp_sum(float v) {
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(FULL_MASK, v, offset);
    return v;
}

// The block's max of one value per thread, handed to every thread. The first
// barrier keeps a previous call's readers ahead of this call's writers.
__device__ float block_max(float v) {
    __shared__ float partial[32];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x + 31) >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    return warp_max(lane < warps ? partial[lane] : NEG_INF);
}

__device__ float block_sum(float v) {
    __shared__ float partial[32];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x + 31) >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    return warp_sum(lane < warps ? partial[lane] : 0.0f);
}

// log sum exp of a row in one read: each thread keeps a running max and a
// sum of exponentials relative to it, rescaled when the max grows. A -inf
// adds nothing (while the running max is -inf too, exp(v - m) would be NaN);
// a row of nothing but -inf is NaN, as on the CPU.
template <class T>
__device__ float row_log_sum_exp(const T* row, int width) {
    float m = NEG_INF, s = 0.0f;
    for (int j = threadIdx.x; j < width; j += blockDim.x) {
        float v = to_float(row[j]);
        if (v > m) {
            s = s * expf(m - v) + 1.0f;
            m = v;
        } else if (v != NEG_INF) {
            s += expf(v - m);
        }
    }
    float top = block_max(m);
    s = block_sum(m == NEG_INF ? 0.0f : s * expf(m - top));
    return top == NEG_INF ? __int_as_float(0x7fc00000) : top + logf(s);
}

// y = softmax(scale * x) per row of width `width`; where `allowed` is not
// null, row r is query r % queries and allowed[query * width + j] == 0 makes
// position j -inf first.
template <class T>
__device__ void softmax_rows(const T* x, const unsigned char* allowed, T* y, int width, int queries, float scale) {
    const T* row = x + (size_t)blockIdx.x * width;
    T* out = y + (size_t)blockIdx.x * width;
    const unsigned char* keep = allowed ? allowed + (size_t)(blockIdx.x % queries) * width : 0;
    float m = NEG_INF;
    for (int j = threadIdx.x; j < width; j += blockDim.x)
        if (!keep || keep[j]) m = fmaxf(m, scale * to_float(row[j]));
    m = block_max(m);
    float s = 0.0f;
    for (int j = threadIdx.x; j < width; j += blockDim.x) {
        float e = (!keep || keep[j]) ? expf(scale * to_float(row[j]) - m) : 0.0f;
        store(out + j, e);
        s += e;
    }
    float inv = 1.0f / block_sum(s);
    for (int j = threadIdx.x; j < width; j += blockDim.x) store(out + j, to_float(out[j]) * inv);
}

// dx = scale * y * (dy - sum(y * dy)) per row.
template <class T>
__device__ void softmax_backward_rows(const T* y, const T* dy, T* dx, int width, float scale) {
    size_t start = (size_t)blockIdx.x * width;
    float d = 0.0f;
    for (int j = threadIdx.x; j < width; j += blockDim.x) d += to_float(y[start + j]) * to_float(dy[start + j]);
    d = block_sum(d);
    for (int j = threadIdx.x; j < width; j += blockDim.x)
        store(dx + start + j, scale * (to_float(y[start + j]) * (to_float(dy[start + j]) - d)));
}

// losses[r] = log sum exp(row r) - row r [targets[r]], in f32 for the mean;
// NaN for a target that is not a class index.
template <class T>
__device__ void cross_entropy_rows(const T* logits, const unsigned int* targets, float* losses, int classes) {
    const T* row = logits + (size_t)blockIdx.x * classes;
    float lse = row_log_sum_exp(row, classes);
    if (threadIdx.x == 0) {
        unsigned int t = targets[blockIdx.x];
        losses[blockIdx.x] = t < (unsigned int)classes ? lse - to_float(row[t]) : __int_as_float(0x7fc00000);
    }
}

// d logits = (softmax(row) - onehot(target)) * dloss / rows per row.
template <class T>
__device__ void cross_entropy_backward_rows(const T* logits, const unsigned int* targets, const T* dloss, T* dlogits,
                                            int classes) {
    const T* row = logits + (size_t)blockIdx.x * classes;
    float scale = to_float(dloss[0]) / gridDim.x;
    T* out = dlogits + (size_t)blockIdx.x * classes;
    float lse = row_log_sum_exp(row, classes);
    unsigned int t = targets[blockIdx.x];
    for (int j = threadIdx.x; j < classes; j += blockDim.x)
        store(out + j, expf(to_float(row[j]) - lse) * scale - ((unsigned int)j == t ? scale : 0.0f));
}

// out[0] = the mean of n f32 values, by one block, rounded once to T.
template <class T>
__device__ void mean(const float* values, T* out, int n) {
    float s = 0.0f;
    for (int j = threadIdx.x; j < n; j += blockDim.x) s += values[j];
    s = block_sum(s);
    if (threadIdx.x == 0) store(out, s / n);
}

#define ROW_KERNELS(T, suffix)                                                                                     \
    extern "C" __global__ void softmax_rows_##suffix(const T* x, const unsigned char* allowed, T* y, int width,     \
                                                     int queries, float scale) {                                    \
        softmax_rows(x, allowed, y, width, queries, scale);                                                         \
    }                                                                                                               \
    extern "C" __global__ void softmax_backward_rows_##suffix(const T* y, const T* dy, T* dx, int width,             \
                                                              float scale) {                                        \
        softmax_backward_rows(y, dy, dx, width, scale);                                                             \
    }                                                                                                               \
    extern "C" __global__ void cross_entropy_rows_##suffix(const T* logits, const unsigned int* targets,            \
                                                           float* losses, int classes) {                            \
        cross_entropy_rows(logits, targets, losses, classes);                                                       \
    }                                                                                                               \
    extern "C" __global__ void cross_entropy_backward_rows_##suffix(const T* logits, const unsigned int* targets,   \
                                                                    const T* dloss, T* dlogits, int classes) {      \
        cross_entropy_backward_rows(logits, targets, dloss, dlogits, classes);                                      \
    }                                                                                                               \
    extern "C" __global__ void mean_##suffix(const float* values, T* out, int n) { mean(values, out, n); }
"#;

/// The f32 row kernels, and SiLU and AdamW, which are elementwise, with a
/// grid-stride loop.
const F32_KERNELS: &str = r#"
ROW_KERNELS(float, f32)

// The elementwise kernels index with size_t: with 32-bit indices, i + stride
// would wrap around for n near 2^32 and the loop would never end.

// y = x * sigmoid(x), elementwise.
extern "C" __global__ void silu_forward(const float* x, float* y, size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)blockDim.x * gridDim.x) {
        float v = x[i];
        y[i] = v / (1.0f + expf(-v));
    }
}

// dx = dy * s * (1 + x * (1 - s)), with s = sigmoid(x).
extern "C" __global__ void silu_backward(const float* x, const float* dy, float* dx, size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)blockDim.x * gridDim.x) {
        float v = x[i], s = 1.0f / (1.0f + expf(-v));
        dx[i] = dy[i] * s * (1.0f + v * (1.0f - s));
    }
}

// AdamW's update of one parameter: m and v from the gradient, then the
// parameter (already decayed) from them; inv_c1 and inv_c2 are the bias
// corrections' reciprocals, 1 / (1 - b1^t) and 1 / (1 - b2^t), and
// one_minus_b1, one_minus_b2 are computed in f64 on the host. Each line is
// one f32 operation of the CPU's update_one, in its order, its "+ 0.0f"s
// included (they turn -0 into +0); compiled without fused multiply-adds, the
// results are the CPU's to the bit.
extern "C" __global__ void adamw_update(const float* decayed, const float* g, const float* m, const float* v,
                                        float* p_out, float* m_out, float* v_out, size_t n, float b1,
                                        float one_minus_b1, float b2, float one_minus_b2, float inv_c1,
                                        float inv_c2, float eps, float lr) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)blockDim.x * gridDim.x) {
        float grad = g[i];
        float exp_avg = (m[i] * b1 + 0.0f) + (grad * one_minus_b1 + 0.0f);
        float exp_avg_sq = (v[i] * b2 + 0.0f) + ((grad * grad) * one_minus_b2 + 0.0f);
        float denom = sqrtf(exp_avg_sq * inv_c2 + 0.0f) * 1.0f + eps;
        float update = (exp_avg * inv_c1 + 0.0f) / denom;
        p_out[i] = decayed[i] - (update * lr + 0.0f);
        m_out[i] = exp_avg;
        v_out[i] = exp_avg_sq;
    }
}
"#;

/// The kernels' PTX, compiled once per process. NVRTC fuses a multiply and
/// an add into one rounding by default (`fmad`); the CPU rounds each, so
/// with fusion AdamW's GPU update would differ from the CPU's in the last
/// bits. Division and square root stay IEEE-exact, denormals kept, as the
/// CPU's.
fn ptx() -> Result<&'static str> {
    static PTX: OnceLock<std::result::Result<String, String>> = OnceLock::new();
    let options = nvrtc::CompileOptions {
        fmad: Some(false),
        prec_div: Some(true),
        prec_sqrt: Some(true),
        ftz: Some(false),
        ..Default::default()
    };
    let compiled = PTX.get_or_init(|| {
        nvrtc::compile_ptx_with_opts(F32_MODULE.concat(), options).map(|ptx| ptx.to_src()).map_err(|e| e.to_string())
    });
    match compiled {
        Ok(ptx) => Ok(ptx),
        Err(e) => bail!("NVRTC could not compile the workbook's fused CUDA kernels ({e}); set {SWITCH}=composed to use candle's ops"),
    }
}

/// One thread block per row, of a size that suits `width` (a multiple of 32, at most `most`).
fn rows_config(rows: usize, width: usize, most: usize) -> Result<LaunchConfig> {
    let rows = match u32::try_from(rows) {
        Ok(0) => bail!("workbook-fused: the input has no rows"),
        Ok(rows) => rows,
        Err(_) => bail!("workbook-fused: {rows} rows are more than one launch can take"),
    };
    let threads = width.next_power_of_two().clamp(32, most) as u32;
    Ok(LaunchConfig { grid_dim: (rows, 1, 1), block_dim: (threads, 1, 1), shared_mem_bytes: 0 })
}

/// Where a contiguous tensor's elements start and end in its storage; an
/// error for any other layout, which no kernel or copy here reads.
pub fn contiguous_range(layout: &Layout, op: &str) -> Result<(usize, usize)> {
    match layout.contiguous_offsets() {
        Some(range) => Ok(range),
        None => bail!("{op}: the input must be contiguous (call .contiguous() first)"),
    }
}

/// A contiguous tensor's elements, as a view of its device memory.
fn view<'a, T: candle_core::cuda_backend::CudaDType>(
    storage: &'a CudaStorage,
    layout: &Layout,
    op: &str,
) -> Result<CudaView<'a, T>> {
    let (start, end) = contiguous_range(layout, op)?;
    Ok(storage.as_cuda_slice::<T>()?.slice(start..end))
}

fn width_of(layout: &Layout) -> usize {
    layout.dims().last().copied().unwrap_or(1).max(1)
}

fn as_i32(n: usize, what: &str) -> Result<i32> {
    i32::try_from(n).or_else(|_| bail!("workbook-fused: {what} of {n} does not fit the kernels' 32-bit sizes"))
}

/// Room on `device` for `len` f32 results of a kernel.
fn output(device: &CudaDevice, len: usize) -> Result<CudaSlice<f32>> {
    // SAFETY: every kernel here writes each element of its output before anything reads it.
    unsafe { device.alloc::<f32>(len) }
}

/// Runs kernel `$name` of the module on `$device`'s stream with launch
/// configuration `$config`; `$push` pushes its arguments onto `$args` in the
/// kernel's order. A macro, not a function: the pushed references must
/// outlive the builder, which borrows the function loaded here.
macro_rules! launch {
    ($device:expr, $name:expr, $config:expr, |$args:ident| $push:block) => {{
        let func = $device.get_or_load_custom_func($name, MODULE, ptx()?)?;
        let mut $args = func.builder();
        $push
        // SAFETY: each call pushes its kernel's parameters in order and type,
        // and the kernels index only inside the rows `$config` gives them.
        unsafe { $args.launch($config) }.w()
    }};
}

/// `softmax(scale · x)` over the last dimension, with `mask` (Tq, Tk) u8 where given.
pub fn softmax(
    x: &CudaStorage,
    xl: &Layout,
    mask: Option<(&CudaStorage, &Layout)>,
    scale: f32,
) -> Result<(CudaStorage, Shape)> {
    let op = "workbook-softmax";
    let device = x.device();
    let (width, len) = (width_of(xl), xl.shape().elem_count());
    let x = view::<f32>(x, xl, op)?;
    let mask = match mask {
        Some((storage, layout)) => Some((view::<u8>(storage, layout, op)?, layout.shape().elem_count() / width)),
        None => None,
    };
    // A null pointer tells the kernel that nothing is masked.
    let (null, queries) = (0u64, as_i32(mask.as_ref().map_or(1, |(_, queries)| *queries), "a mask")?);
    let width_arg = as_i32(width, "a row")?;
    let mut y = output(device, len)?;
    launch!(device, "softmax_rows_f32", rows_config(len / width, width, 256)?, |args| {
        args.arg(&x);
        match &mask {
            Some((allowed, _)) => args.arg(allowed),
            None => args.arg(&null),
        };
        args.arg(&mut y).arg(&width_arg).arg(&queries).arg(&scale);
    })?;
    Ok((CudaStorage::wrap_cuda_slice(y, device.clone()), xl.shape().clone()))
}

/// `scale · y ⊙ (dy − Σ y ⊙ dy)` over the last dimension.
pub fn softmax_backward(
    y: &CudaStorage,
    yl: &Layout,
    dy: &CudaStorage,
    dyl: &Layout,
    scale: f32,
) -> Result<(CudaStorage, Shape)> {
    let op = "workbook-softmax-backward";
    let device = y.device();
    let (width, len) = (width_of(yl), yl.shape().elem_count());
    let (y, dy) = (view::<f32>(y, yl, op)?, view::<f32>(dy, dyl, op)?);
    let width_arg = as_i32(width, "a row")?;
    let mut dx = output(device, len)?;
    launch!(device, "softmax_backward_rows_f32", rows_config(len / width, width, 256)?, |args| {
        args.arg(&y).arg(&dy).arg(&mut dx).arg(&width_arg).arg(&scale);
    })?;
    Ok((CudaStorage::wrap_cuda_slice(dx, device.clone()), yl.shape().clone()))
}

/// The mean over rows of `log Σ exp(logits) − logits[target]`, as a scalar.
pub fn cross_entropy(
    logits: &CudaStorage,
    ll: &Layout,
    targets: &CudaStorage,
    tl: &Layout,
) -> Result<(CudaStorage, Shape)> {
    let op = "workbook-cross-entropy";
    let device = logits.device();
    let (rows, classes) = ll.shape().dims2()?;
    let (logits, targets) = (view::<f32>(logits, ll, op)?, view::<u32>(targets, tl, op)?);
    let (classes_arg, rows_arg) = (as_i32(classes, "a vocabulary")?, as_i32(rows, "a batch")?);
    let mut losses = output(device, rows)?;
    launch!(device, "cross_entropy_rows_f32", rows_config(rows, classes, 1024)?, |args| {
        args.arg(&logits).arg(&targets).arg(&mut losses).arg(&classes_arg);
    })?;
    let mut loss = output(device, 1)?;
    launch!(device, "mean_f32", rows_config(1, rows, 1024)?, |args| {
        args.arg(&losses).arg(&mut loss).arg(&rows_arg);
    })?;
    Ok((CudaStorage::wrap_cuda_slice(loss, device.clone()), Shape::from(())))
}

/// `(softmax(logits) − onehot(target)) · dloss / N`, row by row, for N rows.
pub fn cross_entropy_backward(
    logits: &CudaStorage,
    ll: &Layout,
    targets: &CudaStorage,
    tl: &Layout,
    (dloss, gl): (&CudaStorage, &Layout),
) -> Result<(CudaStorage, Shape)> {
    let op = "workbook-cross-entropy-backward";
    let device = logits.device();
    let (rows, classes) = ll.shape().dims2()?;
    let (logits, targets) = (view::<f32>(logits, ll, op)?, view::<u32>(targets, tl, op)?);
    let dloss = view::<f32>(dloss, gl, op)?;
    let classes_arg = as_i32(classes, "a vocabulary")?;
    let mut dlogits = output(device, rows * classes)?;
    launch!(device, "cross_entropy_backward_rows_f32", rows_config(rows, classes, 1024)?, |args| {
        args.arg(&logits).arg(&targets).arg(&dloss).arg(&mut dlogits).arg(&classes_arg);
    })?;
    Ok((CudaStorage::wrap_cuda_slice(dlogits, device.clone()), ll.shape().clone()))
}

/// A grid-stride launch over `n` elements: one thread per element up to
/// u32::MAX elements (what `for_num_elems` counts), beyond that each thread
/// loops over the rest.
fn elements_config(n: usize) -> (LaunchConfig, u64) {
    let blocks_for = u32::try_from(n).unwrap_or(u32::MAX).max(1);
    (LaunchConfig::for_num_elems(blocks_for), n as u64)
}

/// `x · sigmoid(x)` elementwise.
pub fn silu(x: &CudaStorage, xl: &Layout) -> Result<(CudaStorage, Shape)> {
    let device = x.device();
    let len = xl.shape().elem_count();
    let x = view::<f32>(x, xl, "workbook-silu")?;
    let (config, n) = elements_config(len);
    let mut y = output(device, len)?;
    launch!(device, "silu_forward", config, |args| {
        args.arg(&x).arg(&mut y).arg(&n);
    })?;
    Ok((CudaStorage::wrap_cuda_slice(y, device.clone()), xl.shape().clone()))
}

/// SiLU's gradient `dy · s · (1 + x · (1 − s))`, with `s = sigmoid(x)`.
pub fn silu_backward(x: &CudaStorage, xl: &Layout, dy: &CudaStorage, dyl: &Layout) -> Result<(CudaStorage, Shape)> {
    let op = "workbook-silu-backward";
    let device = x.device();
    let len = xl.shape().elem_count();
    let (x, dy) = (view::<f32>(x, xl, op)?, view::<f32>(dy, dyl, op)?);
    let (config, n) = elements_config(len);
    let mut dx = output(device, len)?;
    launch!(device, "silu_backward", config, |args| {
        args.arg(&x).arg(&dy).arg(&mut dx).arg(&n);
    })?;
    Ok((CudaStorage::wrap_cuda_slice(dx, device.clone()), xl.shape().clone()))
}

/// A contiguous tensor's elements read as a row-major (rows × cols) matrix,
/// or as the transpose of a row-major (cols × rows) one.
pub struct Matrix<'a> {
    pub storage: &'a CudaStorage,
    pub layout: &'a Layout,
    pub transposed: bool,
}

impl Matrix<'_> {
    fn layout(&self, (rows, cols): (usize, usize), op: &str) -> Result<Layout> {
        let (start, _) = contiguous_range(self.layout, op)?;
        let strides = if self.transposed { vec![1, rows] } else { vec![cols, 1] };
        Ok(Layout::new(Shape::from((rows, cols)), strides, start))
    }
}

/// `a · b` for `a` (m × k) and `b` (k × n), by cuBLAS, in their dtype.
pub fn matmul(a: Matrix, b: Matrix, (m, n, k): (usize, usize, usize), op: &str) -> Result<CudaStorage> {
    let (a_layout, b_layout) = (a.layout((m, k), op)?, b.layout((k, n), op)?);
    a.storage.matmul(b.storage, (1, m, n, k), &a_layout, &b_layout)
}

/// The elements of `storage` in the order `layout` reads them, written
/// contiguously into a new tensor of `shape`.
pub fn copy_strided(storage: &CudaStorage, layout: &Layout, shape: Shape) -> Result<(CudaStorage, Shape)> {
    let device = storage.device();
    // SAFETY: the copy writes every element of the new storage.
    let mut out = unsafe { device.alloc_uninit(&shape, storage.dtype())? };
    storage.copy_strided_src(&mut out, 0, layout)?;
    Ok((out, shape))
}

/// AdamW's update of a parameter already decayed, from contiguous f32
/// tensors of one shape on one GPU: the new parameter, `m` and `v`, in one
/// pass instead of a dozen.
pub fn adamw_update(tensors: [&Tensor; 4], step: &AdamWStep) -> Result<[Tensor; 3]> {
    let op = "adamw_update";
    let guards = tensors.map(|t| t.storage_and_layout());
    let mut views = Vec::with_capacity(4);
    for (storage, layout) in &guards {
        let Storage::Cuda(storage) = &**storage else { bail!("{op}: expected tensors on a GPU") };
        views.push(view::<f32>(storage, layout, op)?);
    }
    let device = tensors[0].device().as_cuda_device()?;
    let len = tensors[0].elem_count();
    let (config, n) = elements_config(len);
    let mut outputs = [output(device, len)?, output(device, len)?, output(device, len)?];
    // The kernel's constants, as the CPU's update_one rounds them to f32.
    let (beta1, beta2) = (step.beta1 as f32, step.beta2 as f32);
    let (one_minus_beta1, one_minus_beta2) = ((1.0 - step.beta1) as f32, (1.0 - step.beta2) as f32);
    let (inv_correction1, inv_correction2) = ((1.0 / step.correction1) as f32, (1.0 / step.correction2) as f32);
    let (eps, lr) = (step.eps as f32, step.lr as f32);
    launch!(device, "adamw_update", config, |args| {
        views.iter().for_each(|v| {
            args.arg(v);
        });
        outputs.iter_mut().for_each(|out| {
            args.arg(out);
        });
        args.arg(&n).arg(&beta1).arg(&one_minus_beta1).arg(&beta2).arg(&one_minus_beta2);
        args.arg(&inv_correction1).arg(&inv_correction2).arg(&eps).arg(&lr);
    })?;
    let shape = tensors[0].shape();
    Ok(outputs.map(|out| {
        let storage = Storage::Cuda(CudaStorage::wrap_cuda_slice(out, device.clone()));
        Tensor::from_storage(storage, shape.clone(), BackpropOp::none(), false)
    }))
}
