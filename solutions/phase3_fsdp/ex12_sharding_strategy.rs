//! Reference solution of exercise 12: what each sharding strategy shards.

use crate::parallel::fsdp::{ShardingPlan, ShardingStrategy};

pub fn sharding_plan(strategy: ShardingStrategy) -> ShardingPlan {
    match strategy {
        ShardingStrategy::NoShard => ShardingPlan::zero(0),
        ShardingStrategy::ShardGradOp => ShardingPlan::zero(2),
        ShardingStrategy::FullShard => ShardingPlan::zero(3),
        ShardingStrategy::HybridShard => ShardingPlan { replicate_across_nodes: true, ..ShardingPlan::zero(3) },
    }
}
