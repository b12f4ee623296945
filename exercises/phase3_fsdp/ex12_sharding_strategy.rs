//! # Exercise 12: what each sharding strategy shards
//!
//! Training with AdamW holds, per parameter, the parameter itself, its
//! gradient and two optimizer moments (plus f32 master weights under mixed
//! precision): the ZeRO paper's "model states", 16 bytes per parameter with
//! mixed-precision Adam. Data parallelism replicates all of it on every rank.
//! ZeRO's insight: each rank only *updates* 1/N of the parameters, so it only
//! needs 1/N of the optimizer state (stage 1), of the reduced gradients
//! (stage 2), and — if it gathers them just in time — of the parameters (stage 3).
//!
//! ```text
//! ZeRO stage   sharded across the N ranks                 model states per rank
//! 0 (DDP)      nothing                                     16Ψ
//! 1            optimizer state                             4Ψ + 12Ψ/N
//! 2            optimizer state, gradients                  2Ψ + 14Ψ/N
//! 3            optimizer state, gradients, parameters      16Ψ/N
//! ```
//!
//! Worked example: Ψ = 1 billion parameters in mixed precision on N = 8 ranks
//! holds 16 GB per rank at stage 0, 4 + 1.5 = 5.5 GB at stage 1,
//! 2 + 1.75 = 3.75 GB at stage 2 and 2 GB at stage 3.
//!
//! PyTorch FSDP names four strategies. Each is defined by what a rank does
//! with a unit during a step; which ZeRO stage that amounts to is yours to
//! read off:
//! - FULL_SHARD: a unit's parameters are all-gathered before its forward and
//!   freed after it, all-gathered again before its backward and freed after
//!   that; the gradients are reduce-scattered after backward, and each rank
//!   runs the optimizer on its own 1/N of the elements.
//! - SHARD_GRAD_OP: the parameters are gathered before forward and stay whole
//!   through backward, with no gather in between. This runtime keeps them
//!   whole between steps too, refreshed by an all-gather after the optimizer
//!   step (PyTorch frees them after backward instead). Each micro-batch's
//!   gradient is reduce-scattered as soon as backward produces it, and each
//!   rank runs the optimizer on its own 1/N of the elements.
//! - NO_SHARD: the gradients are all-reduced after backward, and every rank
//!   runs the optimizer on every element, as DDP does.
//! - HYBRID_SHARD: among the ranks of one node, FULL_SHARD; across nodes,
//!   each node holds a replica of that sharded model, as DDP holds replicas.
//!
//! A [`ShardingPlan`] field is true when that part is divided across the
//! ranks: `params` means no whole copy lives between uses (gathered for each
//! use, freed after); `grads` means a rank keeps only the reduced gradient of
//! its shard; `optimizer_state` means a rank keeps only its shard's f32
//! master weights and moments. Only the ZeRO stages are valid plans
//! (`ShardingPlan::validate`). For each strategy ask: what does a rank hold
//! between two uses of a unit, which gradient does it keep, and which
//! elements does its optimizer touch?
//!
//! The price is communication, counted per step in elements (the ring's
//! (N − 1)/N dropped): DDP's all-reduce of the gradients moves 2Ψ; stages 1
//! and 2 move the same 2Ψ, with no all-reduce (Exercise 17 works out how);
//! stage 3 all-gathers the parameters before forward and again before
//! backward and reduce-scatters the gradients: 3Ψ.
//!
//! Read first: Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward
//! Training Trillion Parameter Models", sections 5 and 7; PyTorch's
//! `ShardingStrategy` documentation.
//! Guide: `guide/src/phase3/12-sharding-strategy.md`. Test: `cargo test exercise_12`.

use crate::parallel::fsdp::{ShardingPlan, ShardingStrategy};

/// What `strategy` divides across the ranks.
///
/// A [`ShardingPlan`] with `params`, `grads` and `optimizer_state` set to
/// whether each is sharded, and `replicate_across_nodes` true only for
/// HYBRID_SHARD. `ShardingPlan::zero(stage)` builds the plan of ZeRO stage
/// 0 to 3, not replicated.
pub fn sharding_plan(strategy: ShardingStrategy) -> ShardingPlan {
    let _ = &strategy;
    todo!("Exercise 12: Sharding strategy; run `cargo xtask hint 12`")
}
