//! Fused CPU kernels, each with its own backward pass, for the ops that candle
//! composes from many passes.
//!
//! candle builds `softmax`, `silu` and `cross_entropy` out of elementwise ops
//! and reductions: each one a pass over memory, an allocation, and in backward
//! a few more ops per node. On a CPU that dominates a small model's step (the
//! attention softmax alone took more than half of attention's time). Each kernel
//! here is one pass forward and one pass backward over rows of the last
//! dimension, computed in f32 whatever the tensor's dtype, spread over the
//! kernel threads. They compute the same functions as their candle
//! counterparts (the tests compare them), so an exercise may use either. On
//! an NVIDIA GPU, `softmax`, `scaled_masked_softmax`, `cross_entropy` (f32
//! and bf16, never yet run on a GPU in bf16) and `silu` (f32) have CUDA
//! kernels of the same shape, and `linear`,
//! `split_heads`, `merge_heads` and `scale_channels` are one node there too,
//! through cuBLAS and strided copies, `adamw_update` is one kernel, and
//! `sum_of_squares` and `all_finite` read a whole list of tensors back at
//! once (`cuda`; `WORKBOOK_CUDA_KERNELS=composed` turns the kernels off);
//! every other device falls back to candle's composed ops.
//! `scaled_masked_softmax` also folds attention's scaling and causal mask into
//! the softmax's pass.
//! `linear` makes a linear layer one node of the graph instead of three, and
//! `split_heads` / `merge_heads` do the same for attention's head reshapes.
//! `scale_channels` multiplies by a per-channel weight with a cheap gradient
//! for the weight (candle sums a broadcast's gradient element by element).
//! `adamw_update` is AdamW's update of a parameter and its moments in one
//! pass instead of a dozen (no backward: it is the optimizer's). It and
//! [`add`], [`scale`], [`sum_of_squares`] and [`all_finite`] are the passes
//! between the model's passes, spread
//! over threads of their own when [`set_threads_between_passes`] gave some.
//! [`buffers`] turns tensors into bytes and adds byte buffers elementwise, for
//! the communication backend that sends tensors over sockets.
//!
//! The workbook re-exports this crate as `workbook::kernels`. It is a crate of
//! its own so that it is compiled with optimisations even in the quick test
//! builds (the workspace `Cargo.toml` says so): unoptimised, these loops run
//! several times slower.

mod adamw;
mod backward;
pub mod buffers;
mod cross_entropy;
#[cfg(feature = "cuda")]
pub mod cuda;
mod elementwise;
mod exp;
mod heads;
mod linear;
mod rows;
mod scale_channels;
mod silu;
mod softmax;

pub use adamw::{adamw_update, AdamWStep};
pub use backward::with_backward;
pub use cross_entropy::cross_entropy;
pub use elementwise::{add, all_finite, scale, set_threads_between_passes, sum_of_squares};
pub use exp::exp;
pub use heads::{merge_heads, split_heads};
pub use linear::linear;
pub use scale_channels::scale_channels;
pub use silu::silu;
pub use softmax::{scaled_masked_softmax, softmax};

use candle_core::{DType, Device, Tensor};

/// The dtypes of the CUDA kernels that work on rows (softmax and
/// cross-entropy); SiLU's is f32 only.
const ROW_DTYPES: &[DType] = &[DType::F32, DType::BF16];

/// Whether an op on `t` runs the fused kernel: always on the CPU; on an
/// NVIDIA GPU unless switched off, when its CUDA kernels take t's dtype
/// (one of `gpu_dtypes`).
fn runs_fused(t: &Tensor, gpu_dtypes: &[DType]) -> bool {
    matches!(t.device(), Device::Cpu) || (on_gpu_path(t) && gpu_dtypes.contains(&t.dtype()))
}

/// Whether `t` is on an NVIDIA GPU with the workbook's ops switched on there
/// ([`cuda::fused_enabled`]), rather than candle's composed ones.
fn on_gpu_path(t: &Tensor) -> bool {
    match t.device() {
        #[cfg(feature = "cuda")]
        Device::Cuda(_) => cuda::fused_enabled(),
        _ => false,
    }
}
