//! The allocator's settings for training: keep freed memory for reuse.

/// Keeps freed heap memory in the process for the next allocation instead of
/// handing it back to the operating system.
///
/// A training step allocates and frees the same tensors every step, megabytes
/// each. glibc's malloc serves such blocks with fresh `mmap`s and unmaps them
/// on free, so each step page-faults its activations and gradients in again:
/// on the tiny config that was a third of a single-process step. Raising the
/// mmap threshold to its maximum (32 MiB) and the trim threshold to 1 GiB lets
/// freed blocks be reused. Blocks above 32 MiB (GPT-2's head gradient, a
/// gradient bucket on its way through the process backend) would still be
/// mmapped each time, so mmap is not used at all: all-reducing 256 MB between
/// two processes went from 0.6 to 1.3 GB/s. Other platforms' allocators are
/// left as they are.
pub fn keep_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes malloc's parameters; called before threads allocate.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
        libc::mallopt(libc::M_MMAP_MAX, 0);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 1 << 30);
    }
}

/// The environment variable that, set to `1`, turns on
/// [`keep_freed_gpu_memory`]. Opt-in until it has run on a GPU.
pub const GPU_POOL_SWITCH: &str = "WORKBOOK_CUDA_KEEP_FREED";

/// Keeps memory that tensors on `device` free in CUDA's pool for the next
/// allocation instead of handing it back to the driver, when
/// [`GPU_POOL_SWITCH`] is `1`; does nothing on other devices.
///
/// candle allocates every tensor with `cuMemAllocAsync` from the GPU's default
/// memory pool, whose release threshold is 0: at every synchronisation (each
/// copy of a loss to the host) the pool returns all freed memory, and the
/// next micro-batch maps its activations in again, gigabytes at GPT-2's
/// shape. PyTorch's caching allocator keeps them. A threshold of "everything"
/// keeps them here too; the memory stays this process's until it exits.
pub fn keep_freed_gpu_memory(device: &candle_core::Device) -> candle_core::Result<()> {
    if !std::env::var(GPU_POOL_SWITCH).is_ok_and(|value| value == "1") {
        return Ok(());
    }
    match device {
        #[cfg(feature = "cuda")]
        candle_core::Device::Cuda(gpu) => keep_in_pool(gpu),
        _ => Ok(()),
    }
}

#[cfg(feature = "cuda")]
fn keep_in_pool(gpu: &candle_core::CudaDevice) -> candle_core::Result<()> {
    use candle_core::cuda_backend::cudarc::driver::{result, sys};
    use candle_core::cuda_backend::WrapErr;

    let context = gpu.cuda_stream().context().clone();
    if !context.has_async_alloc() {
        return Ok(());
    }
    let mut everything = u64::MAX;
    // SAFETY: the device handle comes from a live context; the attribute takes a u64.
    unsafe {
        let pool = result::device::get_default_mem_pool(context.cu_device()).w()?;
        let attribute = sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD;
        sys::cuMemPoolSetAttribute(pool, attribute, (&mut everything as *mut u64).cast()).result().w()?;
    }
    Ok(())
}
