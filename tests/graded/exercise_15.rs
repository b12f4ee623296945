//! Exercise 15: FSDP checkpoints. References: Phase 2's single-process
//! trainer (the same numbers at world size 1, the same checkpoint format)
//! and uninterrupted FSDP runs. The trainer's own checkpoints (rank 0 of the
//! first replica writes, every rank reads) go through both functions.

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use candle_core::{Device, Result};
use rstest::rstest;
use workbook::distributed::{spawn, spawn_with_timeout, Collective, CpuProcessGroup, DeviceMesh, ProcessGroup};
use workbook::memory::process_peak_during;
use workbook::parallel::ddp::Ddp;
use workbook::parallel::fsdp::{Precision, ShardingStrategy, WholeParam};
use workbook::parallel::{DataAxis, MeshPlan, MeshTrainer};
use workbook::phase3_fsdp::gather_full_state;
use workbook::train::{AdamW, Checkpoint, Train, Trainer};
use workbook::{init_params, GptConfig};

use crate::fsdp_runs::{
    fsdp as fsdp_units, fsdp_step, fsdp_trainer, gather_params, model_config, single_process_trainer, train_config,
    units,
};
use crate::process_ranks::on_processes;
use crate::support::{bit_equal, cause, explain_error, mistake, number, ok, scratch_dir, values};

fn fsdp(sharding: ShardingStrategy) -> DataAxis {
    fsdp_units(sharding, Precision::Fp32)
}

fn trained(pg: CpuProcessGroup, fsdp: DataAxis, steps: usize) -> MeshTrainer {
    let mut trainer = fsdp_trainer(Box::new(pg), fsdp, train_config(1.0));
    for s in 0..steps {
        fsdp_step(&mut trainer, s);
    }
    trainer
}

/// Everything `gather_full_state` hands on for `trainer`'s units.
fn handed_on(trainer: &MeshTrainer, with_moments: bool) -> Result<Vec<WholeParam>> {
    let mut kept = vec![];
    let held = units(trainer);
    gather_full_state(held.units.iter(), held.shard, with_moments, &mut |whole| {
        kept.push(whole);
        Ok(())
    })?;
    Ok(kept)
}

/// What was handed on, by name; a name handed on twice is a failure.
fn by_name(kept: Vec<WholeParam>) -> HashMap<String, WholeParam> {
    let mut named = HashMap::new();
    for whole in kept {
        let name = whole.name.clone();
        assert!(
            named.insert(name.clone(), whole).is_none(),
            "`{name}` was handed to `keep` more than once: each parameter goes once, with its moments"
        );
    }
    named
}

fn save(trainer: &MeshTrainer, dir: &Path) {
    ok(Train::save_checkpoint(trainer, dir, None), "the FSDP trainer's save (through gather_full_state)");
}

fn read(dir: &Path) -> Checkpoint {
    ok(Checkpoint::read(dir), "reading the checkpoint")
}

/// A deeper model than the other checks' (its blocks are most of it), so
/// that one unit is a small part of the whole.
fn deep_trainer(pg: Box<dyn ProcessGroup>) -> MeshTrainer {
    let config = GptConfig { num_layers: 8, ..model_config() };
    let params = init_params(&config, 7, &Device::Cpu).unwrap();
    let (mesh, plan) = (DeviceMesh::data_parallel(pg), MeshPlan::replicas(fsdp(ShardingStrategy::FullShard)));
    let mut trainer = ok(MeshTrainer::new(&config, &params, train_config(1.0), mesh, plan), "MeshTrainer::new");
    fsdp_step(&mut trainer, 0);
    trainer
}

