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
