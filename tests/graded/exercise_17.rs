//! Exercise 17: AdamW with its state sharded (ZeRO stages 1 and 2). The
//! expected parameters come from AdamW written out here on plain f64 numbers
//! (PyTorch's `torch.optim.AdamW` step), applied to the average of the
//! ranks' gradients: sharding must change where the work is done, not what
//! it computes. A wrong result is compared with what each typical mistake
//! computes on the same numbers, and named only when it matches.

use std::time::Duration;

use candle_core::{Device, Tensor};
use rstest::rstest;
use workbook::distributed::{spawn_with_timeout, Collective, ProcessGroup};
use workbook::parallel::zero::ShardedAdamW;
use workbook::train::AdamWConfig;

use crate::process_ranks::on_processes;
use crate::support::{cause, explain_error, first_mismatch, mistake, number};

const TIMEOUT: Duration = Duration::from_secs(10);
const STEPS: usize = 3;
/// Off the defaults, so that a constant typed in place of a setting shows.
const CONFIG: AdamWConfig = AdamWConfig { beta1: 0.85, beta2: 0.97, eps: 3e-8 };
const LR: f64 = 2e-2;
const WEIGHT_DECAY: f64 = 0.07;

fn initial_params(len: usize) -> Vec<f64> {
    (0..len).map(|i| ((i * 5) % 9) as f64 * 0.3 - 1.1).collect()
}

/// Rank `rank`'s gradient at step `step`: differs per rank, step and element.
fn grad(rank: usize, step: usize, len: usize) -> Vec<f64> {
    (0..len).map(|i| (((rank * 3 + step * 7 + i * 2) % 13) as f64 - 6.0) * 0.05 + rank as f64 * 0.02).collect()
}

/// The ways of computing the step that this test can recognise.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Adam {
    Textbook,
    /// Moments recreated as zeros at every step.
    FreshMoments,
    /// Every rank updates shard 0 of the parameters with its own gradient shard.
    FirstShard,
    /// The weight decay left out.
    NoDecay,
    /// The decay without the learning rate: p · (1 − wd).
    DecayWithoutLr,
}

/// The parameters after `STEPS` steps of `kind` on `world` ranks, on plain numbers.
fn expected(kind: Adam, world: usize, len: usize) -> Vec<f64> {
    expected_after(STEPS, kind, world, len)
}

/// The parameters after `steps` steps of `kind` on `world` ranks.
fn expected_after(steps: usize, kind: Adam, world: usize, len: usize) -> Vec<f64> {
    let shard = len.div_ceil(world);
    let padded = |v: Vec<f64>| [v, vec![0.0; shard * world - len]].concat();
    let mut params = padded(initial_params(len));
    let (mut m, mut v) = (vec![0.0; params.len()], vec![0.0; params.len()]);
    for step in 0..steps {
        let grads: Vec<Vec<f64>> = (0..world).map(|r| padded(grad(r, step, len))).collect();
        let mean: Vec<f64> =
            (0..params.len()).map(|i| grads.iter().map(|g| g[i]).sum::<f64>() / world as f64).collect();
        if kind == Adam::FreshMoments {
            (m, v) = (vec![0.0; params.len()], vec![0.0; params.len()]);
        }
        let t = step as i32 + 1;
        let (c1, c2) = (1.0 - CONFIG.beta1.powi(t), 1.0 - CONFIG.beta2.powi(t));
        let mut next = params.clone();
        for i in 0..params.len() {
            // The element whose parameter rank (i / shard) updates into slot i.
            let source = if kind == Adam::FirstShard { i % shard } else { i };
            m[i] = CONFIG.beta1 * m[i] + (1.0 - CONFIG.beta1) * mean[i];
            v[i] = CONFIG.beta2 * v[i] + (1.0 - CONFIG.beta2) * mean[i] * mean[i];
            let shrink = match kind {
                Adam::NoDecay => 1.0,
                Adam::DecayWithoutLr => 1.0 - WEIGHT_DECAY,
                _ => 1.0 - LR * WEIGHT_DECAY,
            };
            let decayed = params[source] * shrink;
            next[i] = decayed - LR * (m[i] / c1) / ((v[i] / c2).sqrt() + CONFIG.eps);
        }
        params = next;
    }
    params.truncate(len);
    params
}

/// What one rank ends with: its parameters after `STEPS` steps, the state it
/// holds, and the collectives of its last step.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct RankRun {
    params: Vec<f32>,
    /// The first moment after the first step: (1 − β₁) times the reduced gradient shard.
    first_exp_avg: Option<Vec<f32>>,
    state_elements: usize,
    last_step: [u64; 3],
}

