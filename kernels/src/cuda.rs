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
//! [`fused_enabled`]). The softmax and cross-entropy kernels read and write
//! f32 or bf16, with their statistics in f32 either way; SiLU and AdamW are
//! f32 only; other dtypes take candle's composed ops.
//! `scripts/cuda-on-cpu/check.py` runs the kernels' source on the CPU against
//! NumPy, for a change made without a GPU at hand. On an H200 every kernel,
//! the bf16 ones too, matched the CPU's (`scripts/gpu-check.sh run`).

use std::path::PathBuf;
use std::sync::OnceLock;

use candle_core::backend::{BackendDevice, BackendStorage};
use candle_core::cuda_backend::cudarc::driver::{CudaSlice, CudaView, DeviceRepr, LaunchConfig, PushKernelArg};
use candle_core::cuda_backend::cudarc::nvrtc;
use candle_core::cuda_backend::{CudaDType, CudaDevice, CudaStorage, WrapErr};
use candle_core::op::BackpropOp;
use candle_core::{bail, DType, Layout, Result, Shape, Storage, Tensor};
use half::bf16;

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

/// The kernels come as two NVRTC modules, one per element type of the row
/// kernels, so that a machine whose NVRTC cannot find CUDA's bf16 header
/// still compiles and runs the f32 ones. Each is the element type's
/// conversions to and from f32, then [`ROWS`], then its kernels; the lists
/// are read by `scripts/cuda-on-cpu/check.py` too.
const F32_MODULE: [&str; 3] = [F32_ELEMENTS, ROWS, F32_KERNELS];
const BF16_MODULE: [&str; 3] = [BF16_ELEMENTS, ROWS, BF16_KERNELS];

/// f32 elements are read and written as they are.
const F32_ELEMENTS: &str = r#"
__device__ float to_float(float v) { return v; }
__device__ void store(float* at, float v) { *at = v; }
"#;

/// bf16 elements are widened to f32 exactly, and narrowed with one rounding
/// to nearest even, as the CPU's `half::bf16::from_f32` does.
const BF16_ELEMENTS: &str = r#"
#include <cuda_bf16.h>
__device__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ void store(__nv_bfloat16* at, float v) { *at = __float2bfloat16(v); }
"#;

/// The softmax and cross-entropy kernels give each row a thread block, of any
/// size that is a multiple of 32. They are templates over the element type
/// `T` they read and write, and keep every statistic (max, sums, log-sum-exp)
/// in f32 whatever `T` is, as the CPU's kernels do: a bf16 sum over a
/// vocabulary would lose the small terms. `ROW_KERNELS(T, suffix)` makes them
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
// position j -inf first. The last pass computes each exponential again
// rather than reading back a stored one: in bf16 that would round twice.
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
    for (int j = threadIdx.x; j < width; j += blockDim.x)
        if (!keep || keep[j]) s += expf(scale * to_float(row[j]) - m);
    float inv = 1.0f / block_sum(s);
    for (int j = threadIdx.x; j < width; j += blockDim.x) {
        float e = (!keep || keep[j]) ? expf(scale * to_float(row[j]) - m) : 0.0f;
        store(out + j, e * inv);
    }
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

/// The bf16 row kernels; nothing else takes bf16.
const BF16_KERNELS: &str = r#"
ROW_KERNELS(__nv_bfloat16, bf16)
"#;

/// The f32 row kernels, and SiLU and AdamW, which are elementwise, with a
/// grid-stride loop, and f32 only.
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

/// One NVRTC module of the kernels: its name among the device's modules, the
/// suffix of its row kernels' names, its source.
#[derive(Clone, Copy)]
enum Module {
    F32,
    Bf16,
}

