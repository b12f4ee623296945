//! Exercise 15: FSDP checkpoints. References: Phase 2's single-process
//! trainer (the same checkpoint format, the same numbers at world size 1) and
//! uninterrupted FSDP runs.

use std::path::Path;
use std::time::Duration;

use candle_core::Tensor;
use rstest::rstest;
use workbook::distributed::{spawn, spawn_with_timeout};
use workbook::parallel::ddp::Ddp;
use workbook::parallel::fsdp::{FsdpConfig, FsdpTrainer, Precision, ShardingStrategy};
use workbook::train::{Checkpoint, Trainer};

use crate::fsdp_runs::{fsdp_step, fsdp_trainer, gather_params, model_config, single_process_trainer, train_config};
use crate::support::{bit_equal, mistake, ok, scratch_dir};

const FULL: FsdpConfig = FsdpConfig { sharding: ShardingStrategy::FullShard, precision: Precision::Fp32 };

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

#[test]
fn a_one_rank_checkpoint_equals_the_single_process_one() {
    let dir = scratch_dir("ex15-one-rank");
    ok(
        spawn(1, |pg| {
            save(&trained(pg, FULL, 2), &dir);
            Ok(())
        }),
        "one FSDP rank",
    );
    let checkpoint = read(&dir);
    let single = single_process_trainer(2, 1.0);
    for (name, var) in single.params.iter() {
        let want = var.as_tensor();
        let Some(got) = checkpoint.params.get(name) else {
            panic!(
                "the checkpoint has no `{name}`: save every parameter by its name (layout.unflatten gives the names)"
            );
        };
        assert_eq!(got.dims(), want.dims(), "`{name}` saved with shape {:?}: save whole tensors", got.dims());
        assert!(bit_equal(got, want), "`{name}` differs from what one process trained");
    }
    assert_eq!(
        checkpoint.state.optimizer_steps,
        2,
        "the optimizer's step count was not saved (use self.trainer_state(data)): {}",
        mistake(15, "optimizer_not_saved")
    );
    for (key, want) in &single.optimizer.state_tensors() {
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
    let fsdp = FsdpConfig { sharding, precision: Precision::Fp32 };
    let gathered = ok(
        spawn_with_timeout(2, Duration::from_secs(20), |pg| {
            let trainer = trained(pg, fsdp, 2);
            let whole = gather_params(&trainer);
            trainer.save_checkpoint(&dir, None)?;
            Ok(whole)
        }),
        &format!("two FSDP ranks saving (if this timed out: {})", mistake(15, "only_rank_0_gathers")),
    );
    let checkpoint = read(&dir);
    for (name, want) in &gathered[0] {
        let Some(got) = checkpoint.params.get(name) else { panic!("the checkpoint has no `{name}`") };
        assert_eq!(
            got.dims(),
            want.dims(),
            "{sharding}: `{name}` saved with shape {:?}, expected {:?}: gather sharded units (is_sharded) before \
             unflattening, and only those ({})",
            got.dims(),
            want.dims(),
            mistake(15, "local_shard_saved")
        );
        assert!(
            bit_equal(got, want),
            "`{name}` is not the gathered whole of the ranks' shards: {}",
            mistake(15, "local_shard_saved")
        );
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
                let mut trainer =
                    fsdp_trainer(Box::new(pg), FsdpConfig { sharding, precision: Precision::Fp32 }, train_config(1.0));
                trainer.load_checkpoint(&dir)?;
                Ok((gather_params(&trainer), trainer.counters.step, trainer.counters.optimizer_steps))
            }),
            "loading ranks",
        );
        for (rank, (params, step, optimizer_steps)) in loaded.iter().enumerate() {
            assert_eq!(
                (*step, *optimizer_steps),
                (2, 2),
                "{sharding} on {world_size} ranks: step counters not restored (restore_counters)"
            );
            for (name, want) in &saved.params {
                let got = params.get(name).unwrap();
                assert!(
                    bit_equal(got, want),
                    "{sharding} on {world_size} ranks, rank {rank}: `{name}` is not what was saved. Likely cause: {} \
                     (each rank narrows to its own local_range())",
                    mistake(15, "rank_0_shard_loaded")
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
    ok(
        spawn(2, |pg| {
            save(&trained(pg, FULL, 2), &dir);
            Ok(())
        }),
        "ranks saving at step 2",
    );
    let resumed = ok(
        spawn(2, |pg| {
            let mut trainer = fsdp_trainer(Box::new(pg), FULL, train_config(1.0));
            trainer.load_checkpoint(&dir)?;
            fsdp_step(&mut trainer, 2);
            Ok(gather_params(&trainer))
        }),
        "resumed ranks",
    );
    for (name, want) in &straight[0] {
        let got: &Tensor = resumed[0].get(name).unwrap();
        assert!(
            bit_equal(got, want),
            "`{name}` after resuming differs from the uninterrupted run. Likely cause: {}",
            mistake(15, "optimizer_not_saved")
        );
    }
}