/// Rank 0 hands on the whole model and its moments, yet holds no more than
/// half of them at once: each unit gathered and handed on before the next,
/// and `keep` lets go of what it is handed. Each rank is a process, whose
/// heap bytes the allocator counts.
#[test]
fn a_save_holds_a_unit_at_a_time_not_the_whole_model() {
    let runs = on_processes(2, |pg| {
        let trainer = deep_trainer(Box::new(pg));
        let held = units(&trainer);
        let group = held.shard;
        let whole: usize = held.units.iter().map(|unit| unit.layout.padded_len()).sum();
        let largest = held.units.iter().map(|unit| unit.layout.padded_len()).max().unwrap_or(0);
        let gathers = || group.stats().calls(Collective::AllGather);
        let before = gathers();
        // The all-gathers issued before `keep` was first called.
        let mut before_first_keep = None;
        let (saved, peak) = process_peak_during(|| {
            gather_full_state(held.units.iter(), group, true, &mut |_| {
                before_first_keep.get_or_insert(gathers() - before);
                Ok(())
            })
        });
        saved?;
        Ok((whole, largest, peak, before_first_keep, gathers() - before))
    });
    let (whole, largest, peak, before_first_keep, gathers) = runs[0];
    let peak = peak.expect("the graded tests count their heap bytes");
    // Parameters and two moments, f32.
    let (whole_bytes, unit_bytes) = (12 * whole as u64, 12 * largest as u64);
    // Nothing was handed on before the last gather: every unit's whole tensors were held at once.
    let all_gathered_first = gathers > 3 && before_first_keep == Some(gathers);
    assert!(
        peak < whole_bytes / 2,
        "while rank 0 handed on a model of 8 blocks it held up to {} KiB at once; the whole model and its moments \
         are {} KiB, its largest unit's {} KiB, and a save may hold half the whole: gather one unit, hand its \
         tensors to `keep`, then the next. All-gathers before the first call of `keep`: {}, in all: {gathers}.{}",
        peak / 1024,
        whole_bytes / 1024,
        unit_bytes / 1024,
        before_first_keep.map_or("none (keep was never called)".to_string(), |n| n.to_string()),
        cause(all_gathered_first.then(|| mistake(15, "whole_state_held")))
    );
}

/// One rank after 2 steps, and before the first, when AdamW has no moments
/// yet: what it hands on is exactly what one process trained.
#[rstest]
fn one_rank_hands_on_what_one_process_trained(#[values(0, 2)] steps: usize) {
    let with_moments = steps > 0;
    let kept = ok(
        spawn(1, |pg| handed_on(&trained(pg, fsdp(ShardingStrategy::FullShard), steps), with_moments)),
        "gather_full_state on one rank",
    );
    let kept = by_name(kept.into_iter().next().unwrap());
    let single = single_process_trainer(steps, 1.0);
    let single_moments = single.optimizer.state_tensors();
    if let Some(name) = kept.keys().find(|name| single.params.get(name).is_err()) {
        panic!("`{name}` was handed on, but the model has no such parameter");
    }
    for (name, var) in single.params.iter() {
        let want = var.as_tensor();
        let Some(got) = kept.get(name) else {
            panic!(
                "`{name}` was never handed to `keep`: every parameter of every unit goes (layout.unflatten gives the \
                 names)"
            );
        };
        assert!(
            got.value.dims() == want.dims(),
            "`{name}` handed on with shape {:?}, expected {:?}: whole tensors.{}",
            got.value.dims(),
            want.dims(),
            cause((got.value.elem_count() < want.elem_count()).then(|| mistake(15, "local_shard_saved")))
        );
        assert!(bit_equal(&got.value, want), "`{name}` differs from what one process trained");
        match (&got.moments, with_moments) {
            (None, false) => {}
            (Some(_), false) => panic!(
                "`{name}` was handed on with moments, though with_moments is false (the trainer asks for them once \
                 AdamW has stepped; before that one process's checkpoint holds none)"
            ),
            (None, true) => panic!(
                "`{name}` was handed on without its moments, though with_moments is true.{}",
                cause(Some(mistake(15, "moments_not_gathered")))
            ),
            (Some(moments), true) => {
                for (moment_name, got) in AdamW::moment_names(name).iter().zip(moments) {
                    let want = &single_moments[moment_name];
                    let kind = moment_name.split('.').next().unwrap_or_default();
                    assert!(
                        got.dims() == want.dims(),
                        "`{name}`'s {kind} handed on with shape {:?}, expected {:?}: whole, as its parameter",
                        got.dims(),
                        want.dims()
                    );
                    assert!(
                        bit_equal(got, want),
                        "`{name}`'s {kind} differs from one process's AdamW: moments come in the order exp_avg, \
                         exp_avg_sq"
                    );
                }
            }
        }
    }
}

