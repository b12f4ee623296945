//! Exercise 15: FSDP checkpoints. References: Phase 2's single-process
//! trainer (the same checkpoint format, the same numbers at world size 1) and
//! uninterrupted FSDP runs.

use std::path::Path;
use std::time::Duration;

use candle_core::{Device, Result, Tensor};
use rstest::rstest;
use workbook::distributed::ProcessGroup;
use workbook::distributed::{spawn, spawn_with_timeout, Collective};
use workbook::memory::process_peak_during;
use workbook::parallel::ddp::Ddp;
use workbook::parallel::fsdp::{FsdpConfig, FsdpTrainer, Precision, ShardingStrategy};
use workbook::train::{Checkpoint, Trainer};
use workbook::{init_params, GptConfig};

use crate::fsdp_runs::{fsdp_step, fsdp_trainer, gather_params, model_config, single_process_trainer, train_config};
use crate::process_ranks::on_processes;
use crate::support::{bit_equal, cause, explain_error, mistake, number, ok, scratch_dir, values};

const FULL: FsdpConfig = FsdpConfig {
    sharding: ShardingStrategy::FullShard,
    precision: Precision::Fp32,
    hybrid_group_size: None,
    reduce_in_f32: false,
};

fn save(trainer: &FsdpTrainer, dir: &Path) {
    ok(trainer.save_checkpoint(dir, None), "FsdpTrainer::save_checkpoint");
}

fn trained(pg: workbook::distributed::CpuProcessGroup, fsdp: FsdpConfig, steps: usize) -> FsdpTrainer {
    let mut trainer = fsdp_trainer(Box::new(pg), fsdp, train_config(1.0));
    for s in 0..steps {
        fsdp_step(&mut trainer, s);
    }
    trainer
}

fn read(dir: &Path) -> Checkpoint {
    ok(Checkpoint::read(dir), "reading the checkpoint")
}

/// A deeper model than the other checks' (its blocks are most of it), so
/// that one unit is a small part of the whole.
fn deep_trainer(pg: Box<dyn ProcessGroup>) -> FsdpTrainer {
    let config = GptConfig { num_layers: 8, ..model_config() };
    let params = init_params(&config, 7, &Device::Cpu).unwrap();
    let mut trainer = ok(FsdpTrainer::new(&config, params, train_config(1.0), FULL, pg), "FsdpTrainer::new");
    fsdp_step(&mut trainer, 0);
    trainer
}

/// Rank 0 writes the whole model and its moments, yet holds no more than
/// half of them at once: each unit gathered, written and let go before the
/// next. Each rank is a process, whose heap bytes the allocator counts.
#[test]
fn a_save_holds_a_unit_at_a_time_not_the_whole_model() {
    let dir = scratch_dir("ex15-a-unit-at-a-time");
    let runs = on_processes(2, |pg| {
        let trainer = deep_trainer(Box::new(pg));
        let whole: usize = trainer.units.iter().map(|unit| unit.layout.padded_len()).sum();
        let largest = trainer.units.iter().map(|unit| unit.layout.padded_len()).max().unwrap_or(0);
        let (saved, peak) = process_peak_during(|| trainer.save_checkpoint(&dir, None));
        saved?;
        Ok((whole, largest, peak))
    });
    let (whole, largest, peak) = runs[0];
    let peak = peak.expect("the graded tests count their heap bytes");
    // Parameters and two moments, f32.
    let (whole_bytes, unit_bytes) = (12 * whole as u64, 12 * largest as u64);
    assert!(
        peak < whole_bytes / 2,
        "while rank 0 saved a model of 8 blocks it held up to {} KiB at once; the whole model and its moments \
         are {} KiB, its largest unit's {} KiB, and a save may hold half the whole: gather, write and let go of \
         one unit before the next{}",
        peak / 1024,
        whole_bytes / 1024,
        unit_bytes / 1024,
        cause((peak >= whole_bytes).then(|| mistake(15, "whole_state_held")))
    );
}

