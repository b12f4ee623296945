//! Exercise 14: the wrap policy. The expected units are PyTorch's
//! `transformer_auto_wrap_policy` on this model: one unit per block, the rest
//! in the root. The collective counts run the FSDP trainer on two CPU ranks.

use rstest::rstest;
use workbook::distributed::Collective;
use workbook::parallel::fsdp::{check_units, Precision, ShardingStrategy, ROOT_UNIT};
use workbook::phase3_fsdp::{sharding_plan, wrap_policy};
use workbook::GptConfig;

use crate::fsdp_runs::{fsdp_run, last_ledger, model_config, train_config};
use crate::support::{cause, mistake};

/// Twelve layers: enough for `model.layers.1` to be a prefix of `model.layers.10`.
fn twelve_layers() -> GptConfig {
    GptConfig { num_layers: 12, ..model_config() }
}

#[test]
fn root_first_then_one_unit_per_block() {
    let config = twelve_layers();
    let units = wrap_policy(&config);
    let names: Vec<&str> = units.iter().map(|u| u.name.as_str()).collect();
    if units.len() == 1 {
        panic!("{}", mistake(14, "one_unit"));
    }
    if let Some(root) = units.first() {
        for outer in ["model.embed_tokens.weight", "lm_head.weight", "model.norm.weight"] {
            if !root.params.iter().any(|p| p == outer) {
                let home = units.iter().find(|u| u.params.iter().any(|p| p == outer)).map(|u| u.name.as_str());
                match home {
                    Some(ROOT_UNIT) => {
                        panic!("the root unit is not the first of {names:?}: {}", mistake(14, "out_of_order"))
                    }
                    Some(unit) => panic!("`{outer}` is in unit `{unit}`: {}", mistake(14, "outer_in_block")),
                    None => panic!("`{outer}` is in no unit: every parameter belongs to exactly one"),
                }
            }
        }
    }
    if let Err(e) = check_units(&config, &units) {
        let hint = if units.get(2).is_some_and(|u| u.params.iter().any(|p| p.starts_with("model.layers.10."))) {
            format!("Likely cause: {}.", mistake(14, "prefix_without_dot"))
        } else {
            "Expected: the root first, then one unit per block in layer order, each with exactly that block's parameters."
                .to_string()
        };
        panic!("the units {names:?} are not what FSDP runs: {e}\n{hint}");
    }
    let specs = workbook::param_specs(&config);
    for unit in &units {
        let order: Vec<usize> = unit.params.iter().map(|p| specs.iter().position(|s| &s.name == p).unwrap()).collect();
        assert!(
            order.windows(2).all(|w| w[0] < w[1]),
            "unit `{}` lists its parameters out of module order (param_specs order): {}",
            unit.name,
            mistake(14, "out_of_order")
        );
    }
}

/// Under FULL_SHARD, per micro-batch: each block unit all-gathered before its
/// forward and again before its backward, the root once (it stays gathered
/// until its backward is done); every unit reduce-scattered once. Per step:
/// one all-reduce of the squared gradient norm. SHARD_GRAD_OP gathers nothing
/// for compute, reduce-scatters as FULL_SHARD, and all-gathers each unit once
/// after the optimizer step. NO_SHARD all-reduces each unit once per step.
#[rstest]
fn collectives_per_step_follow_from_the_units(
    #[values(ShardingStrategy::FullShard, ShardingStrategy::ShardGradOp, ShardingStrategy::NoShard)]
    strategy: ShardingStrategy,
) {
    let config = train_config(1.0);
    let (micro_batches, blocks) = (config.grad_accum_steps as u64, model_config().num_layers as u64);
    let units = blocks + 1;
    let (all_gather, reduce_scatter, all_reduce) = match strategy {
        ShardingStrategy::FullShard => (micro_batches * (1 + 2 * blocks), micro_batches * units, 1),
        ShardingStrategy::ShardGradOp => (units, micro_batches * units, 1),
        _ => (0, 0, units),
    };
    let (_, trainers) = fsdp_run(2, strategy, Precision::Fp32, config, 1);
    let comm = &last_ledger(&trainers[0]).comm;
    let got =
        (comm.calls(Collective::AllGather), comm.calls(Collective::ReduceScatter), comm.calls(Collective::AllReduce));
    let want = (all_gather, reduce_scatter, all_reduce);
    // The counts follow from the units and the plan: name whichever is off.
    let units_wrong = check_units(&model_config(), &wrap_policy(&model_config())).is_err();
    let plan_wrong = sharding_plan(strategy) != crate::exercise_12::expected(strategy);
    let established = if units_wrong {
        Some("the wrap policy does not make one unit per block plus the root (see root_first_then_one_unit_per_block)")
    } else if plan_wrong {
        Some("sharding_plan (exercise 12) does not give this strategy's plan")
    } else {
        None
    };
    assert!(
        got == want,
        "{strategy}, {units} units, {micro_batches} micro-batches: (all-gathers, reduce-scatters, all-reduces) \
         per step are {got:?}, expected {want:?}.{}",
        cause(established)
    );
}
