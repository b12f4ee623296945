//! Exercise 10: the train step. Reference: tests/fixtures/generate.py, `exercise_10`
//! (two PyTorch optimizer steps of two micro-batches each). The data-parallel
//! checks run two CPU ranks as threads.

use candle_core::{DType, Tensor};
use workbook::distributed::{spawn, Collective, ProcessGroup};
use workbook::parallel::ddp::Ddp;
use workbook::train::{AdamWConfig, CosineSchedule, LrSchedule, OptimizerConfig, StepStats, TrainConfig, Trainer};
use workbook::{param_specs, GptConfig, ParamStore};

use crate::support::{bit_equal, cause, expect_update_close, fixture, mistake, ok, value_failure, Fixture};

/// Relative L2 error allowed on a parameter's update over two steps (see `expect_update_close`).
const UPDATE: f64 = 1e-3;

pub fn model_config(f: &Fixture) -> GptConfig {
    f.model_config()
}

pub fn train_config(f: &Fixture) -> TrainConfig {
    let h = f.get("hyper").to_vec1::<f64>().unwrap();
    TrainConfig {
        grad_accum_steps: h[0] as usize,
        max_grad_norm: h[1],
        schedule: LrSchedule::Cosine(CosineSchedule {
            max_lr: h[2],
            min_lr: h[3],
            warmup_steps: h[4] as usize,
            max_steps: h[5] as usize,
        }),
        optimizer: OptimizerConfig { weight_decay: h[6], adamw: AdamWConfig { beta1: h[7], beta2: h[8], eps: h[9] } },
        activation_checkpointing: false,
    }
}

pub fn trainer(f: &Fixture, ddp: Ddp) -> Trainer {
    let names = param_specs(&model_config(f)).into_iter().map(|s| s.name);
    let params = ParamStore::from_tensors(names.map(|n| {
        let t = f.get(&format!("param.{n}"));
        (n, t)
    }))
    .unwrap();
    ok(Trainer::new(&model_config(f), params, train_config(f), ddp), "Trainer::new (it calls param_groups, exercise 8)")
}

/// Micro-batch `j` of step `s`, as (B, T) u32 token ids.
pub fn micro_batch(f: &Fixture, s: usize, j: usize) -> Tensor {
    f.get("tokens").get(s).unwrap().get(j).unwrap().to_dtype(DType::U32).unwrap()
}

fn step(trainer: &mut Trainer, batches: &[Tensor]) -> StepStats {
    ok(trainer.train_step(batches), "Trainer::train_step")
}

fn close(a: f64, b: f64, rel: f64) -> bool {
    (a - b).abs() <= rel * b.abs().max(1e-12)
}

#[test]
fn two_steps_match_pytorch() {
    let f = fixture(10);
    let mut t = trainer(&f, Ddp::single());
    let k = train_config(&f).grad_accum_steps;
    let (losses, norms, lrs) = (
        f.get("loss").to_vec1::<f64>().unwrap(),
        f.get("grad_norm").to_vec1::<f64>().unwrap(),
        f.get("lr").to_vec1::<f64>().unwrap(),
    );
    for s in 0..2 {
        let batches: Vec<Tensor> = (0..k).map(|j| micro_batch(&f, s, j)).collect();
        let stats = step(&mut t, &batches);
        if !close(stats.lr, lrs[s], 1e-9) {
            let matched =
                (s + 1 < lrs.len() && close(stats.lr, lrs[s + 1], 1e-9)).then(|| mistake(10, "lr_after_increment"));
            panic!("{}", value_failure(&format!("step {s}: the learning rate"), stats.lr, lrs[s], matched));
        }
        if !close(stats.loss, losses[s], 1e-4) {
            let matched = close(stats.loss, losses[s] * k as f64, 1e-4).then(|| mistake(10, "losses_summed"));
            panic!("{}", value_failure(&format!("step {s}: the loss"), stats.loss, losses[s], matched));
        }
        if !close(stats.grad_norm, norms[s], 1e-4) {
            let known = f.mistakes_of("grad_norm", &["not_divided", "not_cleared"]);
            let matched = known
                .iter()
                .find(|(_, output)| close(stats.grad_norm, output.to_vec1::<f64>().unwrap()[s], 1e-4))
                .map(|(cause, _)| *cause);
            panic!("{}", value_failure(&format!("step {s}: the gradient norm"), stats.grad_norm, norms[s], matched));
        }
        let tokens = batches.iter().map(|b| b.elem_count()).sum::<usize>();
        assert!(
            stats.tokens == tokens,
            "step {s}: {} tokens reported, the micro-batches hold {tokens}: count every token of every micro-batch",
            stats.tokens
        );
    }
    assert!(
        t.step == 2,
        "after two calls to train_step, self.step is {}: each call is one optimizer step, so increment it once per call",
        t.step
    );
    for (name, var) in t.params.iter() {
        let before = f.get(&format!("param.{name}"));
        expect_update_close(
            &before,
            var,
            &f.get(&format!("after.{name}")),
            UPDATE,
            &format!("`{name}` after two steps"),
        );
    }
}

#[test]
fn gradient_buffer_is_empty_after_the_step() {
    let f = fixture(10);
    let mut t = trainer(&f, Ddp::single());
    step(&mut t, &[micro_batch(&f, 0, 0), micro_batch(&f, 0, 1)]);
    assert!(t.grads.is_empty(), "self.grads still holds gradients after the step: {}", mistake(10, "not_cleared"));
}

