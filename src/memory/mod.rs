//! Heap memory: what a rank's work holds, and the allocator settings training wants.
//!
//! - [`footprint`]: what a run needs at the least, before it allocates.
//! - [`counting`]: a global allocator that counts each thread's live bytes, so
//!   the FSDP ledger can measure what activations hold.
//! - [`tuning`]: glibc malloc settings that keep a step's freed buffers for the
//!   next step instead of returning them to the operating system, and that
//!   return the large ones again where memory matters more (FSDP).

pub mod counting;
pub mod footprint;
pub mod tuning;

pub use counting::{held_after, process_peak_during, thread_live_bytes, CountingAllocator};
pub use footprint::{available_memory, Footprint, RunShape};
pub use tuning::{keep_freed_memory, release_freed_memory, return_large_blocks};