impl Module {
    fn name(self) -> &'static str {
        match self {
            Module::F32 => "workbook-fused-f32",
            Module::Bf16 => "workbook-fused-bf16",
        }
    }

    /// The name of row kernel `kernel` (e.g. `softmax_rows`) in this module.
    fn row_kernel(self, kernel: &str) -> String {
        let suffix = match self {
            Module::F32 => "f32",
            Module::Bf16 => "bf16",
        };
        format!("{kernel}_{suffix}")
    }

    /// The module's PTX, compiled once per process.
    fn ptx(self) -> Result<&'static str> {
        static PTX: [OnceLock<std::result::Result<String, String>>; 2] = [OnceLock::new(), OnceLock::new()];
        match PTX[self as usize].get_or_init(|| self.compile()) {
            Ok(ptx) => Ok(ptx),
            Err(e) => bail!("{e}"),
        }
    }

    /// NVRTC fuses a multiply and an add into one rounding by default
    /// (`fmad`); the CPU rounds each, so with fusion AdamW's GPU update would
    /// differ from the CPU's in the last bits. Division and square root stay
    /// IEEE-exact, denormals kept, as the CPU's. The bf16 module includes
    /// `cuda_bf16.h`, which NVRTC finds only on an include path.
    fn compile(self) -> std::result::Result<String, String> {
        let (source, include_paths) = match self {
            Module::F32 => (F32_MODULE.concat(), Vec::new()),
            Module::Bf16 => (BF16_MODULE.concat(), cuda_include_dir().into_iter().collect()),
        };
        let options = nvrtc::CompileOptions {
            fmad: Some(false),
            prec_div: Some(true),
            prec_sqrt: Some(true),
            ftz: Some(false),
            include_paths: include_paths.clone(),
            ..Default::default()
        };
        nvrtc::compile_ptx_with_opts(source, options).map(|ptx| ptx.to_src()).map_err(|e| match e {
            nvrtc::CompileError::CompileError { log, .. } if matches!(self, Module::Bf16) => {
                let log = log.to_string_lossy();
                if include_paths.is_empty() || log.contains("cuda_bf16") {
                    missing_bf16_header(include_paths.first(), &log)
                } else {
                    format!("NVRTC could not compile the workbook's bf16 CUDA kernels: {log}; set {SWITCH}=composed to use candle's ops")
                }
            }
            e => format!("NVRTC could not compile the workbook's fused CUDA kernels ({e}); set {SWITCH}=composed to use candle's ops"),
        })
    }
}

/// What to do when NVRTC cannot compile the bf16 kernels for want of CUDA's
/// bf16 header: NVRTC reads it from the toolkit's `include` folder, which a
/// machine with only CUDA's libraries lacks.
fn missing_bf16_header(include: Option<&String>, log: &str) -> String {
    let searched = match include {
        None => "found in none of $CUDA_HOME/include, $CUDA_PATH/include and /usr/local/cuda/include".to_string(),
        Some(include) => format!("read from {include}"),
    };
    format!(
        "NVRTC could not compile the workbook's bf16 kernels: they include CUDA's header `cuda_bf16.h` ({searched}). \
         Install the CUDA runtime's headers of NVRTC's CUDA version (a CUDA toolkit's `include` folder; for \
         CUDA 13, PyPI's `nvidia-cuda-runtime` puts them in site-packages/nvidia/cu13/include) and set CUDA_HOME \
         to the folder that holds `include/cuda_bf16.h`; or keep the tensors in f32, or set {SWITCH}=composed to \
         use candle's ops. NVRTC said: {log}"
    )
}

/// The folder where NVRTC should look for `cuda_bf16.h`: `include` under
/// $CUDA_HOME, $CUDA_PATH or /usr/local/cuda, the first that holds the
/// header. The header needs nothing beside it but CUDA's runtime headers:
/// NVRTC 13.0 compiled the bf16 module (on a machine without a GPU) with
/// only the `include` folder of PyPI's `nvidia-cuda-runtime` wheel.
fn cuda_include_dir() -> Option<String> {
    let roots = ["CUDA_HOME", "CUDA_PATH"].into_iter().filter_map(std::env::var_os).map(PathBuf::from);
    roots
        .chain([PathBuf::from("/usr/local/cuda")])
        .map(|root| root.join("include"))
        .find(|include| include.join("cuda_bf16.h").is_file())
        .map(|include| include.display().to_string())
}

/// An element type of the row kernels, and the module that holds its kernels.
trait Element: CudaDType + DeviceRepr {
    const MODULE: Module;
}

impl Element for f32 {
    const MODULE: Module = Module::F32;
}

impl Element for bf16 {
    const MODULE: Module = Module::Bf16;
}

/// Calls `$generic::<T>(...)` with `T` the [`Element`] of `$dtype`: the row
/// kernels read and write f32 or bf16.
macro_rules! by_element {
    ($dtype:expr, $op:expr, $generic:ident($($arg:expr),* $(,)?)) => {
        match $dtype {
            DType::F32 => $generic::<f32>($($arg),*),
            DType::BF16 => $generic::<bf16>($($arg),*),
            other => bail!("{}: the CUDA kernels take f32 or bf16 tensors, not {other:?}", $op),
        }
    };
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
fn view<'a, T: CudaDType>(storage: &'a CudaStorage, layout: &Layout, op: &str) -> Result<CudaView<'a, T>> {
    let (start, end) = contiguous_range(layout, op)?;
    Ok(storage.as_cuda_slice::<T>()?.slice(start..end))
}

