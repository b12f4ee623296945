//! Exercise 11: checkpoint save and load. The reference here is the
//! uninterrupted run itself: resuming must reproduce it bit for bit.

use candle_core::{DType, Device, Tensor};
use workbook::data::{DataConfig, DatasetKind, SamplerState, Tokenizer};
use workbook::distributed::{spawn, Collective, ProcessGroup};
use workbook::parallel::ddp::Ddp;
use workbook::train::{DataPosition, Trainer};
use workbook::{param_specs, GptConfig, ParamStore};

use crate::exercise_10::{micro_batch, model_config, train_config, trainer};
use crate::support::{bit_equal, cause, fixture, mistake, ok, scratch_dir, Fixture};

fn train(t: &mut Trainer, f: &Fixture, step: usize) {
    ok(t.train_step(&[micro_batch(f, step, 0), micro_batch(f, step, 1)]), "Trainer::train_step");
}

/// One process trained for the fixture's first `steps` steps.
fn trained_for(f: &Fixture, steps: usize) -> Trainer {
    let mut t = trainer(f, Ddp::single());
    for step in 0..steps {
        train(&mut t, f, step);
    }
    t
}

/// A trainer for `config`, another model than the fixture's; its weights are ones.
fn trainer_of(f: &Fixture, config: &GptConfig) -> Trainer {
    let params = ParamStore::from_tensors(
        param_specs(config).into_iter().map(|s| (s.name, Tensor::ones(s.shape, DType::F32, &Device::Cpu).unwrap())),
    )
    .unwrap();
    ok(Trainer::new(config, params, train_config(f), Ddp::single()), "Trainer::new")
}

fn assert_same_params(got: &Trainer, want: &Trainer, what: &str) {
    for (name, var) in want.params.iter() {
        let mine = got.params.get(name).unwrap();
        assert!(bit_equal(mine, var), "{what}: `{name}` differs from the uninterrupted run");
    }
}

#[test]
fn round_trip_restores_every_piece_of_state() {
    let f = fixture(10);
    let dir = scratch_dir("ex11-round-trip").join("step_000001");
    let trained = trained_for(&f, 1);
    let position = DataPosition {
        config: DataConfig { kind: DatasetKind::Dummy, path: None, tokenizer: Tokenizer::Bytes, seq_len: 8, seed: 3 },
        sampler: SamplerState::at(2, 7, 3),
        held_out: 5,
    };
    ok(trained.save_checkpoint(&dir, Some(position.clone())), "save_checkpoint");

    let mut fresh = trainer(&f, Ddp::single());
    let restored = ok(fresh.load_checkpoint(&dir), "load_checkpoint");
    assert_same_params(&fresh, &trained, "after loading");
    assert!(
        fresh.step == 1,
        "self.step is {} after loading, the checkpoint's is 1: {}",
        fresh.step,
        mistake(11, "step_not_restored")
    );
    let optimizer_restored = mistake(11, "optimizer_not_restored");
    let (mine, theirs) = (fresh.optimizer.steps(), trained.optimizer.steps());
    assert!(
        mine == theirs,
        "AdamW's step count (its bias correction) is {mine} after loading, the checkpoint's {theirs}: {optimizer_restored}"
    );
    let (mine, theirs) = (fresh.optimizer.state_tensors(), trained.optimizer.state_tensors());
    assert!(
        mine.len() == theirs.len(),
        "{} optimizer state tensors after loading, {} saved: {optimizer_restored}",
        mine.len(),
        theirs.len()
    );
    for (key, t) in &theirs {
        assert!(bit_equal(&mine[key], t), "optimizer state `{key}` differs after loading: {optimizer_restored}");
    }
    assert!(
        restored == Some(position),
        "load_checkpoint returned {restored:?}: it must return the data position it saved"
    );
}

