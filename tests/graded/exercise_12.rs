//! Exercise 12: what each sharding strategy shards. The expected plans are
//! the ZeRO stages as the paper and PyTorch's docs define them. That the
//! runtime's measured memory follows from them is a whole-phase check
//! (`phase_3.rs`): it needs exercises 13 and 14 as well.

use rstest::rstest;
use workbook::parallel::fsdp::{ShardingPlan, ShardingStrategy};
use workbook::phase3_fsdp::sharding_plan;

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
        ShardGradOp if got.params => {
            "SHARD_GRAD_OP keeps the parameters whole between uses; sharding them too is FULL_SHARD"
        }
        NoShard if got.optimizer_state => {
            "sharding only the optimizer state is ZeRO-1; NO_SHARD is plain DDP and shards nothing"
        }
        FullShard | HybridShard if !got.grads => {
            "a rank that holds 1/N of the parameters only needs the reduced gradient of that 1/N"
        }
        HybridShard if !got.replicate_across_nodes => {
            "HYBRID_SHARD shards within a node and replicates across nodes: set replicate_across_nodes"
        }
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
