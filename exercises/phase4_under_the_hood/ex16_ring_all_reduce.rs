//! # Exercise 16: ring all-reduce, from send and recv
//!
//! Every data-parallel step ends in an all-reduce of the gradients, and the
//! one NCCL and Gloo run on large tensors is the **ring**. The naive way —
//! everyone sends its whole tensor to rank 0, which adds and sends the sum
//! back — makes rank 0's link carry 2(N−1) tensors: the more ranks, the
//! slower. The ring keeps every link equally busy with a fixed amount:
//!
//! ```text
//! ranks in a ring, each sends right and receives from the left:
//!        0 ──▶ 1 ──▶ 2 ──▶ 3 ──▶ (back to 0)
//!
//! cut the tensor into N chunks c0 c1 c2 c3 (the same cut on every rank)
//!
//! reduce-scatter, N−1 steps: each rank sends one chunk and adds the one
//! that arrives into its own copy of it. The partial sum of chunk c starts
//! at rank c and gains one rank's part per hop:
//!   step 0: rank r sends chunk r        receives chunk r−1, adds
//!   step s: rank r sends chunk r−s      receives chunk r−s−1, adds
//!   after N−1 steps rank r holds the whole sum of chunk r+1
//!
//! all-gather, N−1 steps: the finished chunks go round once more, and
//! each rank overwrites its copy with what arrives.
//!   step s: rank r sends chunk r+1−s    receives chunk r−s, keeps it
//!
//! (chunk indices are mod N)
//! ```
//!
//! Each rank sends 2(N−1) chunks of P/N bytes: **2(N−1)/N · P**, under 2P
//! whatever N is. That is why NCCL reports "bus bandwidth" as the algorithm
//! bandwidth times 2(N−1)/N: it is what each link actually carries.
//!
//! The tensor's length need not divide by N: chunks then differ by one
//! element (`chunk_ranges` cuts them; every rank must cut the same way).
//!
//! Read first: Patarasuk and Yuan 2009, "Bandwidth optimal all-reduce
//! algorithms for clusters of workstations"; NCCL's "Collective Operations"
//! page; Gibiansky 2017, "Bringing HPC techniques to deep learning".
//! Guide: `guide/src/phase4/16-ring-all-reduce.md`. Test: `cargo test exercise_16`.

use candle_core::{Result, Tensor};

use crate::distributed::ProcessGroup;

/// The sum of every rank's `t`, on every rank, by the ring algorithm above,
/// using only `pg.send` and `pg.recv` (not `pg.all_reduce`).
///
/// `t` has any shape (the same on every rank); the result has `t`'s shape and
/// dtype. Pieces: `pg.rank()`, `pg.world_size()`, `t.flatten_all()`,
/// `crate::distributed::chunk_ranges(len, parts)`, `Tensor::narrow`,
/// `pg.send(&chunk, dst)` (returns before the chunk arrives, so every rank can
/// send before it receives), `pg.recv(&like, src)`, `Tensor::cat`, `reshape`.
pub fn ring_all_reduce(pg: &dyn ProcessGroup, t: &Tensor) -> Result<Tensor> {
    let _ = (&pg, &t);
    todo!("Exercise 16: Ring all-reduce from send and recv; run `cargo xtask hint 16`")
}
