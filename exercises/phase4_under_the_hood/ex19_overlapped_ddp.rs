//! # Exercise 19: DDP buckets, all-reduced while backward runs
//!
//! A DDP step all-reduces every gradient. Done after backward, that
//! communication adds to the step's time; done *during* backward, it hides
//! behind it. Backward produces gradients last layer first, and a layer's
//! gradient is final the moment backward leaves it, long before the first
//! layer's is. PyTorch's DDP (Li et al. 2020) packs gradients, in the order
//! they become ready, into **buckets** of about `bucket_cap_mb` (25 MiB by
//! default), one all-reduce per bucket rather than per tensor, because each
//! collective pays a fixed latency; and it runs those all-reduces
//! **asynchronously**, while backward goes on.
//!
//! The contract the tests check:
//!
//! - **Buckets.** Consecutive gradients, in arrival order, fill one bucket;
//!   a bucket closes once it holds `bucket_cap_bytes` or more. What is left
//!   at the end is a last, smaller bucket. One `ReduceOp::Avg` all-reduce
//!   per bucket.
//! - **Overlap.** Each bucket's all-reduce is under way while backward
//!   computes the gradients after it, and backward is never held up by the
//!   network: between two gradients, nothing blocks on a collective.
//! - **Output.** Every gradient averaged over the ranks, with its name and
//!   shape, in the order it came.
//!
//! Every rank sees the gradients in the same order, so every rank forms the
//! same buckets and issues the same all-reduces in the same order.
//!
//! A worked example: four gradients, ready in the order a, b, c, d, of 3, 2,
//! 6 and 1 MB, with a 5 MB cap. a + b is 5 MB, so {a, b} is full with b; c
//! alone is 6 MB, so {c} is full with c; {d} is what is left at the end.
//!
//! ```text
//! backward │ grad a │ grad b │ grad c │ grad d │       │
//! comm     │        │        │ {a, b} │ {c}    │ {d}   │
//!                                              ↑ backward ends
//! ```
//!
//! {a, b} travels while c is computed and {c} while d is; only {d}, 1 MB of
//! the 12, is not hidden behind backward. When may each bucket's result be
//! read, and what must you still know then to hand back named, shaped
//! gradients?
//!
//! Read first: Li et al. 2020, "PyTorch Distributed: Experiences on
//! Accelerating Data Parallel Training", sections 3.2 and 4.2 (gradient
//! bucketing, overlapping computation with communication); PyTorch's DDP
//! notes (`bucket_cap_mb`).
//! Guide: `guide/src/phase4/19-overlapped-ddp.md`. Test: `cargo test exercise_19`.

use candle_core::{Result, Tensor};

use crate::distributed::ProcessGroup;

/// Averages over the ranks every gradient `grads` yields, in buckets as
/// above, each all-reduced as soon as it is full while `grads` goes on
/// producing the next (pulling the next item of `grads` is backward
/// computing it). Returns every gradient averaged, with its name, in the
/// order they came; each keeps its shape.
///
/// Pieces: `Tensor::flatten_all`, `Tensor::cat`, `pg.all_reduce_async(&flat,
/// ReduceOp::Avg)` (returns a `crate::distributed::Work` at once; its `wait()`
/// gives the result), `Tensor::narrow`, `reshape`, `std::mem::take`.
/// `t.elem_count() * t.dtype().size_in_bytes()` is a tensor's size in bytes.
pub fn overlapped_all_reduce(
    pg: &dyn ProcessGroup,
    grads: impl Iterator<Item = (String, Tensor)>,
    bucket_cap_bytes: usize,
) -> Result<Vec<(String, Tensor)>> {
    let _ = (&pg, &grads, &bucket_cap_bytes);
    todo!("Exercise 19: DDP buckets that overlap with backward; run `cargo xtask hint 19`")
}