/// The learner's `ShardedAdamW` for `STEPS` steps on rank `pg`.
fn train(pg: &dyn ProcessGroup, len: usize) -> candle_core::Result<RankRun> {
    let mut optimizer = ShardedAdamW::new(CONFIG, WEIGHT_DECAY);
    let as_tensor = |v: Vec<f64>| Tensor::from_vec(v.iter().map(|&x| x as f32).collect::<Vec<_>>(), len, &Device::Cpu);
    let mut params = as_tensor(initial_params(len))?;
    let mut last_step = [0; 3];
    let mut first_exp_avg = None;
    for step in 0..STEPS {
        let before = pg.stats();
        params = optimizer.step(pg, &params, &as_tensor(grad(pg.rank(), step, len))?, LR)?;
        if params.elem_count() != len {
            let padded = (params.elem_count() == len.div_ceil(pg.world_size()) * pg.world_size())
                .then(|| mistake(17, "padding_not_stripped"));
            candle_core::bail!(
                "the step returned {} elements for {len} parameters{}",
                params.elem_count(),
                cause(padded)
            );
        }
        if step == 0 {
            first_exp_avg = optimizer.exp_avg().map(|m| m.flatten_all()?.to_vec1()).transpose()?;
        }
        let used = pg.stats().since(&before);
        last_step = [Collective::ReduceScatter, Collective::AllGather, Collective::AllReduce].map(|c| used.calls(c));
    }
    let params = params.flatten_all()?.to_vec1()?;
    Ok(RankRun { params, first_exp_avg, state_elements: optimizer.state_elements(), last_step })
}

fn run(world: usize, len: usize) -> Vec<RankRun> {
    spawn_with_timeout(world, TIMEOUT, |pg| train(&pg, len))
        .unwrap_or_else(|e| panic!("ShardedAdamW::step on {world} ranks failed: {}", explain_error(&e)))
}

fn close(got: &[f32], want: &[f64]) -> bool {
    first_mismatch(got, want, near).is_none()
}

fn near(got: f64, want: f64) -> bool {
    (got - want).abs() <= 1e-5 + 1e-5 * want.abs()
}

/// What [`near`] allows, for a message: a miss beyond it is no rounding.
const NEAR: &str = "apart by more than the 1e-5 + 1e-5·|expected| that f32's rounding stays within";

/// Which typical mistake gives exactly `got`, if one does.
fn diagnose(got: &[f32], world: usize, len: usize) -> Option<&'static str> {
    if got.iter().any(|x| !x.is_finite()) {
        return Some(mistake(17, "step_not_counted"));
    }
    let kinds = [
        (Adam::FreshMoments, "moments_not_kept"),
        (Adam::NoDecay, "decay_left_out"),
        (Adam::DecayWithoutLr, "decay_without_lr"),
    ];
    // On one rank every rank's shard is shard 0: updating the first shard is no mistake there.
    let shards = (world > 1).then_some((Adam::FirstShard, "wrong_shard"));
    kinds
        .into_iter()
        .chain(shards)
        .find(|(kind, _)| close(got, &expected(*kind, world, len)))
        .map(|(_, id)| mistake(17, id))
}

/// `update_shard` alone, on a shard of `len` elements and gradients that
/// stand for its average gradient: the parameters after each of `STEPS`
/// calls, and the optimizer state held.
fn update_one_shard(len: usize) -> candle_core::Result<(Vec<Vec<f32>>, usize)> {
    let mut optimizer = ShardedAdamW::new(CONFIG, WEIGHT_DECAY);
    let as_tensor = |v: Vec<f64>| Tensor::from_vec(v.iter().map(|&x| x as f32).collect::<Vec<_>>(), len, &Device::Cpu);
    let mut shard = as_tensor(initial_params(len))?;
    let mut after_each = vec![];
    for step in 0..STEPS {
        shard = optimizer.update_shard(&shard, &as_tensor(grad(0, step, len))?, LR)?;
        if shard.dims() != [len] {
            candle_core::bail!("update_shard returned shape {:?} for a shard of {len} elements", shard.dims());
        }
        after_each.push(shard.to_vec1()?);
    }
    Ok((after_each, optimizer.state_elements()))
}

/// A shard's update is AdamW's, on that shard's elements and nothing else:
/// no collective, moments the size of the shard.
#[test]
fn a_shard_is_updated_as_adamw_updates_it() {
    let len = 7;
    let (after_each, state) =
        update_one_shard(len).unwrap_or_else(|e| panic!("ShardedAdamW::update_shard failed: {}", explain_error(&e)));
    let differs =
        |call: usize| first_mismatch(&after_each[call], &expected_after(call + 1, Adam::Textbook, 1, len), near);
    if let Some((call, difference)) = (0..STEPS).find_map(|call| Some((call, differs(call)?))) {
        panic!(
            "update_shard on a {len}-element shard, called {STEPS} times, differs from AdamW's steps on it from \
             call {} on: after it, {difference} ({NEAR}){}",
            call + 1,
            cause(diagnose(&after_each[STEPS - 1], 1, len))
        );
    }
    assert!(
        state == 2 * len,
        "update_shard keeps {state} elements of optimizer state for a {len}-element shard; its two moments are {}",
        2 * len
    );
}