/// After 2 steps, and before the first, when AdamW has no moments yet.
#[rstest]
fn a_one_rank_checkpoint_equals_the_single_process_one(#[values(0, 2)] steps: usize) {
    let dir = scratch_dir(&format!("ex15-one-rank-{steps}"));
    ok(
        spawn(1, |pg| {
            save(&trained(pg, FULL, steps), &dir);
            Ok(())
        }),
        "one FSDP rank",
    );
    let checkpoint = read(&dir);
    let single = single_process_trainer(steps, 1.0);
    for (name, var) in single.params.iter() {
        let want = var.as_tensor();
        let Some(got) = checkpoint.params.get(name) else {
            panic!(
                "the checkpoint has no `{name}`: save every parameter by its name (layout.unflatten gives the names)"
            );
        };
        assert!(
            got.dims() == want.dims(),
            "`{name}` saved with shape {:?}, expected {:?}: save whole tensors",
            got.dims(),
            want.dims()
        );
        assert!(bit_equal(got, want), "`{name}` differs from what one process trained");
    }
    let saved_steps = checkpoint.state.optimizer_steps;
    assert!(
        saved_steps == steps as u64,
        "the checkpoint records {saved_steps} optimizer steps, the run took {steps} (self.trainer_state(data) \
         records them): {}",
        mistake(15, "optimizer_not_saved")
    );
    let single_state = single.optimizer.state_tensors();
    if let Some(key) = checkpoint.optimizer.keys().find(|key| !single_state.contains_key(*key)) {
        panic!(
            "the checkpoint holds optimizer state `{key}`, which one process's checkpoint after {steps} steps does \
             not (before the first step AdamW has no moments)"
        );
    }
    for (key, want) in &single_state {
        let Some(got) = checkpoint.optimizer.get(key) else {
            panic!(
                "the checkpoint has no optimizer state `{key}` (exp_avg.<name> and exp_avg_sq.<name> of every parameter): {}",
                mistake(15, "optimizer_not_saved")
            );
        };
        assert!(bit_equal(got, want), "optimizer state `{key}` differs from one process's AdamW");
    }
}

/// Every strategy: sharded units are gathered, whole ones saved as they are
/// (gathering a unit every rank already holds whole would repeat it N times).
#[rstest]
fn two_ranks_save_the_gathered_whole(
    #[values(ShardingStrategy::FullShard, ShardingStrategy::ShardGradOp, ShardingStrategy::NoShard)]
    sharding: ShardingStrategy,
) {
    let dir = scratch_dir(&format!("ex15-two-ranks-{sharding}"));
    let fsdp = FsdpConfig { sharding, precision: Precision::Fp32, hybrid_group_size: None, reduce_in_f32: false };
    // Each rank reports its save's outcome and the all-gathers it issued while saving.
    let ranks = ok(
        spawn_with_timeout(2, Duration::from_secs(20), |pg| {
            let trainer = trained(pg, fsdp, 2);
            let whole = gather_params(&trainer);
            let before = trainer.process_group().stats().calls(Collective::AllGather);
            let saved = trainer.save_checkpoint(&dir, None).map_err(|e| explain_error(&e));
            let gathers = trainer.process_group().stats().calls(Collective::AllGather) - before;
            Ok((whole, saved, gathers))
        }),
        "two FSDP ranks saving",
    );
    let gathers: Vec<u64> = ranks.iter().map(|(_, _, gathers)| *gathers).collect();
    if let Some((rank, error)) =
        ranks.iter().enumerate().find_map(|(r, (_, saved, _))| Some((r, saved.as_ref().err()?)))
    {
        let sharded = sharding != ShardingStrategy::NoShard;
        let established = match (gathers[0], gathers[1]) {
            (0, 0) if sharded => Some(mistake(15, "local_shard_saved")),
            (a, 0) if a > 0 => Some(mistake(15, "only_rank_0_gathers")),
            _ => None,
        };
        panic!(
            "{sharding}: rank {rank}'s save_checkpoint returned an error:\n  {error}\n  all-gathers while saving, \
             rank by rank: {gathers:?}.{}",
            cause(established)
        );
    }
    let gathered: Vec<_> = ranks.into_iter().map(|(whole, _, _)| whole).collect();
    let checkpoint = read(&dir);
    for (name, want) in &gathered[0] {
        let Some(got) = checkpoint.params.get(name) else { panic!("the checkpoint has no `{name}`") };
        let a_shard = got.elem_count() < want.elem_count();
        assert!(
            got.dims() == want.dims(),
            "{sharding}: `{name}` saved with shape {:?}, expected {:?}.{}",
            got.dims(),
            want.dims(),
            cause(a_shard.then(|| mistake(15, "local_shard_saved")))
        );
        // Whole-sized but other numbers. Right where one shard lies and zero
        // elsewhere is a lone shard padded out; anything else (shards in
        // another order, another step's values) is said by where it differs.
        if !bit_equal(got, want) {
            let (got_values, want_values) = (values(got), values(want));
            let at = got_values.iter().zip(&want_values).position(|(g, w)| g.to_bits() != w.to_bits()).unwrap_or(0);
            let padded_shard =
                got_values.iter().zip(&want_values).all(|(g, w)| g.to_bits() == w.to_bits() || *g == 0.0);
            panic!(
                "{sharding}: `{name}` has the whole's shape but not the gathered whole of the ranks' shards: flat \
                 element {at} is {}, the gathered whole holds {} there (the ranks' shards, in rank order).{}",
                number(got_values[at] as f64),
                number(want_values[at] as f64),
                cause(padded_shard.then(|| mistake(15, "local_shard_saved")))
            );
        }
    }
}

