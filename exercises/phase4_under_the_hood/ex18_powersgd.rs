//! # Exercise 18: PowerSGD, a gradient all-reduced at low rank
//!
//! Data parallelism sends the whole gradient every step: for an (n, m)
//! weight, n·m numbers per rank. Gradients of large layers are close to low
//! rank, and PowerSGD (Vogels et al. 2019) sends a rank-r approximation
//! instead: two thin factors, (n + m)·r numbers. For a 768 × 3072 MLP weight
//! at r = 4 that is 15 360 numbers instead of 2 359 296, 150 times fewer.
//!
//! The approximation comes from one step of power iteration, done so that
//! every sum it needs is a plain all-reduce of a thin matrix:
//!
//! ```text
//! M  = grad + e          (n, m)  this rank's gradient plus its error feedback
//! P  = avg_ranks(M Q)    (n, r)  Q (m, r): last step's, or the seeded first one
//! P̂  = orthonormal columns of P
//! Q  = avg_ranks(Mᵀ P̂)   (m, r)  kept for the next step (warm start)
//! G̃  = P̂ Qᵀ              (n, m)  the rank-r estimate of the average gradient
//! e  = M − G̃                     what this rank's share lost, sent next step
//! ```
//!
//! Both all-reduces are linear in M, so averaging the ranks' products equals
//! the product of the averaged M: G̃ approximates the average gradient even
//! though no rank ever holds it. Error feedback makes the compression
//! unbiased over time: what one step drops is added to the next step's
//! gradient, so nothing is lost for good. The warm start turns the
//! once-per-step power iteration into a continuing one that tracks the
//! gradient's top subspace across steps.
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
    /// `grad` (n, m, f32), the same on every rank, by the scheme above; keeps
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
