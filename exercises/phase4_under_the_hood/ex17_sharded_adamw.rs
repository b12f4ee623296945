//! # Exercise 17: AdamW with its state sharded (ZeRO stages 1 and 2)
//!
//! Under DDP every rank holds the whole optimizer state: AdamW's two f32
//! moments are 8 of the 16 bytes per parameter, the largest share of the
//! model states. Yet after the all-reduce every rank computes the *same*
//! update for every parameter: N copies of the same work on N copies of the
//! same state. ZeRO's first insight removes the copies: rank r keeps the
//! moments of its own 1/N of the parameters and updates only that shard,
//! yet every rank must end the step holding all of the new parameters.
//!
//! The question is where a rank gets the average gradient of its shard
//! alone, without the whole average, and how every rank then gets every
//! updated shard. Look back at Exercise 16: what does each rank hold half-way
//! through the ring?
//!
//! The contract. `params` (P elements) is the same on every rank, `grad`
//! (P) is this rank's own. Both are cut into N equal shards of S = ⌈P/N⌉
//! elements, padded with zeros to N·S; rank r owns shard r. On return every
//! rank holds the same P new parameters: AdamW's step on the *average*
//! gradient, exactly as DDP would take it,
//!
//! ```text
//!   p ← p · (1 − lr · wd)
//!   m ← β₁ m + (1 − β₁) g,   v ← β₂ v + (1 − β₂) g²
//!   p ← p − lr · (m / (1 − β₁ᵗ)) / (sqrt(v / (1 − β₂ᵗ)) + ε)
//! ```
//!
//! while this rank keeps the moments of its S elements only, and sends no
//! more than DDP's all-reduce would.
//!
//! The contract has two halves, one function each. `update_shard` is what a
//! rank does with the shard it owns once it holds that shard's average
//! gradient: the formula above on S elements, with moments of S elements
//! that persist from step to step (ZeRO's memory saving). `step` is the
//! whole data-parallel step around it: where that average gradient comes
//! from, and how every rank ends with every updated shard (ZeRO's traffic).
//!
//! What each rank holds, N = 2, P = 5 (S = 3), first step, lr 0.1, no decay
//! (so each element moves by about lr against its gradient's sign):
//!
//! ```text
//!               params                      grad
//!   rank 0      [1, 2, 3, 4, 5]             [0.2, 0.4, -0.2, 0.6, 0.0]
//!   rank 1      [1, 2, 3, 4, 5]             [0.0, 0.4,  0.2, 0.2, 0.4]
//!   average                                 [0.1, 0.4,  0.0, 0.4, 0.2]
//!
//!   rank 0 owns elements 0..3: moments of 3 elements, its new shard [0.9, 1.9, 3.0]
//!   rank 1 owns elements 3..6: moments of 3 elements (the last one padding),
//!                              its new shard [3.9, 4.9, pad]
//!   both return [0.9, 1.9, 3.0, 3.9, 4.9]
//! ```
//!
//! Optimizer state per rank: 8Ψ/N bytes instead of 8Ψ. Traffic per rank: no
//! more than DDP's all-reduce sends, and without calling `pg.all_reduce`:
//! ZeRO-1 and ZeRO-2 save memory for free. (Stage 2 also keeps only the
//! shard of the gradient: it reduces each micro-batch's gradient as soon
//! as its backward ends and sums the shards, then calls `update_shard`.)
//!
//! Read first: Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward
//! Training Trillion Parameter Models", sections 5.1 and 7.1; PyTorch's
//! `ZeroRedundancyOptimizer`.
//! Guide: `guide/src/phase4/17-sharded-adamw.md`. Test: `cargo test exercise_17`.

use candle_core::{Result, Tensor};

use crate::distributed::ProcessGroup;
use crate::parallel::zero::ShardedAdamW;

impl ShardedAdamW {
    /// AdamW's step of this rank's shard, by the contract above: `param_shard`
    /// (S) is this rank's part of the parameters and `grad_shard` (S) the
    /// average gradient of exactly those elements. Returns the updated shard
    /// (S). The moments this rank keeps are those of its shard, created at
    /// its first step; ZeRO-2 calls it on the gradient shard it accumulated
    /// over the step's micro-batches, and FSDP on each unit's shard.
    ///
    /// Pieces: `self.moments` is an `Option<crate::train::Moments>`
    /// (`exp_avg`, `exp_avg_sq`; `Moments::zeros_like(&shard)`); `self.steps`
    /// counts steps; `self.weight_decay`; `self.config.update(t, lr,
    /// &decayed, &grad, moments)` is AdamW's update of already-decayed
    /// parameters, returning the new ones and the new moments.
    pub fn update_shard(&mut self, param_shard: &Tensor, grad_shard: &Tensor, lr: f64) -> Result<Tensor> {
        let _ = (&param_shard, &grad_shard, &lr);
        todo!("Exercise 17: AdamW with its state sharded; run `cargo xtask hint 17`")
    }

    /// One optimizer step of data-parallel AdamW with the state sharded, by
    /// the contract above. `params` (P) is the whole flat parameter vector, the same on
    /// every rank; `grad` (P) is this rank's gradient of its own data. Returns
    /// the updated parameters (P), the same on every rank; this rank's shard
    /// is updated by `update_shard`.
    ///
    /// Pieces: `pg.rank()`, `pg.world_size()`, `usize::div_ceil`,
    /// `Tensor::pad_with_zeros(0, 0, extra)`, `Tensor::narrow`, the collectives
    /// of `ProcessGroup` (each documented there with a picture) and the variants
    /// of `crate::distributed::ReduceOp`.
    pub fn step(&mut self, pg: &dyn ProcessGroup, params: &Tensor, grad: &Tensor, lr: f64) -> Result<Tensor> {
        let _ = (&pg, &params, &grad, &lr);
        todo!("Exercise 17: AdamW with its state sharded; run `cargo xtask hint 17`")
    }
}