#[test]
fn only_rank_zero_writes() {
    let root = scratch_dir("ex15-rank-zero");
    ok(
        spawn(2, |pg| {
            let trainer = trained(pg, FULL, 1);
            let rank = trainer.process_group().rank();
            trainer.save_checkpoint(&root.join(format!("rank{rank}")), None)
        }),
        "two ranks saving",
    );
    assert!(root.join("rank0").exists(), "rank 0 wrote no checkpoint");
    assert!(!root.join("rank1").exists(), "rank 1 wrote a checkpoint: {}", mistake(15, "every_rank_writes"));
}

/// No rank returns from saving before the file is complete.
#[test]
fn every_rank_meets_one_barrier_when_saving() {
    let root = scratch_dir("ex15-barrier");
    let barriers = ok(
        spawn(2, |pg| {
            let trainer = trained(pg, FULL, 1);
            let before = trainer.process_group().stats().calls(Collective::Barrier);
            trainer.save_checkpoint(&root.join("step_000001"), None)?;
            Ok(trainer.process_group().stats().calls(Collective::Barrier) - before)
        }),
        "two ranks saving",
    );
    for (rank, &count) in barriers.iter().enumerate() {
        assert!(
            count == 1,
            "rank {rank} met {count} barriers in save_checkpoint; every rank meets one, after rank 0 has written, \
             so that no rank returns (and reads or deletes the checkpoint) before the file is complete"
        );
    }
}

/// Saved before the first step, the checkpoint holds no moments: loading it
/// starts AdamW afresh, and the next step is the uninterrupted run's first.
#[test]
fn a_checkpoint_from_before_the_first_step_resumes() {
    let dir = scratch_dir("ex15-step-0");
    let straight = ok(spawn(2, |pg| Ok(gather_params(&trained(pg, FULL, 1)))), "uninterrupted ranks");
    ok(
        spawn(2, |pg| {
            save(&trained(pg, FULL, 0), &dir);
            Ok(())
        }),
        "ranks saving before the first step",
    );
    let resumed = ok(
        spawn(2, |pg| {
            let mut trainer = fsdp_trainer(Box::new(pg), FULL, train_config(1.0));
            trainer.load_checkpoint(&dir)?;
            fsdp_step(&mut trainer, 0);
            Ok(gather_params(&trainer))
        }),
        "ranks loading a checkpoint saved before the first step",
    );
    for (name, want) in &straight[0] {
        assert!(
            bit_equal(&resumed[0][name], want),
            "`{name}` one step after loading a checkpoint saved before the first step differs from the \
             uninterrupted run's first step"
        );
    }
}

