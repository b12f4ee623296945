//! Exercise 18: PowerSGD. The expected estimates, the error feedback and
//! what each typical mistake gives come from PyTorch
//! (`tests/fixtures/generate.py`), run on the same gradients from the same
//! first Q (the runtime's seeded draw, checked here against the fixture's); a
//! rank-r gradient must come through exactly, which needs no reference at
//! all. A wrong estimate is named only when it equals a mistake's.

use std::time::Duration;

use candle_core::{Device, Tensor};
use rstest::rstest;
use workbook::distributed::{spawn_with_timeout, Collective, ProcessGroup};
use workbook::init_params;
use workbook::parallel::ddp::Ddp;
use workbook::parallel::powersgd::PowerSgd;
use workbook::train::{CosineSchedule, LrSchedule, Trainer};

use crate::fsdp_runs::{model_config, rows_of, train_config, GLOBAL_BATCH, SEQ_LEN};
use crate::process_ranks::on_processes;
use crate::support::{cause, explain_error, fixture, mistake, number, Fixture};

const TIMEOUT: Duration = Duration::from_secs(10);
/// A (6, 5) gradient at rank 2: two all-reduces of 12 and 10 numbers instead of one of 30.
const N: usize = 6;
const M: usize = 5;
const R: usize = 2;
const SEED: u64 = 11;
const STEPS: usize = 3;
/// The mistakes whose estimates the fixture holds, on 2 and 3 ranks.
const MISTAKES: [&str; 4] = ["no_error_feedback", "no_warm_start", "not_orthogonalized", "p_not_averaged"];

type Matrix = Vec<Vec<f64>>;

fn matmul(a: &Matrix, b: &Matrix) -> Matrix {
    let inner = b.len();
    a.iter().map(|row| (0..b[0].len()).map(|j| (0..inner).map(|k| row[k] * b[k][j]).sum()).collect()).collect()
}

fn transpose(a: &Matrix) -> Matrix {
    (0..a[0].len()).map(|j| a.iter().map(|row| row[j]).collect()).collect()
}

fn mean(ms: &[Matrix]) -> Matrix {
    let rows = ms[0].len();
    (0..rows)
        .map(|i| (0..ms[0][i].len()).map(|j| ms.iter().map(|m| m[i][j]).sum::<f64>() / ms.len() as f64).collect())
        .collect()
}

/// Rank `rank`'s gradient at step `step`: full rank, different per rank and
/// step (the fixture's script computes the same).
fn grad(rank: usize, step: usize) -> Matrix {
    (0..N)
        .map(|i| (0..M).map(|j| (((i * 7 + j * 3 + rank * 5 + step * 11) % 17) as f64 - 8.0) * 0.1).collect())
        .collect()
}

fn matrix(t: &Tensor) -> Matrix {
    let rows = t.to_vec2::<f32>().expect("a matrix");
    rows.iter().map(|row| row.iter().map(|&x| x as f64).collect()).collect()
}

/// The fixture, once the runtime is seen to draw the first Q it was made from.
fn reference() -> Fixture {
    let f = fixture(18);
    let drawn = PowerSgd::new(R, SEED).initial_q(M, &Device::Cpu).expect("initial_q");
    assert!(
        matrix(&drawn) == matrix(&f.get("q0")),
        "PowerSgd::new({R}, {SEED}).initial_q({M}) no longer draws the fixture's first Q: the workbook's seeded \
         draws changed, so tests/fixtures/generate.py must be given the new Q and run again"
    );
    f
}

/// What `key` holds for each step and rank of a run on `world` ranks.
fn per_step_and_rank(f: &Fixture, key: &str, world: usize) -> Vec<Vec<Matrix>> {
    (0..STEPS).map(|s| (0..world).map(|r| matrix(&f.get(&format!("{key}.w{world}.s{s}.r{r}")))).collect()).collect()
}