/// 12 elements shard evenly on 1–4 ranks; 10 need padding on 3 and 4.
#[rstest]
fn sharded_steps_reach_what_adamw_reaches_on_the_average_gradient(
    #[values(1, 2, 3, 4)] world: usize,
    #[values(12, 10)] len: usize,
) {
    let want = expected(Adam::Textbook, world, len);
    for (rank, got) in run(world, len).iter().enumerate() {
        if close(&got.params, &want) {
            continue;
        }
        let detail = match got.params.iter().zip(&want).position(|(&g, &w)| !close(&[g], &[w])) {
            Some(i) => format!(
                "element {i} (shard {}) is {}, expected {} ({NEAR})",
                i / len.div_ceil(world),
                number(got.params[i] as f64),
                number(want[i])
            ),
            None => String::new(),
        };
        panic!(
            "after {STEPS} steps on {world} ranks, rank {rank}'s parameters differ from AdamW on the average \
             gradient: {detail}{}",
            cause(diagnose(&got.params, world, len))
        );
    }
}

#[rstest]
fn each_rank_keeps_the_moments_of_its_shard_only(#[values(2, 3, 4)] world: usize) {
    let len: usize = 10;
    let shard = len.div_ceil(world);
    for (rank, got) in run(world, len).iter().enumerate() {
        let whole = (got.state_elements >= 2 * len).then(|| mistake(17, "whole_state_kept"));
        assert!(
            got.state_elements == 2 * shard,
            "rank {rank} of {world} holds {} elements of optimizer state; its two moments of a {shard}-element \
             shard are {}{}",
            got.state_elements,
            2 * shard,
            cause(whole)
        );
    }
}

/// Adam's update is blind to a gradient's scale, its moments are not: the
/// first moment after one step is (1 − β₁) times the reduced gradient shard.
#[rstest]
fn the_first_moment_holds_the_average_gradient_shard(#[values(2, 3)] world: usize) {
    let len: usize = 10;
    let shard = len.div_ceil(world);
    let mean: Vec<f64> = (0..shard * world)
        .map(|i| if i < len { (0..world).map(|r| grad(r, 0, len)[i]).sum::<f64>() / world as f64 } else { 0.0 })
        .collect();
    for (rank, got) in run(world, len).iter().enumerate() {
        let Some(exp_avg) = &got.first_exp_avg else {
            panic!("rank {rank} of {world} holds no moments after its first step: keep them in self.moments");
        };
        let want: Vec<f64> = mean[rank * shard..(rank + 1) * shard].iter().map(|g| (1.0 - CONFIG.beta1) * g).collect();
        if close(exp_avg, &want) {
            continue;
        }
        let scaled: Vec<f64> = want.iter().map(|w| w * world as f64).collect();
        let summed = close(exp_avg, &scaled).then(|| mistake(17, "gradient_summed"));
        let detail = match exp_avg.iter().zip(&want).position(|(&g, &w)| !close(&[g], &[w])) {
            Some(i) => format!("element {i} is {}, expected {}", number(exp_avg[i] as f64), number(want[i])),
            None => format!("it has {} elements, expected {shard}", exp_avg.len()),
        };
        panic!(
            "rank {rank} of {world}: the first moment after one step is not (1 − β₁) times its shard of the \
             average gradient: {detail}{}",
            cause(summed)
        );
    }
}

#[rstest]
fn a_step_communicates_no_more_than_one_all_reduce_would(#[values(2, 3)] world: usize) {
    for (rank, got) in run(world, 10).iter().enumerate() {
        let [reduce_scatters, all_gathers, all_reduces] = got.last_step;
        let whole = (all_reduces > 0).then(|| mistake(17, "all_reduce_used"));
        assert!(
            (reduce_scatters, all_gathers, all_reduces) == (1, 1, 0),
            "rank {rank}'s step made {reduce_scatters} reduce-scatter(s), {all_gathers} all-gather(s) and \
             {all_reduces} all-reduce(s); ZeRO's step is one reduce-scatter and one all-gather{}",
            cause(whole)
        );
    }
}

/// Each rank a process, the shards over TCP.
#[test]
fn it_runs_across_processes_over_tcp() {
    let (world, len) = (2, 10);
    let runs: Vec<RankRun> = on_processes(world, |pg| train(&pg, len));
    let want = expected(Adam::Textbook, world, len);
    for (rank, got) in runs.iter().enumerate() {
        if let Some(difference) = first_mismatch(&got.params, &want, near) {
            panic!("rank {rank}'s process: its parameters after the steps: {difference}");
        }
    }
}
