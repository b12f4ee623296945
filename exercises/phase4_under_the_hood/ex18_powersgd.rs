//! # Exercise 18: PowerSGD, a gradient all-reduced at low rank
//!
//! Data parallelism sends the whole gradient every step: for an (n, m)
//! weight, n·m numbers per rank. Gradients of large layers are close to low
//! rank, and PowerSGD (Vogels et al. 2019) sends a rank-r approximation
//! instead: two thin factors, (n + m)·r numbers. For a 768 × 3072 MLP weight
//! at r = 4 that is 15 360 numbers instead of 2 359 296, 150 times fewer.
//!
//! The approximation is one step of **power iteration**, the textbook way to
//! find a matrix's top singular subspace. On one (n, m) matrix M, from an
//! (m, r) starting guess Q:
//!
//! ```text
//!   P̂ = orthonormal columns of M Q        (n, r)
//!   Q' = Mᵀ P̂                              (m, r)
//!   M ≈ P̂ Q'ᵀ                              the rank-r estimate
//! ```
//!
//! Started from last step's Q' (a **warm start**), the steps of training
//! continue one power iteration that tracks the gradient's top subspace.
//!
//! The distributed question is yours: the estimate must be that of the
//! *average* over ranks of M, but no rank may hold that average (sending
//! it is what PowerSGD avoids); only thin (n, r) or (m, r) matrices may
//! travel, in all-reduces, identically on every rank. Matrix products are
//! linear: the average of the ranks' A·X is (average of the A)·X when X is
//! the same on every rank.
//!
//! **Error feedback**: each rank adds to its gradient what its compression
//! lost the step before, M = grad + e, and keeps e = M − (the estimate) for
//! the next step, so that what one step drops is sent later, not lost.
//!
//! The contract, on every rank: the same rank-r estimate of the average of
//! M over ranks (n, m); `self.q` holds the (m, r) factor the next step
//! starts from, the same on every rank; `self.error` this rank's (n, m)
//! error. Shapes for N = 2 ranks, a (4, 3) gradient, r = 1: each rank sends
//! a (4, 1) and a (3, 1) matrix, 7 numbers, where the gradient has 12.
//!
//! Read first: Vogels, Karimireddy and Jaggi 2019, "PowerSGD: Practical
//! Low-Rank Gradient Compression for Distributed Optimization", algorithm 1;
//! PyTorch's `powerSGD_hook` (DDP communication hooks).
//! Guide: `guide/src/phase4/18-powersgd.md`. Test: `cargo test exercise_18`.

use candle_core::{Result, Tensor};

use crate::distributed::ProcessGroup;
use crate::parallel::powersgd::PowerSgd;

impl PowerSgd {
    /// The rank-`self.approx_rank` estimate of the average over ranks of
    /// `grad` (n, m, f32), the same on every rank, by the contract above; keeps
    /// Q (m, r) in `self.q` and this rank's error (n, m) in `self.error`.
    ///
    /// Pieces: `self.error` and `self.q` (`Option<Tensor>`, `None` at the first
    /// step), `self.initial_q(m, device)`, `Tensor::matmul`, `.t()`,
    /// `pg.all_reduce(&t, ReduceOp::Avg)` (`crate::distributed::ReduceOp`),
    /// `crate::parallel::powersgd::orthonormal_columns(&p)`.
    pub fn all_reduce(&mut self, pg: &dyn ProcessGroup, grad: &Tensor) -> Result<Tensor> {
        let _ = (&pg, &grad);
        todo!("Exercise 18: PowerSGD gradient compression; run `cargo xtask hint 18`")
    }
}
