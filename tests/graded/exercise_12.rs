//! Exercise 12: what each sharding strategy shards. The expected plans are
//! the ZeRO stages as the paper and PyTorch's docs define them. That the
//! runtime's measured memory follows from them is a whole-phase check
//! (`phase_3.rs`): it needs exercises 13 and 14 as well.

use rstest::rstest;
use workbook::parallel::fsdp::{ShardingPlan, ShardingStrategy};
use workbook::phase3_fsdp::sharding_plan;

use crate::support::mistake;

pub fn expected(strategy: ShardingStrategy) -> ShardingPlan {
    let (params, grads, optimizer_state, replicate_across_nodes) = match strategy {
        ShardingStrategy::NoShard => (false, false, false, false),
        ShardingStrategy::ShardGradOp => (false, true, true, false),
        ShardingStrategy::FullShard => (true, true, true, false),
        ShardingStrategy::HybridShard => (true, true, true, true),
    };
    ShardingPlan { params, grads, optimizer_state, replicate_across_nodes }
}

fn diagnose(strategy: ShardingStrategy, got: &ShardingPlan) -> &'static str {
    use ShardingStrategy::*;
    match strategy {
        ShardGradOp if got.params => mistake(12, "shard_grad_op_shards_params"),
        NoShard if got.optimizer_state => mistake(12, "no_shard_shards_optimizer"),
        FullShard | HybridShard if !got.grads => mistake(12, "full_shard_whole_grads"),
        HybridShard if !got.replicate_across_nodes => mistake(12, "hybrid_not_replicated"),
        _ if got.replicate_across_nodes => "only HYBRID_SHARD replicates across nodes",
        _ => "see the table at the top of the exercise file",
    }
}

#[rstest]
fn each_strategy_shards_what_its_zero_stage_shards(
    #[values(
        ShardingStrategy::FullShard,
        ShardingStrategy::ShardGradOp,
        ShardingStrategy::NoShard,
        ShardingStrategy::HybridShard
    )]
    strategy: ShardingStrategy,
) {
    let got = sharding_plan(strategy);
    let want = expected(strategy);
    assert!(got == want, "{strategy}: got {got:?}\n expected {want:?}\nLikely cause: {}.", diagnose(strategy, &got));
}
