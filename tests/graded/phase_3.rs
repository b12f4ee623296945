//! Phase 3's whole-phase checks, run on CPU ranks once exercises 12-15 pass:
//! the measured memory follows each strategy's plan (exercise 12), bf16 and
//! fp16 train as their policies promise (exercise 13), and every strategy, on
//! 1, 2 and 4 ranks, reaches the parameters that one process and Phase 2's
//! DDP reach on the same global batches, in f32:
//!
//! - World size 1: bit-exact with one process (the same operations on the same
//!   numbers). With clipping, within 1e-6: the gradient norm is summed over
//!   each unit's flat buffer rather than parameter by parameter, the same
//!   squares added in another order, and a clip factor one rounding apart
//!   moves the weights by about 3e-8 on some (correct) ways of writing
//!   exercise 5.
//! - NO_SHARD without clipping: bit-exact with DDP on as many ranks (same
//!   per-rank gradients, same rank-order average).
//! - Sharded gradients: within 1e-6 of DDP. They are reduce-scattered after
//!   every micro-batch (the whole gradient is never kept), where DDP sums the
//!   micro-batches first and averages once: the same additions in another order.
//! - Against one process, N > 1 ranks drift by up to 1e-5: each rank's
//!   gradient is a mean over fewer rows, and AdamW's m/√v turns the rounding
//!   of near-zero gradients into visible update differences. Phase 2's DDP
//!   drifts exactly as much (4.8e-6 here), so this is data parallelism's
//!   rounding, not sharding's.

use candle_core::Device;
use rstest::rstest;
use workbook::distributed::{spawn, Collective};
use workbook::parallel::fsdp::{LossScaler, Precision, ShardingStrategy, StepLedger};
use workbook::parallel::DataAxis;
use workbook::phase3_fsdp::{mixed_precision_policy, sharding_plan};
use workbook::train::Train;

use crate::exercise_12::expected;
use crate::fsdp_runs::{
    as_values, ddp_run, fsdp, fsdp_rank, fsdp_run, fsdp_step, fsdp_trainer, gather_params, last_ledger,
    max_relative_difference, single_process, train_config, units,
};
use crate::process_ranks::on_processes;
use crate::support::{cause, number, ok};

const STEPS: usize = 3;
/// Clipping that bites on this model (its gradient norm is above 1).
const CLIP: f64 = 0.5;
const NO_CLIP: f64 = 1e9;

fn check(worst: (f64, String), bound: f64, what: &str) {
    let (worst, name) = worst;
    assert!(worst <= bound, "{what}: `{name}` differs by {worst:.2e} relative (allowed {bound:.0e})");
}

#[rstest]
fn one_rank_is_bit_exact_with_one_process(
    #[values(ShardingStrategy::FullShard, ShardingStrategy::ShardGradOp, ShardingStrategy::NoShard)]
    strategy: ShardingStrategy,
) {
    for (clip, bound) in [(NO_CLIP, 0.0), (CLIP, 1e-6)] {
        let want = single_process(STEPS, clip);
        let (got, _) = fsdp_run(1, strategy, Precision::Fp32, train_config(clip), STEPS);
        let clipped = if clip == CLIP { ", clipped" } else { "" };
        check(max_relative_difference(&got, &want), bound, &format!("{strategy} on one rank vs one process{clipped}"));
    }
}