/// Saved by 4 ranks, loaded by 2 and by 1: every rank must take its own
/// shard, and the loaded model must be the saved one.
#[test]
fn a_four_rank_checkpoint_loads_on_two_ranks_and_one() {
    let dir = scratch_dir("ex15-reshard");
    ok(
        spawn(4, |pg| {
            save(&trained(pg, FULL, 2), &dir);
            Ok(())
        }),
        "four ranks saving",
    );
    let saved = read(&dir);
    for (world_size, sharding) in
        [(2, ShardingStrategy::FullShard), (1, ShardingStrategy::ShardGradOp), (2, ShardingStrategy::NoShard)]
    {
        let loaded = ok(
            spawn(world_size, |pg| {
                let mut trainer = fsdp_trainer(
                    Box::new(pg),
                    FsdpConfig { sharding, precision: Precision::Fp32, hybrid_group_size: None, reduce_in_f32: false },
                    train_config(1.0),
                );
                trainer.load_checkpoint(&dir)?;
                let shards = trainer.units.iter().map(|u| Ok(u.local_state()?.params)).collect::<Result<Vec<_>>>()?;
                Ok((gather_params(&trainer), trainer.counters, shards))
            }),
            "loading ranks",
        );
        // Every rank holding rank 0's shard is what loading rank 0's range everywhere gives.
        let shards_of = |rank: usize| &loaded[rank].2;
        let rank_0_everywhere = world_size > 1
            && sharding != ShardingStrategy::NoShard
            && (1..world_size).all(|r| shards_of(r).iter().zip(shards_of(0)).all(|(a, b)| bit_equal(a, b)));
        for (rank, (params, counters, _)) in loaded.iter().enumerate() {
            let (step, optimizer_steps) = (counters.step, counters.optimizer_steps);
            assert!(
                (step, optimizer_steps) == (2, 2),
                "{sharding} on {world_size} ranks: after loading, step {step} and optimizer_steps {optimizer_steps}, \
                 the checkpoint's are 2 and 2 (restore_counters)"
            );
            for (name, want) in &saved.params {
                let got = params.get(name).unwrap();
                assert!(
                    bit_equal(got, want),
                    "{sharding} on {world_size} ranks, rank {rank}: `{name}` is not what was saved.{}",
                    cause(rank_0_everywhere.then(|| mistake(15, "rank_0_shard_loaded")))
                );
            }
        }
    }
    // The format is Phase 2's: its trainer reads the file too.
    let mut single = Trainer::new(
        &model_config(),
        workbook::init_params(&model_config(), 1, &candle_core::Device::Cpu).unwrap(),
        train_config(1.0),
        Ddp::single(),
    )
    .unwrap();
    ok(single.load_checkpoint(&dir), "Phase 2's Trainer::load_checkpoint on an FSDP checkpoint");
}

/// Training 3 steps equals training 2, saving, loading into fresh ranks and training 1 more.
#[test]
fn resuming_reproduces_the_uninterrupted_run_bit_for_bit() {
    let dir = scratch_dir("ex15-resume");
    let straight = ok(spawn(2, |pg| Ok(gather_params(&trained(pg, FULL, 3)))), "uninterrupted ranks");
    let saved = ok(
        spawn(2, |pg| {
            let trainer = trained(pg, FULL, 2);
            save(&trainer, &dir);
            Ok(gather_params(&trainer))
        }),
        "ranks saving at step 2",
    );
    let resumed = ok(
        spawn(2, |pg| {
            let mut trainer = fsdp_trainer(Box::new(pg), FULL, train_config(1.0));
            trainer.load_checkpoint(&dir)?;
            let loaded = gather_params(&trainer);
            fsdp_step(&mut trainer, 2);
            Ok((loaded, gather_params(&trainer)))
        }),
        "resumed ranks",
    );
    let (loaded, stepped) = &resumed[0];
    for (name, want) in &saved[0] {
        assert!(bit_equal(&loaded[name], want), "`{name}` right after loading differs from what was saved");
    }
    // The parameters came back whole, so a different next step comes from the rest of the state.
    for (name, want) in &straight[0] {
        let got: &Tensor = &stepped[name];
        assert!(
            bit_equal(got, want),
            "`{name}` one step after resuming differs from the uninterrupted run, though the parameters loaded \
             right.{}",
            cause(Some(mistake(15, "optimizer_not_saved")))
        );
    }
}