/// Every strategy on 2 ranks: sharded units are gathered, whole ones handed
/// on as they are (gathering a unit every rank already holds whole would
/// repeat it N times); both ranks are handed the same whole tensors.
#[rstest]
fn two_ranks_hand_on_the_gathered_whole(
    #[values(ShardingStrategy::FullShard, ShardingStrategy::ShardGradOp, ShardingStrategy::NoShard)]
    sharding: ShardingStrategy,
) {
    // Each rank reports what it was handed, and the all-gathers it issued meanwhile.
    let ranks = ok(
        spawn_with_timeout(2, Duration::from_secs(20), |pg| {
            let trainer = trained(pg, fsdp(sharding), 2);
            let whole = gather_params(&trainer);
            let before = trainer.process_group().stats().calls(Collective::AllGather);
            let kept = handed_on(&trainer, true).map_err(|e| explain_error(&e));
            let gathers = trainer.process_group().stats().calls(Collective::AllGather) - before;
            Ok((whole, kept, gathers))
        }),
        "two FSDP ranks gathering",
    );
    let gathers: Vec<u64> = ranks.iter().map(|(_, _, gathers)| *gathers).collect();
    if let Some((rank, error)) = ranks.iter().enumerate().find_map(|(r, (_, kept, _))| Some((r, kept.as_ref().err()?)))
    {
        let sharded = sharding != ShardingStrategy::NoShard;
        let established = match (gathers[0], gathers[1]) {
            (0, 0) if sharded => Some(mistake(15, "local_shard_saved")),
            (a, 0) if a > 0 => Some(mistake(15, "only_rank_0_gathers")),
            _ => None,
        };
        panic!(
            "{sharding}: rank {rank}'s gather_full_state returned an error:\n  {error}\n  all-gathers meanwhile, rank \
             by rank: {gathers:?}.{}",
            cause(established)
        );
    }
    for (rank, (want, kept, _)) in ranks.into_iter().enumerate() {
        let kept = by_name(kept.unwrap_or_default());
        for (name, want) in &want {
            let Some(got) = kept.get(name) else { panic!("{sharding}, rank {rank}: `{name}` was never handed on") };
            let got = &got.value;
            assert!(
                got.dims() == want.dims(),
                "{sharding}, rank {rank}: `{name}` handed on with shape {:?}, expected {:?}.{}",
                got.dims(),
                want.dims(),
                cause((got.elem_count() < want.elem_count()).then(|| mistake(15, "local_shard_saved")))
            );
            // Whole-sized but other numbers. Right where one shard lies and
            // zero elsewhere is a lone shard padded out; anything else
            // (shards in another order, another step's values) is said by
            // where it differs.
            if !bit_equal(got, want) {
                let (got_values, want_values) = (values(got), values(want));
                let at = got_values.iter().zip(&want_values).position(|(g, w)| g.to_bits() != w.to_bits()).unwrap_or(0);
                let padded_shard =
                    got_values.iter().zip(&want_values).all(|(g, w)| g.to_bits() == w.to_bits() || *g == 0.0);
                panic!(
                    "{sharding}, rank {rank}: `{name}` has the whole's shape but not the gathered whole of the \
                     ranks' shards: flat element {at} is {}, the gathered whole holds {} there (the ranks' shards, \
                     in rank order).{}",
                    number(got_values[at] as f64),
                    number(want_values[at] as f64),
                    cause(padded_shard.then(|| mistake(15, "local_shard_saved")))
                );
            }
        }
    }
}