#[rstest]
fn ranks_match_ddp_and_one_process(
    #[values(ShardingStrategy::FullShard, ShardingStrategy::ShardGradOp, ShardingStrategy::NoShard)]
    strategy: ShardingStrategy,
    #[values(2, 4)] world_size: usize,
) {
    let (got, _) = fsdp_run(world_size, strategy, Precision::Fp32, train_config(NO_CLIP), STEPS);
    let ddp = ddp_run(world_size, train_config(NO_CLIP), STEPS);
    let bound = if strategy == ShardingStrategy::NoShard { 0.0 } else { 1e-6 };
    check(max_relative_difference(&got, &ddp), bound, &format!("{strategy} vs DDP on {world_size} ranks"));

    let (got, _) = fsdp_run(world_size, strategy, Precision::Fp32, train_config(CLIP), STEPS);
    let single = single_process(STEPS, CLIP);
    check(max_relative_difference(&got, &single), 1e-5, &format!("{strategy} on {world_size} ranks vs one process"));
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

/// HYBRID_SHARD on 4 ranks in shard groups of 2 trains as FULL_SHARD on 4
/// does, holds the model states of a group of 2, and sends one all-reduce
/// of each unit's shard per step across the groups (besides the norm's).
#[test]
fn hybrid_shard_in_groups_of_two_trains_as_full_shard_with_a_group_of_twos_memory() {
    let (full, _) = fsdp_run(4, ShardingStrategy::FullShard, Precision::Fp32, train_config(CLIP), STEPS);
    let hybrid = DataAxis::ShardBlocks {
        sharding: ShardingStrategy::HybridShard,
        shard_group: Some(2),
        precision: Precision::Fp32,
        reduce_in_f32: false,
    };
    let ranks = spawn(4, |pg| Ok(fsdp_rank(Box::new(pg), hybrid, train_config(CLIP), STEPS, &Device::Cpu)));
    let ranks = ok(ranks, "HYBRID_SHARD on 4 ranks");
    for (rank, (params, trainer)) in ranks.iter().enumerate() {
        check(max_relative_difference(params, &full), 1e-5, &format!("HYBRID_SHARD rank {rank} vs FULL_SHARD"));
        let psi: u64 = units(trainer).units.iter().map(|u| u.layout.padded_len() as u64).sum();
        let want = expected_model_states(ShardingStrategy::FullShard, psi, 2);
        let ledger = last_ledger(trainer);
        assert_eq!(ledger.memory.model_states(), want, "HYBRID_SHARD rank {rank}: the model states of a group of 2");
        let all_reduces = ledger.comm.calls(Collective::AllReduce);
        assert_eq!(
            all_reduces,
            units(trainer).units.len() as u64 + 1,
            "rank {rank}: one per unit and the norm's\n{ledger}"
        );
    }
}

#[rstest]
fn measured_memory_per_rank_follows_the_plan(
    #[values(ShardingStrategy::FullShard, ShardingStrategy::ShardGradOp, ShardingStrategy::NoShard)]
    strategy: ShardingStrategy,
) {
    let world_size = 2;
    let (_, trainers) = fsdp_run(world_size, strategy, Precision::Fp32, train_config(1.0), 1);
    let psi: u64 = units(&trainers[0]).units.iter().map(|u| u.layout.padded_len() as u64).sum();
    let want = expected_model_states(strategy, psi, world_size as u64);
    for (rank, trainer) in trainers.iter().enumerate() {
        let memory = last_ledger(trainer).memory;
        let plan_wrong = sharding_plan(strategy) != expected(strategy);
        assert!(
            memory.model_states() == want,
            "{strategy}, rank {rank} of {world_size}: the ledger measured {} bytes of model states, the ZeRO formula gives {want} \
             (Ψ = {psi} elements).\nLedger:\n{}{}",
            memory.model_states(),
            last_ledger(trainer),
            cause(plan_wrong.then_some("sharding_plan (exercise 12) shards the wrong things"))
        );
    }
}

/// Per-step losses of a short FULL_SHARD run on two ranks.
fn losses(precision: Precision, steps: usize) -> Vec<f64> {
    full_shard_run(precision, false, steps).0
}

/// Rank 0's per-step losses and last step's ledger in a short FULL_SHARD run
/// on two ranks, its gradients reduced in f32 where `reduce_in_f32`.
fn full_shard_run(precision: Precision, reduce_in_f32: bool, steps: usize) -> (Vec<f64>, StepLedger) {
    let fsdp =
        DataAxis::ShardBlocks { sharding: ShardingStrategy::FullShard, shard_group: None, precision, reduce_in_f32 };
    let mut per_rank = ok(
        spawn(2, |pg| {
            let mut trainer = fsdp_trainer(Box::new(pg), fsdp, train_config(1.0));
            let losses = (0..steps).map(|s| fsdp_step(&mut trainer, s).loss).collect::<Vec<_>>();
            Ok((losses, last_ledger(&trainer)))
        }),
        "two FSDP ranks",
    );
    per_rank.swap_remove(0)
}

/// bf16 rounds every activation to 8 bits of mantissa (~0.4%); over a short
/// run the loss stays within 1% of the f32 run's.
#[test]
fn a_bf16_run_tracks_the_fp32_run() {
    let steps = 6;
    let (fp32, bf16) = (losses(Precision::Fp32, steps), losses(Precision::Bf16, steps));
    for (s, (a, b)) in fp32.iter().zip(&bf16).enumerate() {
        let rel = (a - b).abs() / a.abs();
        let policy_wrong = mixed_precision_policy(Precision::Bf16) != crate::exercise_13::expected(Precision::Bf16);
        assert!(
            rel <= 1e-2,
            "step {s}: bf16 loss {} vs fp32 {} ({:.2}% apart, allowed 1%).{}",
            number(*b),
            number(*a),
            rel * 100.0,
            cause(policy_wrong.then_some("mixed_precision_policy (exercise 13) does not give the bf16 policy"))
        );
    }
    assert!(bf16[steps - 1] < bf16[0], "the bf16 run did not learn: loss {:.4} → {:.4}", bf16[0], bf16[steps - 1]);
}

/// PyTorch's `MixedPrecision(param_dtype=torch.bfloat16,
/// reduce_dtype=torch.float32)`: the run computes in bf16 while its
/// gradients are reduce-scattered and accumulated in f32, so each call
/// carries, and the gradient buffer keeps, 4 bytes an element where a bf16
/// reduce takes 2; it learns as the bf16 run does.
#[test]
fn a_bf16_run_can_reduce_its_gradients_in_f32() {
    let steps = 3;
    let ((_, in_bf16), (reduced_in_f32, in_f32)) =
        (full_shard_run(Precision::Bf16, false, steps), full_shard_run(Precision::Bf16, true, steps));
    let scattered = |ledger: &StepLedger| ledger.comm.bytes(Collective::ReduceScatter);
    assert_eq!(
        scattered(&in_f32),
        2 * scattered(&in_bf16),
        "reduce-scatter bytes per step: the f32 reduce should carry twice the bf16 reduce's"
    );
    assert_eq!(in_f32.memory.grads, 2 * in_bf16.memory.grads, "the f32 gradient buffer should be twice the bf16 one");
    let fp32 = losses(Precision::Fp32, steps);
    for (s, (a, b)) in fp32.iter().zip(&reduced_in_f32).enumerate() {
        let rel = (a - b).abs() / a.abs();
        assert!(
            rel <= 1e-2,
            "step {s}: loss {} vs fp32 {} ({:.2}% apart, allowed 1%)",
            number(*b),
            number(*a),
            rel * 100.0
        );
    }
}

/// A loss scale of 2^40 makes fp16 gradients overflow: the step must be
/// skipped and the scale halved until the gradients fit, and the
/// parameters must never see an inf or NaN.
#[test]
fn fp16_skips_overflowing_steps_instead_of_producing_nan() {
    let fsdp = fsdp(ShardingStrategy::FullShard, Precision::Fp16);
    let results = ok(
        spawn(2, |pg| {
            let mut trainer = fsdp_trainer(Box::new(pg), fsdp, train_config(1.0));
            let Some(scaler) = trainer.loss_scaler() else {
                return Ok(None);
            };
            *scaler = LossScaler::new(2f64.powi(40), 2000);
            let start = gather_params(&trainer);
            fsdp_step(&mut trainer, 0);
            let after_overflow = gather_params(&trainer);
            let skipped_first = trainer.counters().skipped_steps;
            for s in 1..40 {
                fsdp_step(&mut trainer, s);
            }
            let end = gather_params(&trainer);
            Ok(Some((
                start,
                after_overflow,
                skipped_first,
                trainer.counters().skipped_steps,
                trainer.counters().optimizer_steps,
                trainer.loss_scaler().map_or(1.0, |scaler| scaler.scale),
                end,
            )))
        }),
        "two fp16 FSDP ranks",
    );
    let Some((start, after_overflow, skipped_first, skipped, applied, scale, end)) =
        results.into_iter().next().flatten()
    else {
        panic!(
            "the fp16 trainer has no loss scaler. Likely cause: the fp16 policy (exercise 13) has loss_scaling = false"
        );
    };
    assert_eq!(skipped_first, 1, "the first step overflowed (loss scale 2^40) but was not skipped");
    for (name, t) in &start {
        let same = (t - after_overflow.get(name).unwrap())
            .unwrap()
            .abs()
            .unwrap()
            .max_all()
            .unwrap()
            .to_scalar::<f32>()
            .unwrap();
        assert_eq!(same, 0.0, "`{name}` changed in a step whose gradients overflowed: that step must be skipped");
    }
    assert!(
        applied > 0,
        "no step was applied in 40: the scale ({scale:e}) never came down to where fp16 gradients fit"
    );
    assert!(scale < 2f64.powi(40), "the loss scale did not shrink after overflows");
    assert!(skipped > 1, "expected several overflowing steps while the scale came down from 2^40, saw {skipped}");
    for (name, t) in &end {
        let sum = t.sum_all().unwrap().to_scalar::<f32>().unwrap();
        assert!(
            sum.is_finite(),
            "`{name}` holds inf or NaN after fp16 training: overflowing steps reached the parameters"
        );
    }
}

/// Ranks as processes, as on a cluster: FSDP over the TCP backend, each rank
/// a process running your exercises, trains bit for bit as on thread ranks
/// (two ranks add a + b = b + a, whichever order the ring uses).
#[test]
fn full_shard_on_two_processes_trains_as_on_two_thread_ranks() {
    let fsdp = fsdp(ShardingStrategy::FullShard, Precision::Fp32);
    let per_rank =
        on_processes(2, |pg| Ok(as_values(&fsdp_rank(Box::new(pg), fsdp, train_config(CLIP), STEPS, &Device::Cpu).0)));
    let (threads, _) = fsdp_run(2, ShardingStrategy::FullShard, Precision::Fp32, train_config(CLIP), STEPS);
    let threads = as_values(&threads);
    for (rank, params) in per_rank.iter().enumerate() {
        if let Some(name) = params.keys().find(|name| params[*name] != threads[*name]) {
            panic!("rank {rank}'s process and the thread ranks disagree on `{name}` after {STEPS} FSDP steps");
        }
    }
}