/// What one rank saw: its estimate at every step, its error after the last
/// step, and its last step's all-reduces as (calls, payload bytes).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct RankRun {
    estimates: Vec<Vec<Vec<f32>>>,
    error: Option<Vec<Vec<f32>>>,
    /// The shape of the Q kept for the next step.
    kept_q: Option<Vec<usize>>,
    all_reduces: (u64, u64),
}

fn as_tensor(m: &Matrix) -> candle_core::Result<Tensor> {
    let flat: Vec<f32> = m.iter().flatten().map(|&x| x as f32).collect();
    Tensor::from_vec(flat, (m.len(), m[0].len()), &Device::Cpu)
}

/// The learner's PowerSGD on rank `pg` over `grads[step][rank]`.
fn compress(pg: &dyn ProcessGroup, grads: &[Vec<Matrix>]) -> candle_core::Result<RankRun> {
    let mut state = PowerSgd::new(R, SEED);
    let mut estimates = vec![];
    let mut all_reduces = (0, 0);
    for step_grads in grads {
        let before = pg.stats();
        estimates.push(state.all_reduce(pg, &as_tensor(&step_grads[pg.rank()])?)?.to_vec2::<f32>()?);
        let used = pg.stats().since(&before);
        all_reduces = (used.calls(Collective::AllReduce), used.bytes(Collective::AllReduce));
    }
    let error = state.error().map(|e| e.to_vec2::<f32>()).transpose()?;
    let kept_q = state.q().map(|q| q.dims().to_vec());
    Ok(RankRun { estimates, error, kept_q, all_reduces })
}

fn run(grads: &[Vec<Matrix>]) -> Vec<RankRun> {
    let world = grads[0].len();
    spawn_with_timeout(world, TIMEOUT, |pg| compress(&pg, grads))
        .unwrap_or_else(|e| panic!("PowerSgd::all_reduce on {world} ranks failed: {}", explain_error(&e)))
}

fn close(got: &[Vec<f32>], want: &Matrix) -> bool {
    first_difference(got, want).is_none()
}

/// Where `got` first leaves `want`: `element [i, j] is x, expected y`, or the shapes.
fn first_difference(got: &[Vec<f32>], want: &Matrix) -> Option<String> {
    let shape = |rows: usize, cols: Option<usize>| format!("({rows}, {})", cols.unwrap_or(0));
    if got.len() != want.len() || got.iter().zip(want).any(|(g, w)| g.len() != w.len()) {
        return Some(format!(
            "it is {}, expected {}",
            shape(got.len(), got.first().map(Vec::len)),
            shape(want.len(), want.first().map(Vec::len))
        ));
    }
    let (i, j) = (0..got.len()).flat_map(|i| (0..got[i].len()).map(move |j| (i, j))).find(|&(i, j)| {
        let (g, w) = (got[i][j] as f64, want[i][j]);
        g.is_nan() || (g - w).abs() > 1e-4 + 1e-4 * w.abs()
    })?;
    Some(format!("element [{i}, {j}] is {}, expected {}", number(got[i][j] as f64), number(want[i][j])))
}

fn steps_of(world: usize) -> Vec<Vec<Matrix>> {
    (0..STEPS).map(|step| (0..world).map(|r| grad(r, step)).collect()).collect()
}

/// The mistake whose estimates the ranks' equal, if exactly one's.
fn diagnose(runs: &[RankRun], f: &Fixture) -> Option<&'static str> {
    let world = runs.len();
    if world < 2 {
        return None; // one rank: averaging changes nothing, so the mistakes are not all apart
    }
    let equals = |id: &&&str| {
        let want = per_step_and_rank(f, &format!("mistake_{id}"), world);
        runs.iter().enumerate().all(|(r, run)| run.estimates.iter().zip(&want).all(|(got, step)| close(got, &step[r])))
    };
    let mut matching = MISTAKES.iter().filter(equals);
    match (matching.next(), matching.next()) {
        (Some(id), None) => Some(mistake(18, id)),
        _ => None,
    }
}

