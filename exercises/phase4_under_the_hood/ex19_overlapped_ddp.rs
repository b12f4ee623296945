//! # Exercise 19: DDP buckets, all-reduced while backward runs
//!
//! A DDP step all-reduces every gradient. Done after backward, that
//! communication adds to the step's time; done *during* backward, it hides
//! behind it. Backward produces gradients last layer first, and a layer's
//! gradient is final the moment backward leaves it, long before the first
//! layer's is. PyTorch's DDP (Li et al. 2020) therefore:
//!
//! - packs gradients, in the order they become ready, into **buckets** of
//!   about `bucket_cap_mb` (25 MB by default): one all-reduce per bucket, not
//!   per tensor, because each collective pays a fixed latency;
//! - starts a bucket's all-reduce **asynchronously** as soon as it is full,
//!   while backward goes on computing the next gradients;
//! - waits for all the buckets only when backward is done, before the step.
//!
//! ```text
//! backward:  grad L ─ grad L−1 ─ grad L−2 ─ grad L−3 ─ … ─ grad 1 │ wait
//! comm:                 [ bucket 0 all-reduce ]  [ bucket 1 ]  …  [last]│
//!                       ↑ started when bucket 0 filled, not at the end
//! ```
//!
//! The bucketing rule here: add each gradient, in the order it arrives, to
//! the open bucket; once the bucket holds `bucket_cap_bytes` or more, start
//! its all-reduce and open a new one; at the end start whatever is left.
//! Every rank sees the gradients in the same order, so every rank forms the
//! same buckets and issues the same all-reduces in the same order.
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