/// The trainer's step and AdamW's own count part ways when a step is skipped
/// (FSDP's fp16 loss scaler skips one on overflow): each is restored from its
/// own record.
#[test]
fn the_step_and_adamws_count_are_restored_separately() {
    let f = fixture(10);
    let dir = scratch_dir("ex11-skipped").join("step_000004");
    let mut trained = trained_for(&f, 1);
    trained.step += 3; // three steps that skipped the optimizer
    ok(trained.save_checkpoint(&dir, None), "save_checkpoint");
    let mut fresh = trainer(&f, Ddp::single());
    ok(fresh.load_checkpoint(&dir), "load_checkpoint");
    assert!(fresh.step == 4, "self.step is {} after loading, the checkpoint's is 4", fresh.step);
    let steps = fresh.optimizer.steps();
    let from_step = (steps == 4).then(|| mistake(11, "optimizer_steps_from_step"));
    assert!(steps == 1, "AdamW's step count is {steps} after loading, the checkpoint's is 1.{}", cause(from_step));
}

/// A checkpoint written before the first optimizer step (AdamW has no moments
/// yet) resumes like a fresh start.
#[test]
fn a_checkpoint_from_before_the_first_step_resumes() {
    let f = fixture(10);
    let dir = scratch_dir("ex11-step-zero").join("step_000000");
    let uninterrupted = trained_for(&f, 2);
    ok(trainer(&f, Ddp::single()).save_checkpoint(&dir, None), "save_checkpoint before any step");
    let mut resumed = trainer(&f, Ddp::single());
    ok(resumed.load_checkpoint(&dir), "load_checkpoint of a checkpoint from before any step");
    train(&mut resumed, &f, 0);
    train(&mut resumed, &f, 1);
    assert_same_params(&resumed, &uninterrupted, "after resuming from step 0 and training two steps");
}

/// Every rank, rank 0 included, waits once at a barrier after rank 0 wrote.
#[test]
fn every_rank_meets_one_barrier_when_saving() {
    let f = fixture(10);
    let root = scratch_dir("ex11-barrier");
    let barriers = ok(
        spawn(2, |pg| {
            let t = trainer(&f, Ddp::new(Box::new(pg)));
            let before = t.ddp.process_group().stats().calls(Collective::Barrier);
            t.save_checkpoint(&root.join("step_000000"), None)?;
            Ok(t.ddp.process_group().stats().calls(Collective::Barrier) - before)
        }),
        "two ranks saving",
    );
    for (rank, &count) in barriers.iter().enumerate() {
        let missing = (count == 0).then(|| mistake(11, "no_barrier"));
        assert!(
            count == 1,
            "rank {rank} met {count} barriers in save_checkpoint; every rank meets one, after rank 0 has written.{}",
            cause(missing)
        );
    }
}

/// Train 2 steps; or train 1, save, load into a fresh trainer, train 1 more. Same bits.
#[test]
fn resuming_reproduces_the_uninterrupted_run_bit_for_bit() {
    let f = fixture(10);
    let dir = scratch_dir("ex11-resume").join("step_000001");
    let uninterrupted = trained_for(&f, 2);

    let first_half = trained_for(&f, 1);
    ok(first_half.save_checkpoint(&dir, None), "save_checkpoint");
    drop(first_half);
    let mut resumed = trainer(&f, Ddp::single());
    ok(resumed.load_checkpoint(&dir), "load_checkpoint");
    train(&mut resumed, &f, 1);
    assert_same_params(
        &resumed,
        &uninterrupted,
        "after resuming and training one more step (are the optimizer's moments and the step restored?)",
    );
}

#[test]
fn only_rank_zero_writes() {
    let f = fixture(10);
    let root = scratch_dir("ex11-rank-zero");
    ok(
        spawn(2, |pg| {
            let rank = pg.rank();
            let t = trainer(&f, Ddp::new(Box::new(pg)));
            t.save_checkpoint(&root.join(format!("rank{rank}")), None)
        }),
        "two ranks saving",
    );
    assert!(root.join("rank0").exists(), "rank 0 wrote no checkpoint");
    assert!(!root.join("rank1").exists(), "rank 1 wrote a checkpoint: {}", mistake(11, "every_rank_writes"));
}