/// Gradients G_k = A B_kᵀ share their column space, so their average has
/// rank r: one power-iteration step recovers it exactly, whatever Q starts as.
#[rstest]
fn a_rank_r_gradient_comes_through_exactly(#[values(2, 3)] world: usize) {
    let a: Matrix = (0..N).map(|i| (0..R).map(|k| ((i * 3 + k * 5) % 7) as f64 * 0.2 - 0.5).collect()).collect();
    let b = |rank: usize| -> Matrix {
        (0..M).map(|j| (0..R).map(|k| ((j * 2 + k * 3 + rank * 4) % 5) as f64 * 0.3 - 0.4).collect()).collect()
    };
    let grads: Vec<Matrix> = (0..world).map(|r| matmul(&a, &transpose(&b(r)))).collect();
    let average = mean(&grads);
    for (rank, run) in run(&[grads]).iter().enumerate() {
        if let Some(difference) = first_difference(&run.estimates[0], &average) {
            panic!("rank {rank}: a gradient of rank {R} did not come through exactly: {difference}");
        }
    }
}

#[rstest]
fn estimates_match_powersgd_on_the_same_numbers(#[values(1, 2, 3)] world: usize) {
    let f = reference();
    let want = per_step_and_rank(&f, "estimate", world);
    let runs = run(&steps_of(world));
    for (rank, run) in runs.iter().enumerate() {
        if let Some((step, difference)) =
            (0..STEPS).find_map(|s| Some((s, first_difference(&run.estimates[s], &want[s][rank])?)))
        {
            let agree = runs.iter().all(|other| other.estimates[step] == runs[0].estimates[step]);
            panic!(
                "on {world} ranks, rank {rank}'s estimate at step {step} differs from PowerSGD's: {difference}{}{}",
                if agree { "" } else { "; the ranks do not even agree with each other" },
                cause(diagnose(&runs, &f))
            );
        }
    }
}

#[test]
fn the_error_feedback_is_what_compression_left_out() {
    let f = reference();
    let estimates = per_step_and_rank(&f, "estimate", 2);
    for (rank, run) in run(&steps_of(2)).iter().enumerate() {
        let Some(error) = &run.error else {
            panic!(
                "rank {rank} keeps no error feedback after {STEPS} steps{}",
                cause(Some(mistake(18, "no_error_feedback")))
            );
        };
        let want = matrix(&f.get(&format!("error.w2.r{rank}")));
        if let Some(difference) = first_difference(error, &want) {
            // The error feedback is only the one to blame where the estimates it was computed beside are right.
            match (0..STEPS).find(|&s| first_difference(&run.estimates[s], &estimates[s][rank]).is_some()) {
                Some(step) => panic!(
                    "rank {rank}'s error feedback after {STEPS} steps differs from PowerSGD's: {difference}; its \
                     estimate already differs at step {step} (estimates_match_powersgd_on_the_same_numbers shows \
                     where), so look there first"
                ),
                None => panic!("rank {rank}'s error feedback after {STEPS} steps is not M − P̂Qᵀ: {difference}"),
            }
        }
        let no_warm_start = run.kept_q.is_none().then(|| mistake(18, "no_warm_start"));
        assert!(
            run.kept_q.as_deref() == Some(&[M, R][..]),
            "rank {rank} keeps Q of shape {:?} for its next step, expected [{M}, {R}]{}",
            run.kept_q,
            cause(no_warm_start)
        );
    }
}

#[rstest]
fn a_step_all_reduces_two_thin_factors(#[values(2, 3)] world: usize) {
    let want_bytes = ((N + M) * R * 4) as u64;
    for (rank, run) in run(&steps_of(world)).iter().enumerate() {
        let (calls, bytes) = run.all_reduces;
        let whole = (bytes >= (N * M * 4) as u64).then(|| mistake(18, "whole_gradient_reduced"));
        assert!(
            (calls, bytes) == (2, want_bytes),
            "rank {rank}'s step all-reduced {calls} tensor(s) of {bytes} bytes; PowerSGD all-reduces P ({N}×{R}) \
             and Q ({M}×{R}): 2 of {want_bytes} bytes together{}",
            cause(whole)
        );
    }
}