/// One process's checkpoint after 2 steps (exercise 11's format, which the
/// FSDP trainer writes too), loaded by 1, 2 and 3 ranks under several
/// strategies: every rank must take its own part, and the loaded model must
/// be the saved one.
#[test]
fn a_whole_checkpoint_loads_on_one_two_and_three_ranks() {
    let dir = scratch_dir("ex15-load");
    ok(single_process_trainer(2, 1.0).save_checkpoint(&dir, None), "Phase 2's Trainer::save_checkpoint");
    let saved = read(&dir);
    let load = |world_size: usize, sharding: ShardingStrategy| {
        ok(
            spawn(world_size, |pg| {
                let mut trainer = fsdp_trainer(Box::new(pg), fsdp(sharding), train_config(1.0));
                Train::load_checkpoint(&mut trainer, &dir)?;
                let local = units(&trainer).units.iter().map(|u| u.local_state()).collect::<Result<Vec<_>>>()?;
                Ok((gather_params(&trainer), trainer.counters(), local))
            }),
            "loading ranks",
        )
    };
    // On one rank each unit's range is its whole buffer.
    let one_rank = load(1, ShardingStrategy::ShardGradOp);
    let whole_buffers: Vec<Vec<f32>> = one_rank[0].2.iter().map(|local| values(&local.params)).collect();
    for (world_size, sharding) in [
        (1, ShardingStrategy::ShardGradOp),
        (2, ShardingStrategy::FullShard),
        (3, ShardingStrategy::FullShard),
        (2, ShardingStrategy::NoShard),
    ] {
        let loaded = if world_size == 1 { one_rank.clone() } else { load(world_size, sharding) };
        // Every rank holding the elements rank 0 holds, which are the start of each whole buffer.
        let shards_of = |rank: usize| &loaded[rank].2;
        let rank_0_everywhere = world_size > 1
            && sharding != ShardingStrategy::NoShard
            && (0..world_size).all(|r| {
                shards_of(r).iter().zip(&whole_buffers).all(|(local, whole)| {
                    let local = values(&local.params);
                    let n = local.len().min(whole.len());
                    local[..n].iter().zip(&whole[..n]).all(|(a, b)| a.to_bits() == b.to_bits())
                })
            });
        let zero_moments = loaded.iter().all(|(_, _, local)| {
            local.iter().all(|l| values(&l.exp_avg).iter().chain(&values(&l.exp_avg_sq)).all(|v| *v == 0.0))
        });
        for (rank, (params, counters, _)) in loaded.iter().enumerate() {
            let (step, optimizer_steps) = (counters.step, counters.optimizer_steps);
            assert!(
                (step, optimizer_steps) == (2, 2),
                "{sharding} on {world_size} ranks: after loading, step {step} and optimizer_steps \
                 {optimizer_steps}, the checkpoint's are 2 and 2"
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
        assert!(
            !zero_moments,
            "{sharding} on {world_size} ranks: every rank's moments are zero after loading a checkpoint of 2 steps, \
             whose moments are not.{}",
            cause(Some(mistake(15, "moments_not_loaded")))
        );
    }
    // On one rank each unit's moments are whole buffers too: each parameter's must be the saved one.
    let moments = ok(
        spawn(1, |pg| {
            let mut trainer = fsdp_trainer(Box::new(pg), fsdp(ShardingStrategy::FullShard), train_config(1.0));
            Train::load_checkpoint(&mut trainer, &dir)?;
            let mut named = vec![];
            for unit in units(&trainer).units.iter() {
                let local = unit.local_state()?;
                for (kind, flat) in [&local.exp_avg, &local.exp_avg_sq].into_iter().enumerate() {
                    let whole = unit.layout.unflatten(flat)?;
                    named.extend(whole.into_iter().map(|(name, t)| (AdamW::moment_names(&name)[kind].clone(), t)));
                }
            }
            Ok(named)
        }),
        "one rank loading",
    );
    for (moment_name, got) in &moments[0] {
        assert!(
            bit_equal(got, &saved.optimizer[moment_name]),
            "on one rank, `{moment_name}` after loading is not what was saved: the moments come as [exp_avg, \
             exp_avg_sq], each by parameter name"
        );
    }
}

/// Saved before the first step, the checkpoint holds no moments: loading it
/// starts AdamW afresh, and the next step is the uninterrupted run's first.
#[test]
fn a_checkpoint_from_before_the_first_step_resumes() {
    let dir = scratch_dir("ex15-step-0");
    let full = fsdp(ShardingStrategy::FullShard);
    let straight = ok(spawn(2, |pg| Ok(gather_params(&trained(pg, full, 1)))), "uninterrupted ranks");
    ok(
        spawn(2, |pg| {
            save(&trained(pg, full, 0), &dir);
            Ok(())
        }),
        "ranks saving before the first step",
    );
    let resumed = ok(
        spawn(2, |pg| {
            let mut trainer = fsdp_trainer(Box::new(pg), full, train_config(1.0));
            Train::load_checkpoint(&mut trainer, &dir)?;
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

/// Training 3 steps equals training 2, saving, loading into fresh ranks
/// and training 1 more, bit for bit; and Phase 2's trainer reads the file.
#[test]
fn resuming_reproduces_the_uninterrupted_run_bit_for_bit() {
    let dir = scratch_dir("ex15-resume");
    let full = fsdp(ShardingStrategy::FullShard);
    let straight = ok(spawn(2, |pg| Ok(gather_params(&trained(pg, full, 3)))), "uninterrupted ranks");
    let saved = ok(
        spawn(2, |pg| {
            let trainer = trained(pg, full, 2);
            save(&trainer, &dir);
            Ok(gather_params(&trainer))
        }),
        "ranks saving at step 2",
    );
    let resumed = ok(
        spawn(2, |pg| {
            let mut trainer = fsdp_trainer(Box::new(pg), full, train_config(1.0));
            Train::load_checkpoint(&mut trainer, &dir)?;
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
    // The parameters came back whole; what else a step reads is AdamW's moments.
    for (name, want) in &straight[0] {
        assert!(
            bit_equal(&stepped[name], want),
            "`{name}` one step after resuming differs from the uninterrupted run, though the parameters loaded \
             right: the step reads the moments besides, which the save hands on and the load cuts up"
        );
    }
    let mut single = Trainer::new(
        &model_config(),
        init_params(&model_config(), 1, &Device::Cpu).unwrap(),
        train_config(1.0),
        Ddp::single(),
    )
    .unwrap();
    ok(single.load_checkpoint(&dir), "Phase 2's Trainer::load_checkpoint on an FSDP checkpoint");
}