/// What DDP trained loads in a single process: the names carry no trace of the wrapper.
#[test]
fn a_checkpoint_written_under_ddp_loads_in_one_process() {
    let f = fixture(10);
    let dir = scratch_dir("ex11-ddp-to-single").join("step_000001");
    let trained = ok(
        spawn(2, |pg| {
            let rank = pg.rank();
            let mut t = trainer(&f, Ddp::new(Box::new(pg)));
            let mine: Vec<Tensor> = (0..2).map(|j| micro_batch(&f, 0, j).narrow(0, rank, 1).unwrap()).collect();
            t.train_step(&mine)?;
            t.save_checkpoint(&dir, None)?;
            Ok(t.params)
        }),
        "two ranks training and saving",
    );
    let mut single = trainer(&f, Ddp::single());
    ok(single.load_checkpoint(&dir), "load_checkpoint in one process");
    for (name, var) in trained[0].iter() {
        assert!(bit_equal(single.params.get(name).unwrap(), var), "`{name}` differs from what rank 0 trained");
    }
}

#[test]
fn refuses_a_checkpoint_of_another_model() {
    let f = fixture(10);
    let dir = scratch_dir("ex11-mismatch").join("step_000000");
    ok(trainer(&f, Ddp::single()).save_checkpoint(&dir, None), "save_checkpoint");
    let wider = GptConfig { hidden_size: 32, intermediate_size: 48, ..model_config(&f) };
    let mut other = trainer_of(&f, &wider);
    let err = match other.load_checkpoint(&dir) {
        Ok(_) => {
            panic!("a checkpoint of a 16-wide model loaded into a 32-wide one: {}", mistake(11, "no_fit_check"))
        }
        Err(e) => e.to_string(),
    };
    // A shape error means the copy began before anything compared the models.
    let copied_first = err.contains("shape mismatch");
    assert!(
        err.contains("different model"),
        "the error should say the checkpoint belongs to a different model, got: {err}{}",
        cause(copied_first.then(|| mistake(11, "no_fit_check")))
    );
}

/// Same shapes, another model: a norm eps of its own. Only a check of the
/// configs tells them apart.
#[test]
fn refuses_a_checkpoint_of_a_model_with_the_same_shapes() {
    let f = fixture(10);
    let dir = scratch_dir("ex11-same-shapes").join("step_000001");
    ok(trained_for(&f, 1).save_checkpoint(&dir, None), "save_checkpoint");
    let other_eps = GptConfig { norm_eps: 3e-5, ..model_config(&f) };
    let mut other = trainer_of(&f, &other_eps);
    // Moments and a step of its own, which the checkpoint's would overwrite.
    train(&mut other, &f, 0);
    let before = state_of(&other);
    assert!(
        other.load_checkpoint(&dir).is_err(),
        "a checkpoint of a model with norm_eps 1e-5 loaded into one with 3e-5, the same shapes: {}",
        mistake(11, "no_fit_check")
    );
    let after = state_of(&other);
    if let Some(((what, _), _)) = before.iter().zip(&after).find(|((_, a), (_, b))| !bit_equal(a, b)) {
        panic!(
            "load_checkpoint refused the checkpoint, but had already changed the trainer: its {what} is not \
             as before the call. A refused checkpoint must leave the trainer as it was"
        );
    }
    assert!(
        other.step == 1 && other.optimizer.steps() == 1,
        "load_checkpoint refused the checkpoint, but had already changed the trainer: step {} and AdamW's count {} \
         after one step. A refused checkpoint must leave the trainer as it was",
        other.step,
        other.optimizer.steps()
    );
}

/// Every tensor of a trainer's state, by what it is: parameters and AdamW's moments.
fn state_of(t: &Trainer) -> Vec<(String, Tensor)> {
    let params = t.params.iter().map(|(name, var)| (format!("parameter `{name}`"), var.as_tensor().clone()));
    let moments = t.optimizer.state_tensors().into_iter().map(|(name, m)| (format!("optimizer state `{name}`"), m));
    params.chain(moments).collect()
}