/// Each rank a process, the factors over TCP.
#[test]
fn it_runs_across_processes_over_tcp() {
    let grads = steps_of(2);
    let runs: Vec<RankRun> = on_processes(2, |pg| compress(&pg, &grads));
    let want = per_step_and_rank(&reference(), "estimate", 2);
    for (rank, run) in runs.iter().enumerate() {
        for (step, (got, want)) in run.estimates.iter().zip(&want).enumerate() {
            if let Some(difference) = first_difference(got, &want[rank]) {
                panic!("rank {rank}'s process, step {step}: the estimate differs from PowerSGD's: {difference}");
            }
        }
    }
}

/// Token sequences with structure to learn: the 64 tokens form 4 groups of
/// 16, a token of group g is followed by one of group g + 1 (mod 4), and
/// which one follows a pattern of the row and the position.
fn patterned_batch(step: usize) -> Tensor {
    let rows: Vec<u32> = (0..GLOBAL_BATCH)
        .flat_map(|row| {
            let start = step * GLOBAL_BATCH + row;
            (0..SEQ_LEN).map(move |i| {
                let group = (start + i) % 4;
                let within = (start * 31 + i * 17 + i * i * 7) % 16;
                (group * 16 + within) as u32
            })
        })
        .collect();
    Tensor::from_vec(rows, (GLOBAL_BATCH, SEQ_LEN), &Device::Cpu).unwrap()
}

/// Rank 0's loss at each of `steps` DDP steps on 2 thread ranks, with
/// PowerSGD at `approx_rank` or (`None`) whole gradients.
fn ddp_losses(approx_rank: Option<usize>, steps: usize) -> Vec<f64> {
    let mut config = train_config(1.0);
    config.grad_accum_steps = 1;
    config.schedule =
        LrSchedule::Cosine(CosineSchedule { max_lr: 1e-2, min_lr: 1e-3, warmup_steps: 1, max_steps: steps });
    let losses = spawn_with_timeout(2, Duration::from_secs(60), |pg| {
        let rank = pg.rank();
        let ddp = match approx_rank {
            Some(r) => Ddp::new(Box::new(pg)).with_powersgd(r),
            None => Ddp::new(Box::new(pg)),
        };
        let mut trainer = Trainer::new(&model_config(), init_params(&model_config(), 7, &Device::Cpu)?, config, ddp)?;
        (0..steps).map(|s| Ok(trainer.train_step(&[rows_of(&patterned_batch(s), rank, 2)])?.loss)).collect()
    });
    let mut losses: Vec<Vec<f64>> =
        losses.unwrap_or_else(|e| panic!("DDP with PowerSGD failed: {}", explain_error(&e)));
    losses.swap_remove(0)
}

/// The trainer's `--powersgd-rank 2` runs your `all_reduce` on every matrix
/// gradient: the model must learn about as well as with whole gradients.
#[test]
fn the_model_still_trains_with_its_gradients_compressed() {
    const STEPS: usize = 30;
    let whole = ddp_losses(None, STEPS);
    let compressed = ddp_losses(Some(2), STEPS);
    let tail = |losses: &[f64]| losses[STEPS - 5..].iter().sum::<f64>() / 5.0;
    let (start, whole_end, compressed_end) = (whole[0], tail(&whole), tail(&compressed));
    // Measured with the reference: rank 2 keeps about 3/4 of the drop (2/3 without
    // error feedback or warm start); an estimate that carries nothing keeps far less.
    let allowed = whole_end + 0.5 * (start - whole_end);
    assert!(
        compressed_end <= allowed,
        "after {STEPS} DDP steps on 2 ranks the loss is {} with PowerSGD at rank 2 and {} with whole gradients \
         (from {}): compression may cost at most half of the drop, a loss of {} at most",
        number(compressed_end),
        number(whole_end),
        number(start),
        number(allowed)
    );
}
