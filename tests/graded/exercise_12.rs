//! Exercise 12: what each sharding strategy shards. The expected plans are
//! the ZeRO stages as the paper and PyTorch's docs define them; the memory
//! check runs two CPU ranks and reads each rank's ledger.

use rstest::rstest;
use workbook::fsdp::{Precision, ShardingPlan, ShardingStrategy};
use workbook::phase3_fsdp::sharding_plan;

use crate::fsdp_runs::{fsdp_run, train_config};

fn expected(strategy: ShardingStrategy) -> ShardingPlan {
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
        ShardGradOp if got.params => "SHARD_GRAD_OP keeps the parameters whole between uses; sharding them too is FULL_SHARD",
        NoShard if got.optimizer_state => "sharding only the optimizer state is ZeRO-1; NO_SHARD is plain DDP and shards nothing",
        FullShard | HybridShard if !got.grads => "a rank that holds 1/N of the parameters only needs the reduced gradient of that 1/N",
        HybridShard if !got.replicate_across_nodes => "HYBRID_SHARD shards within a node and replicates across nodes: set replicate_across_nodes",
        _ if got.replicate_across_nodes => "only HYBRID_SHARD replicates across nodes",
        _ => "see the table at the top of the exercise file",
    }
}

#[rstest]
fn each_strategy_shards_what_its_zero_stage_shards(
    #[values(ShardingStrategy::FullShard, ShardingStrategy::ShardGradOp, ShardingStrategy::NoShard, ShardingStrategy::HybridShard)]
    strategy: ShardingStrategy,
) {
    let got = sharding_plan(strategy);
    let want = expected(strategy);
    assert!(got == want, "{strategy}: got {got:?}\n expected {want:?}\nLikely cause: {}.", diagnose(strategy, &got));
}

/// Per-rank model states in fp32 on N ranks, from the ZeRO paper's
/// accounting with K = 8 (AdamW's two f32 moments; f32 parameters are their
/// own master weights): parameters 4Ψ, gradients 4Ψ, optimizer state 8Ψ,
/// each divided by N when sharded. Ψ counts the padded flat buffers.
fn expected_model_states(strategy: ShardingStrategy, psi: u64, n: u64) -> u64 {
    let plan = expected(strategy);
    let part = |bytes: u64, sharded: bool| if sharded { bytes / n } else { bytes };
    part(4 * psi, plan.params) + part(4 * psi, plan.grads) + part(8 * psi, plan.optimizer_state)
}

#[rstest]
fn measured_memory_per_rank_follows_the_plan(
    #[values(ShardingStrategy::FullShard, ShardingStrategy::ShardGradOp, ShardingStrategy::NoShard)] strategy: ShardingStrategy,
) {
    let world_size = 2;
    let (_, trainers) = fsdp_run(world_size, strategy, Precision::Fp32, train_config(1.0), 1);
    let psi: u64 = trainers[0].units.iter().map(|u| u.layout.padded_len() as u64).sum();
    let want = expected_model_states(strategy, psi, world_size as u64);
    for (rank, trainer) in trainers.iter().enumerate() {
        let memory = trainer.ledger().memory;
        assert_eq!(
            memory.model_states(),
            want,
            "{strategy}, rank {rank} of {world_size}: the ledger measured {} bytes of model states, the ZeRO formula gives {want} \
             (Ψ = {psi} elements).\nLedger:\n{}\nLikely cause: the plan from sharding_plan shards the wrong things.",
            memory.model_states(),
            trainer.ledger()
        );
    }
}
