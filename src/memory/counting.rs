//! Counting heap bytes per thread, so that a CPU rank (a thread) can measure
//! what its activations hold.
//!
//! A binary opts in by installing the counting allocator:
//!
//! ```no_run
//! #[global_allocator]
//! static ALLOCATOR: workbook::memory::CountingAllocator = workbook::memory::CountingAllocator;
//! ```
//!
//! Without it [`thread_live_bytes`] is `None` and the FSDP ledger leaves
//! activations unmeasured. The count is of this thread's allocations minus its
//! frees, so it is only meaningful over a stretch of work in which the thread
//! frees what it allocated itself (a block's forward, say), not across a
//! collective whose buffers other ranks free.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicIsize, Ordering};

/// The system allocator, counting each thread's live bytes.
pub struct CountingAllocator;

static INSTALLED: AtomicBool = AtomicBool::new(false);

thread_local! {
    static LIVE: Cell<isize> = const { Cell::new(0) };
}

/// Whether [`process_peak_during`] is measuring: then every thread's
/// allocations also count in the process's totals below.
static COUNTING_PROCESS: AtomicBool = AtomicBool::new(false);
static PROCESS_LIVE: AtomicIsize = AtomicIsize::new(0);
static PROCESS_PEAK: AtomicIsize = AtomicIsize::new(0);

fn count(delta: isize) {
    // `try_with`: a thread being torn down still frees memory.
    let _ = LIVE.try_with(|live| live.set(live.get() + delta));
    if COUNTING_PROCESS.load(Ordering::Relaxed) {
        let now = PROCESS_LIVE.fetch_add(delta, Ordering::Relaxed) + delta;
        if delta > 0 {
            PROCESS_PEAK.fetch_max(now, Ordering::Relaxed);
        }
    }
}

/// Marks the allocator as installed. A load first, so that allocations after
/// the first only read the flag (a shared cache line) instead of writing it.
fn mark_installed() {
    if !INSTALLED.load(Ordering::Relaxed) {
        INSTALLED.store(true, Ordering::Relaxed);
    }
}

// SAFETY: every method forwards to `System` with the caller's arguments
// unchanged, so `System`'s guarantees hold; the counting touches only a
// thread-local integer and never allocates.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        mark_installed();
        count(layout.size() as isize);
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        mark_installed();
        count(layout.size() as isize);
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        count(-(layout.size() as isize));
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count(new_size as isize - layout.size() as isize);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

/// Bytes this thread has allocated and not freed, when the counting allocator is installed.
pub fn thread_live_bytes() -> Option<isize> {
    INSTALLED.load(Ordering::Relaxed).then(|| LIVE.with(Cell::get))
}

/// The most `work` had allocated at once beyond what was allocated before
/// it, on every thread of this process, with its result; `None` without
/// the counting allocator. Meaningful in a process that does nothing else
/// meanwhile (a rank of its own): a thread's own count cannot be, where
/// threads free what others allocated (thread ranks exchanging tensors).
pub fn process_peak_during<T>(work: impl FnOnce() -> T) -> (T, Option<u64>) {
    if !INSTALLED.load(Ordering::Relaxed) {
        return (work(), None);
    }
    PROCESS_LIVE.store(0, Ordering::Relaxed);
    PROCESS_PEAK.store(0, Ordering::Relaxed);
    COUNTING_PROCESS.store(true, Ordering::SeqCst);
    let out = work();
    COUNTING_PROCESS.store(false, Ordering::SeqCst);
    (out, Some(PROCESS_PEAK.load(Ordering::Relaxed).max(0) as u64))
}

/// What `work` leaves allocated on this thread (its result included), with the result.
pub fn held_after<T>(work: impl FnOnce() -> T) -> (T, Option<u64>) {
    let before = thread_live_bytes();
    let out = work();
    let held = before.zip(thread_live_bytes()).map(|(b, a)| (a - b).max(0) as u64);
    (out, held)
}
