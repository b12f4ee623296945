//! Exercise 12: what each sharding strategy shards. The expected plans are
//! the ZeRO stages as the paper and PyTorch's docs define them. That the
//! runtime's measured memory follows from them is a whole-phase check
//! (`phase_3.rs`): it needs exercises 13 and 14 as well.

use rstest::rstest;
use workbook::parallel::fsdp::{ShardingPlan, ShardingStrategy};
use workbook::phase3_fsdp::sharding_plan;

use crate::support::{cause, field_differences, mistake};

pub fn expected(strategy: ShardingStrategy) -> ShardingPlan {
    let (params, grads, optimizer_state, replicate_across_nodes) = match strategy {
        ShardingStrategy::NoShard => (false, false, false, false),
        ShardingStrategy::ShardGradOp => (false, true, true, false),
        ShardingStrategy::FullShard => (true, true, true, false),
        ShardingStrategy::HybridShard => (true, true, true, true),
    };
    ShardingPlan { params, grads, optimizer_state, replicate_across_nodes }
}

/// The mistake `got` shows for `strategy`, if it is exactly that mistake's
/// plan: the right plan with the one field the mistake gets wrong.
fn diagnose(strategy: ShardingStrategy, got: &ShardingPlan) -> Option<&'static str> {
    use ShardingStrategy::*;
    let want = expected(strategy);
    let (id, mistaken) = match strategy {
        ShardGradOp => ("shard_grad_op_shards_params", ShardingPlan { params: true, ..want }),
        NoShard => ("no_shard_shards_optimizer", ShardingPlan { optimizer_state: true, ..want }),
        FullShard => ("full_shard_whole_grads", ShardingPlan { grads: false, ..want }),
        HybridShard if got.grads => ("hybrid_not_replicated", ShardingPlan { replicate_across_nodes: false, ..want }),
        HybridShard => ("full_shard_whole_grads", ShardingPlan { grads: false, ..want }),
    };
    (*got == mistaken).then(|| mistake(12, id))
}

/// The fields in which two plans differ.
fn differences(got: &ShardingPlan, want: &ShardingPlan) -> String {
    field_differences(&[
        ("params", got.params, want.params),
        ("grads", got.grads, want.grads),
        ("optimizer_state", got.optimizer_state, want.optimizer_state),
        ("replicate_across_nodes", got.replicate_across_nodes, want.replicate_across_nodes),
    ])
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
    assert!(got == want, "{strategy}: {}.{}", differences(&got, &want), cause(diagnose(strategy, &got)));
}