fn width_of(layout: &Layout) -> usize {
    layout.dims().last().copied().unwrap_or(1).max(1)
}

fn as_i32(n: usize, what: &str) -> Result<i32> {
    i32::try_from(n).or_else(|_| bail!("workbook-fused: {what} of {n} does not fit the kernels' 32-bit sizes"))
}

/// Room on `device` for `len` results of a kernel.
fn output<T: DeviceRepr>(device: &CudaDevice, len: usize) -> Result<CudaSlice<T>> {
    // SAFETY: every kernel here writes each element of its output before anything reads it.
    unsafe { device.alloc::<T>(len) }
}

/// Runs kernel `$name` of [`Module`] `$module` on `$device`'s stream with
/// launch configuration `$config`; `$push` pushes its arguments onto `$args`
/// in the kernel's order. A macro, not a function: the pushed references
/// must outlive the builder, which borrows the function loaded here.
macro_rules! launch {
    ($device:expr, $module:expr, $name:expr, $config:expr, |$args:ident| $push:block) => {{
        let module: Module = $module;
        let func = $device.get_or_load_custom_func($name, module.name(), module.ptx()?)?;
        let mut $args = func.builder();
        $push
        // SAFETY: each call pushes its kernel's parameters in order and type,
        // and the kernels index only inside the rows `$config` gives them.
        unsafe { $args.launch($config) }.w()
    }};
}

/// `softmax(scale · x)` over the last dimension, with `mask` (Tq, Tk) u8
/// where given; f32 or bf16.
pub fn softmax(
    x: &CudaStorage,
    xl: &Layout,
    mask: Option<(&CudaStorage, &Layout)>,
    scale: f32,
) -> Result<(CudaStorage, Shape)> {
    by_element!(x.dtype(), "workbook-softmax", softmax_of(x, xl, mask, scale))
}

fn softmax_of<T: Element>(
    x: &CudaStorage,
    xl: &Layout,
    mask: Option<(&CudaStorage, &Layout)>,
    scale: f32,
) -> Result<(CudaStorage, Shape)> {
    let op = "workbook-softmax";
    let device = x.device();
    let (width, len) = (width_of(xl), xl.shape().elem_count());
    let x = view::<T>(x, xl, op)?;
    let mask = match mask {
        Some((storage, layout)) => Some((view::<u8>(storage, layout, op)?, layout.shape().elem_count() / width)),
        None => None,
    };
    // A null pointer tells the kernel that nothing is masked.
    let (null, queries) = (0u64, as_i32(mask.as_ref().map_or(1, |(_, queries)| *queries), "a mask")?);
    let width_arg = as_i32(width, "a row")?;
    let mut y = output::<T>(device, len)?;
    launch!(device, T::MODULE, &T::MODULE.row_kernel("softmax_rows"), rows_config(len / width, width, 256)?, |args| {
        args.arg(&x);
        match &mask {
            Some((allowed, _)) => args.arg(allowed),
            None => args.arg(&null),
        };
        args.arg(&mut y).arg(&width_arg).arg(&queries).arg(&scale);
    })?;
    Ok((CudaStorage::wrap_cuda_slice(y, device.clone()), xl.shape().clone()))
}

/// `scale · y ⊙ (dy − Σ y ⊙ dy)` over the last dimension; f32 or bf16.
pub fn softmax_backward(
    y: &CudaStorage,
    yl: &Layout,
    dy: &CudaStorage,
    dyl: &Layout,
    scale: f32,
) -> Result<(CudaStorage, Shape)> {
    by_element!(y.dtype(), "workbook-softmax-backward", softmax_backward_of(y, yl, dy, dyl, scale))
}

fn softmax_backward_of<T: Element>(
    y: &CudaStorage,
    yl: &Layout,
    dy: &CudaStorage,
    dyl: &Layout,
    scale: f32,
) -> Result<(CudaStorage, Shape)> {
    let op = "workbook-softmax-backward";
    let device = y.device();
    let (width, len) = (width_of(yl), yl.shape().elem_count());
    let (y, dy) = (view::<T>(y, yl, op)?, view::<T>(dy, dyl, op)?);
    let width_arg = as_i32(width, "a row")?;
    let mut dx = output::<T>(device, len)?;
    let config = rows_config(len / width, width, 256)?;
    launch!(device, T::MODULE, &T::MODULE.row_kernel("softmax_backward_rows"), config, |args| {
        args.arg(&y).arg(&dy).arg(&mut dx).arg(&width_arg).arg(&scale);
    })?;
    Ok((CudaStorage::wrap_cuda_slice(dx, device.clone()), yl.shape().clone()))
}

