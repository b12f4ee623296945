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
//!        0 ──▶ 1 ──▶ 2 ──▶ (back to 0)
//!
//! cut the tensor into N chunks, the same cut on every rank; N = 3 and
//! 7 elements give chunks a (3 elements), b (2) and c (2). Rank r starts
//! with its own a_r b_r c_r. What each rank holds of the sum after each step:
//!
//!                 rank 0          rank 1          rank 2
//! start           a0  b0  c0      a1  b1  c1      a2  b2  c2
//! reduce-scatter: each step, one chunk per rank goes right and is added there
//!   step 1        a0  b0  c02     a01 b1  c1      a2  b12 c2
//!   step 2        a0  b012 c02    a01 b1  c012    a012 b12 c2
//! all-gather: finished chunks go right and replace the copy there
//!   step 3        a012 b012 c02   a01 b012 c012   a012 b12 c012
//!   step 4        a012 b012 c012  a012 b012 c012  a012 b012 c012
//!
//! (a01 = a0 + a1, and so on.) After the reduce-scatter every rank holds one
//! chunk whole; after the all-gather, all of them.
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
/// using only point-to-point messages (not `pg.all_reduce`).
///
/// `t` has any shape (the same on every rank); the result has `t`'s shape and
/// dtype. Pieces: `pg.rank()`, `pg.world_size()`, `t.flatten_all()`,
/// `crate::distributed::chunk_ranges(len, parts)`, `Tensor::narrow`,
/// `pg.send_recv(&chunk, dst, &like, src)` (sends one tensor and receives
/// another in one exchange that waits for neither: it works on every
/// backend, NCCL included, where a lone `send` waits for its receive; the
/// CPU backends also take `pg.send(&chunk, dst)` then `pg.recv(&like, src)`),
/// `Tensor::cat`, `reshape`.
pub fn ring_all_reduce(pg: &dyn ProcessGroup, t: &Tensor) -> Result<Tensor> {
    let _ = (&pg, &t);
    todo!("Exercise 16: Ring all-reduce from send and recv; run `cargo xtask hint 16`")
}
