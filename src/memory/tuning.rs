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

/// After [`keep_freed_memory`], maps blocks of [`LARGE_BLOCK`] bytes and more
/// afresh again and returns them to the operating system when freed;
/// smaller blocks are still kept for reuse.
///
/// For a sharded run, whose point is memory. Its largest tensors (a gathered
/// unit, the vocabulary's embedding and head gradients, the root unit's flat
/// gradient, a reduce-scatter's buffers) come and go within each
/// micro-batch, in sizes that differ, between tensors that stay: kept in the
/// heap, they leave holes the next ones do not fit, and the heap grows from
/// micro-batch to micro-batch. At GPT-2 124M's shape under FSDP on 2 ranks a
/// rank was 3.2 GiB resident for 2.1 GiB allocated at most; with this, 2.6.
/// The price is the page faults of each large block, each time it is made.
pub fn return_large_blocks() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes malloc's parameters.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, LARGE_BLOCK as i32);
        // glibc's default maximum number of mapped blocks.
        libc::mallopt(libc::M_MMAP_MAX, 65_536);
    }
}

/// The size from which [`return_large_blocks`] maps a block: below a GPT-2
/// block's MLP weight (768 × 3072 f32, 9 MiB), so that a gathered block, its
/// parameters, their gradients and its shards are all returned when freed.
pub const LARGE_BLOCK: usize = 4 << 20;

/// Hands the free pages inside the heap back to the operating system.
///
/// For a sharded run, after each step. Its small blocks (the optimizer's
/// pieces, a block's activations) are freed between blocks that stay, so
/// the heap cannot shrink from its top, and the freed pages stay resident:
/// at GPT-2 124M's shape under FSDP on 2 ranks, 0.8 GiB of them after a
/// step, on top of which the next step's large blocks were mapped afresh.
pub fn release_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only returns free pages; it touches no live allocation.
    unsafe {
        libc::malloc_trim(0);
    }
}
