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
//! strategy        ZeRO   parameters  gradients  optimizer state   model states per rank
//! NO_SHARD        0      whole       whole      whole             16Ψ
//! SHARD_GRAD_OP   2      whole       sharded    sharded           2Ψ + 14Ψ/N
//! FULL_SHARD      3      sharded     sharded    sharded           16Ψ/N
//! HYBRID_SHARD    3 within a node, replicated across nodes
//! ```
//!
//! The price is communication: DDP's all-reduce of the gradients moves 2Ψ per
//! step; stage 2 replaces it with a reduce-scatter (Ψ) and an all-gather of the
//! updated parameters (Ψ); stage 3 all-gathers the parameters before forward
//! and again before backward and reduce-scatters the gradients: 3Ψ.
//!
//! Read first: Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward
//! Training Trillion Parameter Models", sections 5 and 7; PyTorch's
//! `ShardingStrategy` documentation.
//! Guide: `guide/src/phase3/12-sharding-strategy.md`. Test: `cargo test exercise_12`.

use crate::parallel::fsdp::{ShardingPlan, ShardingStrategy};

/// What `strategy` divides across the ranks.
///
/// Return a [`ShardingPlan`] with `params`, `grads` and `optimizer_state` set
/// to whether each is sharded, and `replicate_across_nodes` true only for
/// HYBRID_SHARD (which shards like FULL_SHARD within each node).
/// `ShardingPlan::zero(stage)` builds the plan of ZeRO stage 0 to 3.
pub fn sharding_plan(strategy: ShardingStrategy) -> ShardingPlan {
    let _ = &strategy;
    todo!("Exercise 12: Sharding strategy; run `cargo xtask hint 12`")
}