/// The mean over rows of `log Σ exp(logits) − logits[target]`, as a scalar
/// of the logits' dtype, f32 or bf16; the rows' losses and their mean are
/// f32 until the one rounding to bf16.
pub fn cross_entropy(
    logits: &CudaStorage,
    ll: &Layout,
    targets: &CudaStorage,
    tl: &Layout,
) -> Result<(CudaStorage, Shape)> {
    by_element!(logits.dtype(), "workbook-cross-entropy", cross_entropy_of(logits, ll, targets, tl))
}

fn cross_entropy_of<T: Element>(
    logits: &CudaStorage,
    ll: &Layout,
    targets: &CudaStorage,
    tl: &Layout,
) -> Result<(CudaStorage, Shape)> {
    let op = "workbook-cross-entropy";
    let device = logits.device();
    let (rows, classes) = ll.shape().dims2()?;
    let (logits, targets) = (view::<T>(logits, ll, op)?, view::<u32>(targets, tl, op)?);
    let (classes_arg, rows_arg) = (as_i32(classes, "a vocabulary")?, as_i32(rows, "a batch")?);
    let mut losses = output::<f32>(device, rows)?;
    let config = rows_config(rows, classes, 1024)?;
    launch!(device, T::MODULE, &T::MODULE.row_kernel("cross_entropy_rows"), config, |args| {
        args.arg(&logits).arg(&targets).arg(&mut losses).arg(&classes_arg);
    })?;
    let mut loss = output::<T>(device, 1)?;
    launch!(device, T::MODULE, &T::MODULE.row_kernel("mean"), rows_config(1, rows, 1024)?, |args| {
        args.arg(&losses).arg(&mut loss).arg(&rows_arg);
    })?;
    Ok((CudaStorage::wrap_cuda_slice(loss, device.clone()), Shape::from(())))
}

/// `(softmax(logits) − onehot(target)) · dloss / N`, row by row, for N rows,
/// with `dloss` of the logits' dtype, f32 or bf16.
pub fn cross_entropy_backward(
    logits: &CudaStorage,
    ll: &Layout,
    targets: &CudaStorage,
    tl: &Layout,
    dloss: (&CudaStorage, &Layout),
) -> Result<(CudaStorage, Shape)> {
    by_element!(
        logits.dtype(),
        "workbook-cross-entropy-backward",
        cross_entropy_backward_of(logits, ll, targets, tl, dloss)
    )
}

fn cross_entropy_backward_of<T: Element>(
    logits: &CudaStorage,
    ll: &Layout,
    targets: &CudaStorage,
    tl: &Layout,
    (dloss, gl): (&CudaStorage, &Layout),
) -> Result<(CudaStorage, Shape)> {
    let op = "workbook-cross-entropy-backward";
    let device = logits.device();
    let (rows, classes) = ll.shape().dims2()?;
    let (logits, targets) = (view::<T>(logits, ll, op)?, view::<u32>(targets, tl, op)?);
    let dloss = view::<T>(dloss, gl, op)?;
    let classes_arg = as_i32(classes, "a vocabulary")?;
    let mut dlogits = output::<T>(device, rows * classes)?;
    let config = rows_config(rows, classes, 1024)?;
    launch!(device, T::MODULE, &T::MODULE.row_kernel("cross_entropy_backward_rows"), config, |args| {
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
    let mut y = output::<f32>(device, len)?;
    launch!(device, Module::F32, "silu_forward", config, |args| {
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
    let mut dx = output::<f32>(device, len)?;
    launch!(device, Module::F32, "silu_backward", config, |args| {
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
    let mut outputs = [output::<f32>(device, len)?, output::<f32>(device, len)?, output::<f32>(device, len)?];
    // The kernel's constants, as the CPU's update_one rounds them to f32.
    let (beta1, beta2) = (step.beta1 as f32, step.beta2 as f32);
    let (one_minus_beta1, one_minus_beta2) = ((1.0 - step.beta1) as f32, (1.0 - step.beta2) as f32);
    let (inv_correction1, inv_correction2) = ((1.0 / step.correction1) as f32, (1.0 / step.correction2) as f32);
    let (eps, lr) = (step.eps as f32, step.lr as f32);
    launch!(device, Module::F32, "adamw_update", config, |args| {
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