/// k micro-batches of B rows give the same step as one batch of k·B rows.
#[test]
fn accumulating_micro_batches_equals_one_large_batch() {
    let f = fixture(10);
    let mut accumulated = trainer(&f, Ddp::single());
    let mut large = trainer(&f, Ddp::single());
    for s in 0..2 {
        let (a, b) = (micro_batch(&f, s, 0), micro_batch(&f, s, 1));
        let small = step(&mut accumulated, &[a.clone(), b.clone()]);
        let big = step(&mut large, &[Tensor::cat(&[&a, &b], 0).unwrap()]);
        // Two micro-batches: each mistake scales by exactly 2 or 1/2.
        let scaled =
            |got: f64, want: f64, by: f64, id: &'static str| close(got, want * by, 1e-4).then(|| mistake(10, id));
        let norm_cause = scaled(small.grad_norm, big.grad_norm, 2.0, "not_divided").or(scaled(
            small.grad_norm,
            big.grad_norm,
            0.5,
            "divided_twice",
        ));
        assert!(
            close(small.grad_norm, big.grad_norm, 1e-4),
            "step {s}: 2 micro-batches give gradient norm {:.6}, one batch of both gives {:.6}.{}",
            small.grad_norm,
            big.grad_norm,
            cause(norm_cause)
        );
        assert!(
            close(small.loss, big.loss, 1e-4),
            "step {s}: 2 micro-batches report loss {:.6}, one batch of both {:.6}.{}",
            small.loss,
            big.loss,
            cause(scaled(small.loss, big.loss, 2.0, "losses_summed"))
        );
    }
    for (name, var) in accumulated.params.iter() {
        let before = f.get(&format!("param.{name}"));
        expect_update_close(
            &before,
            var,
            large.params.get(name).unwrap(),
            UPDATE,
            &format!("`{name}`: accumulated vs one large batch"),
        );
    }
}

/// Rank r trains on row r of every micro-batch; together they must take the
/// step one process takes on the whole batch. Clipping is active, so clipping
/// before averaging would show.
#[test]
fn two_ranks_equal_one_process_on_the_union_of_their_data() {
    let f = fixture(10);
    let mut single = trainer(&f, Ddp::single());
    let mut want = vec![];
    for s in 0..2 {
        want.push(step(&mut single, &[micro_batch(&f, s, 0), micro_batch(&f, s, 1)]));
    }
    let per_rank = ok(
        spawn(2, |pg| {
            let rank = pg.rank();
            let mut t = trainer(&f, Ddp::new(Box::new(pg)));
            let mut stats = vec![];
            for s in 0..2 {
                let mine: Vec<Tensor> = (0..2).map(|j| micro_batch(&f, s, j).narrow(0, rank, 1).unwrap()).collect();
                stats.push(t.train_step(&mine)?);
            }
            Ok((stats, t.params))
        }),
        "two ranks training",
    );
    // Step 0 starts from the same weights everywhere: a rank that took the
    // norm of its own gradients reports what one process on its rows alone does.
    let own_rows_norm = |rank: usize| {
        let mut alone = trainer(&f, Ddp::single());
        let mine: Vec<Tensor> = (0..2).map(|j| micro_batch(&f, 0, j).narrow(0, rank, 1).unwrap()).collect();
        step(&mut alone, &mine).grad_norm
    };
    let ranks_agree =
        per_rank[0].1.iter().all(|(name, var)| bit_equal(var.as_tensor(), per_rank[1].1.get(name).unwrap()));
    for (rank, (stats, params)) in per_rank.iter().enumerate() {
        for s in 0..2 {
            let own_norm = s == 0 && close(stats[s].grad_norm, own_rows_norm(rank), 1e-4);
            let established = match (own_norm, ranks_agree) {
                (true, true) => Some(mistake(10, "clip_before_sync")),
                (true, false) => Some(mistake(10, "never_synced")),
                (false, _) => None,
            };
            assert!(
                close(stats[s].grad_norm, want[s].grad_norm, 1e-4),
                "rank {rank}, step {s}: gradient norm {:.6}, one process on both ranks' data gives {:.6}.{}",
                stats[s].grad_norm,
                want[s].grad_norm,
                cause(established)
            );
        }
        for (name, var) in params.iter() {
            let what = format!("rank {rank}: `{name}` against one process on the union of the data");
            expect_update_close(&f.get(&format!("param.{name}")), var, single.params.get(name).unwrap(), UPDATE, &what);
        }
    }
}

/// Gradients are averaged once per optimizer step, after the last micro-batch, not once per micro-batch.
#[test]
fn one_gradient_synchronisation_per_optimizer_step() {
    let f = fixture(10);
    let counts = ok(
        spawn(2, |pg| {
            let rank = pg.rank();
            let mut t = trainer(&f, Ddp::new(Box::new(pg)));
            let before = t.ddp.process_group().stats();
            for s in 0..2 {
                let mine: Vec<Tensor> = (0..2).map(|j| micro_batch(&f, s, j).narrow(0, rank, 1).unwrap()).collect();
                t.train_step(&mine)?;
            }
            let all_reduces = t.ddp.process_group().stats().since(&before).calls(Collective::AllReduce);
            Ok((t.ddp.syncs(), all_reduces))
        }),
        "two ranks training",
    );
    for (rank, (syncs, all_reduces)) in counts.into_iter().enumerate() {
        let every_micro_batch = (syncs == 4).then(|| mistake(10, "sync_every_micro_batch"));
        assert!(
            syncs == 2,
            "rank {rank}: {syncs} gradient synchronisations in 2 optimizer steps of 2 micro-batches, expected 2.{}",
            cause(every_micro_batch)
        );
        // The tiny model's gradients fit one 25 MB bucket.
        assert!(all_reduces == 2, "rank {rank}: {all_reduces} all-reduces in 2 steps; expected one bucket per step");
    }
}
