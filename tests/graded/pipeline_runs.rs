//! What exercises 21 (GPipe) and 24 (1F1B) share: a pipelined step on one to
//! four stages of a 4-layer model, graded against one process, which runs the
//! whole model's forward (exercise 7) and backward on each micro-batch and
//! averages over the micro-batches. Each stage records the forwards and
//! backwards it ran, in order, and the process group counts the sends. The
//! two schedules compute the same gradients; only the order differs, which
//! each exercise's own tests check.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use candle_core::{DType, Device, Tensor};
use workbook::autograd::Gradients;
use workbook::distributed::{spawn_with_timeout, Collective, ProcessGroup, WithOverride};
use workbook::parallel::pipeline::StageOp::{Backward, Forward};
use workbook::parallel::pipeline::{bubble_fraction, stage_layers, PipelineStage, PipelineStep, StageOp};
use workbook::{init_params, Gpt, GptConfig, InitRng};

use crate::fsdp_runs::as_values;
use crate::process_ranks::on_processes;
use crate::support::{cause, every_rank, explain_error, first_scaled_difference, mistake, number};
use crate::synchronous_sends::{SendBoard, SynchronousSends};

const TIMEOUT: Duration = Duration::from_secs(20);
/// Micro-batches per step, each (B, T) tokens.
pub const M: usize = 4;
const B: usize = 2;
const T: usize = 8;
const HIDDEN: usize = 16;
const LAYERS: usize = 4;

type Grads = BTreeMap<String, Vec<f32>>;

/// A learner's pipelined step: which exercise, what it is called, the
/// function, and the ids under which the exercise lists the two mistakes
/// these shared checks name.
#[derive(Clone, Copy)]
pub struct Schedule {
    pub exercise: u32,
    pub name: &'static str,
    pub step: fn(&dyn ProcessGroup, &PipelineStage, &[Tensor]) -> candle_core::Result<PipelineStep>,
    /// The micro-batches' losses summed, not averaged, in the reported loss.
    pub loss_summed: &'static str,
    /// One micro-batch's share of the loss put in place of the others'.
    pub loss_overwritten: &'static str,
    /// Each micro-batch's backward started from 1, not 1/M.
    pub backward_from_one: &'static str,
    /// Each micro-batch's gradients replacing the previous ones'.
    pub gradients_not_accumulated: &'static str,
    /// Each micro-batch's share 1/M computed as 0: every backward starts from 0.
    pub zero_share: &'static str,
    /// A received activation used as it arrived, not made a `Var`, where
    /// the exercise lists that mistake.
    pub input_not_a_var: Option<&'static str>,
}

/// Four layers: one to four stages of whole blocks.
fn config() -> GptConfig {
    GptConfig {
        vocab_size: 32,
        hidden_size: HIDDEN,
        num_layers: LAYERS,
        num_heads: 2,
        num_kv_heads: None,
        intermediate_size: 32,
        max_seq_len: T,
        rope_theta: 10_000.0,
        norm_eps: 1e-5,
        bias: false,
        tie_word_embeddings: false,
    }
}

fn micro_batches(count: usize) -> Vec<Tensor> {
    let mut rng = InitRng::from_seed(21);
    (0..count)
        .map(|_| {
            let noise = rng.normal(&(B, T).into(), 1.0, &Device::Cpu).unwrap();
            (noise.abs().unwrap() * 12.0)
                .unwrap()
                .floor()
                .unwrap()
                .clamp(0.0, 31.0)
                .unwrap()
                .to_dtype(DType::U32)
                .unwrap()
        })
        .collect()
}

fn scaled(grads: &Grads, factor: f32) -> Grads {
    grads.iter().map(|(name, g)| (name.clone(), g.iter().map(|v| v * factor).collect())).collect()
}

/// One process: each micro-batch's loss and gradients, through the whole model.
struct Reference {
    losses: Vec<f32>,
    grads: Vec<Gradients>,
}

impl Reference {
    fn new(micro_batch_count: usize) -> Self {
        let params = init_params(&config(), 21, &Device::Cpu).unwrap();
        let model = Gpt::new(&config(), &params).unwrap();
        let (mut losses, mut grads) = (vec![], vec![]);
        for tokens in micro_batches(micro_batch_count) {
            let pass = model.forward(&tokens, Some(&tokens)).unwrap();
            losses.push(pass.loss.as_ref().unwrap().to_scalar::<f32>().unwrap());
            grads.push(Gradients::from_store(&params, &pass.backward().unwrap()).unwrap());
        }
        Self { losses, grads }
    }

    fn mean_loss(&self) -> f32 {
        self.losses.iter().sum::<f32>() / self.losses.len() as f32
    }

    /// The gradients of the step's loss, the mean over the micro-batches.
    fn mean_grads(&self) -> Grads {
        let mut mean = Gradients::default();
        for grads in &self.grads {
            mean.accumulate(grads).unwrap();
        }
        mean.scale(1.0 / self.grads.len() as f64).unwrap();
        as_values(mean.iter())
    }

    /// The gradients of micro-batch `m`'s loss alone.
    fn of_micro_batch(&self, m: usize) -> Grads {
        as_values(self.grads[m].iter())
    }
}

/// What one stage ends with.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct StageRun {
    /// The step's loss and gradients, or its error.
    step: Result<(Option<f32>, Grads), String>,
    pub schedule: Vec<StageOp>,
    /// (send calls, their bytes).
    sends: (u64, u64),
    /// Forwards run on an input that tracks no gradient (not a `Var`).
    untracked_inputs: usize,
}

fn stage_run(pg: &dyn ProcessGroup, schedule: Schedule, micro_batch_count: usize) -> candle_core::Result<StageRun> {
    let params = init_params(&config(), 21, &Device::Cpu)?;
    let stage = PipelineStage::new(&config(), &params, pg.rank(), pg.world_size())?;
    let before = pg.stats();
    let step =
        (schedule.step)(pg, &stage, &micro_batches(micro_batch_count)).map(|s| (s.loss, as_values(s.grads.iter())));
    let used = pg.stats().since(&before);
    Ok(StageRun {
        step: step.map_err(|e| explain_error(&e)),
        schedule: stage.take_schedule(),
        sends: (used.calls(Collective::Send), used.bytes(Collective::Send)),
        untracked_inputs: stage.take_untracked_inputs(),
    })
}

/// Every stage's step, or a failure naming the stages that failed.
fn steps(runs: &[StageRun], schedule: Schedule) -> Vec<(Option<f32>, Grads)> {
    every_rank(runs.iter().map(|run| &run.step), schedule.name, "stage")
}

/// `stages` thread ranks each running `schedule` over `micro_batch_count`
/// micro-batches; fails the test if a stage's step failed.
pub fn run(schedule: Schedule, stages: usize, micro_batch_count: usize) -> Vec<StageRun> {
    let runs = spawn_with_timeout(stages, TIMEOUT, |pg| stage_run(&pg, schedule, micro_batch_count))
        .unwrap_or_else(|e| panic!("the pipeline of {stages} stages failed: {}", explain_error(&e)));
    steps(&runs, schedule);
    runs
}

/// [`run`] where a send waits for its receive, as over NCCL: each stage's
/// step, or its error.
fn run_where_sends_wait(schedule: Schedule, stages: usize, micro_batch_count: usize) -> Vec<StageRun> {
    let board = SendBoard::new();
    spawn_with_timeout(stages, TIMEOUT, |pg| {
        let rank = pg.rank();
        let pg = WithOverride::new(Box::new(pg), SynchronousSends { board: Arc::clone(&board) });
        let run = stage_run(&pg, schedule, micro_batch_count);
        board.finish(rank);
        run
    })
    .unwrap_or_else(|e| panic!("the pipeline of {stages} stages failed: {}", explain_error(&e)))
}

/// Where a send waits for its receive (NCCL's sends do; the CPU backends
/// buffer them), the step still ends, with one process's gradients. A
/// deadlock is named `deadlocked`, the exercise's mistake where it lists
/// one, only when the stages' sends were seen waiting for each other in a
/// cycle.
pub fn expect_it_runs_where_sends_wait(schedule: Schedule, stages: usize, m: usize, deadlocked: Option<&str>) {
    let runs = run_where_sends_wait(schedule, stages, m);
    let failed: Vec<(usize, &String)> =
        runs.iter().enumerate().filter_map(|(s, run)| run.step.as_ref().err().map(|e| (s, e))).collect();
    // The stage that saw the cycle says most.
    let cycle_seen = |error: &String| error.contains("deadlock where a send waits for its receive");
    if let Some(&(s, error)) = failed.iter().find(|(_, e)| cycle_seen(e)).or(failed.first()) {
        let cycle = cycle_seen(error);
        panic!(
            "with {stages} stages and {m} micro-batches, where a send returns only once its receive is posted (as \
             over NCCL, on GPUs), stage {s}'s step failed: {error}{}",
            cause(deadlocked.filter(|_| cycle).map(|id| mistake(schedule.exercise, id)))
        );
    }
    let want = Reference::new(m).mean_grads();
    let got = steps(&runs, schedule);
    if let Some((s, difference)) =
        got.iter().enumerate().find_map(|(s, (_, g))| first_difference(g, &of_stage(&want, g)).map(|d| (s, d)))
    {
        panic!(
            "with {stages} stages and {m} micro-batches, where a send waits for its receive, stage {s}: {difference}"
        );
    }
}

/// The first parameter of `want` that `got` lacks or holds different values for.
fn first_difference(got: &Grads, want: &Grads) -> Option<String> {
    want.iter().find_map(|(name, w)| {
        let Some(g) = got.get(name) else { return Some(format!("`{name}` has no gradient")) };
        first_scaled_difference(g, w).map(|d| format!("`{name}`'s gradient: {d}"))
    })
}

fn matches(got: &Grads, want: &Grads) -> bool {
    got.keys().eq(want.keys()) && first_difference(got, want).is_none()
}

/// `grads` restricted to the parameters `stage` holds.
fn of_stage(grads: &Grads, got: &Grads) -> Grads {
    grads.iter().filter(|(name, _)| got.contains_key(*name)).map(|(n, g)| (n.clone(), g.clone())).collect()
}

/// Every stage's gradients equal one process's gradients of the mean loss
/// over `micro_batch_count` micro-batches, and the stages together cover
/// each parameter once.
pub fn expect_gradients_of_the_mean_loss(schedule: Schedule, stages: usize, micro_batch_count: usize) {
    let reference = Reference::new(micro_batch_count);
    let want = reference.mean_grads();
    let runs = run(schedule, stages, micro_batch_count);
    let got = steps(&runs, schedule);
    let mut held: Vec<&String> = got.iter().flat_map(|(_, grads)| grads.keys()).collect();
    held.sort();
    assert!(
        held.iter().copied().eq(want.keys()),
        "the {stages} stages' gradients should cover each of the model's {} parameters once; they cover {held:?}",
        want.len()
    );
    // Backward runs from the last stage to the first: the last stage that is wrong is where it starts.
    let Some(bad) = (0..stages).rev().find(|&s| !matches(&got[s].1, &of_stage(&want, &got[s].1))) else { return };
    let grads = &got[bad].1;
    let want_here = of_stage(&want, grads);
    let m = micro_batch_count;
    let one_micro_batch = [0, m - 1].iter().any(|&k| {
        let alone = of_stage(&reference.of_micro_batch(k), grads);
        matches(grads, &alone) || matches(grads, &scaled(&alone, 1.0 / m as f32))
    });
    let why = if matches(grads, &scaled(&want_here, m as f32)) {
        Some(mistake(schedule.exercise, schedule.backward_from_one))
    } else if zero_shares(&got) {
        Some(mistake(schedule.exercise, schedule.zero_share))
    } else if one_micro_batch {
        Some(mistake(schedule.exercise, schedule.gradients_not_accumulated))
    } else {
        input_not_a_var(&runs, bad, schedule)
    };
    let cut = match (why, bad + 1 < stages) {
        (None, true) => format!(
            "\n  Stage {}'s gradients are right and stage {bad}'s are not: look at what crosses that cut backward \
             (the gradient of stage {}'s input, for which micro-batch) and at how stage {bad} uses it.",
            bad + 1,
            bad + 1
        ),
        _ => String::new(),
    };
    panic!(
        "with {stages} stage(s) and {m} micro-batches, stage {bad} (layers {:?}): {}{cut}{}",
        stage_layers(LAYERS, stages, bad),
        first_difference(grads, &want_here).unwrap_or_else(|| "it holds other parameters".into()),
        cause(why)
    );
}

/// Whether the step's loss and every stage's every gradient are exactly 0:
/// each micro-batch's share 1/M was 0. (A loss of 0 alone could be a loss
/// never added to; gradients of 0 alone, a backward seeded apart from it.)
fn zero_shares(got: &[(Option<f32>, Grads)]) -> bool {
    let all_zero = |grads: &Grads| grads.values().all(|g| g.iter().all(|&v| v == 0.0));
    got.last().and_then(|(loss, _)| *loss) == Some(0.0) && got.iter().all(|(_, grads)| all_zero(grads))
}

/// The mistake of a received activation not made a `Var`, when the stage
/// after the wrong stage `bad` is right and ran forwards on inputs that
/// track no gradient: the gradient it sent back across the cut is then
/// incomplete, whatever else is wrong.
fn input_not_a_var(runs: &[StageRun], bad: usize, schedule: Schedule) -> Option<&'static str> {
    let untracked = runs.get(bad + 1).is_some_and(|after| after.untracked_inputs > 0);
    untracked.then_some(schedule.input_not_a_var?).map(|id| mistake(schedule.exercise, id))
}

/// Only the last stage reports a loss, the mean over the micro-batches.
pub fn expect_the_mean_loss_on_the_last_stage(schedule: Schedule, stages: usize) {
    let reference = Reference::new(M);
    let got = steps(&run(schedule, stages, M), schedule);
    for (s, (loss, _)) in got.iter().enumerate().take(stages - 1) {
        assert!(loss.is_none(), "stage {s} is not the last, so it has no loss to report, but reports {loss:?}");
    }
    let Some(loss) = got[stages - 1].0 else { panic!("the last stage reports no loss: it should report the step's") };
    let want = reference.mean_loss();
    let near = |value: f32| (loss - value).abs() <= 1e-4 * value.abs();
    let why = if near(want * M as f32) {
        Some(mistake(schedule.exercise, schedule.loss_summed))
    } else if reference.losses.iter().any(|&alone| near(alone / M as f32)) {
        Some(mistake(schedule.exercise, schedule.loss_overwritten))
    } else if zero_shares(&got) {
        Some(mistake(schedule.exercise, schedule.zero_share))
    } else {
        None
    };
    assert!(
        (loss - want).abs() <= 1e-5 * want.abs().max(1.0),
        "the last stage reports a loss of {}, expected the mean over the {M} micro-batches, {}{}",
        number(loss as f64),
        number(want as f64),
        cause(why)
    );
}

/// Each stage sends each micro-batch's activations forward (unless last)
/// and the gradient of each of its inputs back (unless first), once.
pub fn expect_one_send_per_micro_batch_and_cut(schedule: Schedule, stages: usize) {
    let activation_bytes = (B * T * HIDDEN * 4) as u64;
    for (s, run) in run(schedule, stages, M).iter().enumerate() {
        let neighbours = u64::from(s > 0) + u64::from(s + 1 < stages);
        let want = (neighbours * M as u64, neighbours * M as u64 * activation_bytes);
        assert!(
            run.sends == want,
            "stage {s} of {stages} sent {} tensor(s), {} bytes; it should send each of the {M} micro-batches' \
             activations forward (unless last) and the gradient of each of its inputs back (unless first): {} \
             tensors of ({B}, {T}, {HIDDEN}) f32, {} bytes",
            run.sends.0,
            run.sends.1,
            want.0,
            want.1
        );
    }
}

/// Two stages, each a process, activations and gradients sent over TCP.
pub fn expect_the_same_across_processes(schedule: Schedule) {
    let want = Reference::new(M).mean_grads();
    let runs: Vec<StageRun> = on_processes(2, |pg| stage_run(&pg, schedule, M));
    // Backward runs from the last stage to the first: the last stage that is wrong is where it starts.
    let differences: Vec<Option<String>> =
        steps(&runs, schedule).iter().map(|(_, grads)| first_difference(grads, &of_stage(&want, grads))).collect();
    if let Some(bad) = differences.iter().rposition(Option::is_some) {
        let why = input_not_a_var(&runs, bad, schedule);
        panic!("stage {bad}'s process: {}{}", differences[bad].as_deref().unwrap_or_default(), cause(why));
    }
}

/// GPipe's order on every stage: the `m` forwards, then the `m` backwards.
pub fn gpipe(m: usize) -> Vec<StageOp> {
    [vec![Forward; m], vec![Backward; m]].concat()
}

/// A schedule written out, one string per stage, stage 0 first: `F` a
/// forward, `B` a backward.
pub fn written(stages: &[&str]) -> Vec<Vec<StageOp>> {
    let op = |c: char| if c == 'F' { Forward } else { Backward };
    stages.iter().map(|stage| stage.chars().map(op).collect()).collect()
}

/// 1F1B's order on every stage, written out for each (stages, micro-batches)
/// the tests run.
const ONE_F_ONE_B: [((usize, usize), &[&str]); 6] = [
    ((2, 4), &["FFBFBFBB", "FBFBFBFB"]),
    ((4, 4), &["FFFFBBBB", "FFFBFBBB", "FFBFBFBB", "FBFBFBFB"]),
    ((4, 2), &["FFBB", "FFBB", "FFBB", "FBFB"]),
    ((4, 8), &["FFFFBFBFBFBFBBBB", "FFFBFBFBFBFBFBBB", "FFBFBFBFBFBFBFBB", "FBFBFBFBFBFBFBFB"]),
    ((3, 1), &["FB", "FB", "FB"]),
    ((4, 6), &["FFFFBFBFBBBB", "FFFBFBFBFBBB", "FFBFBFBFBFBB", "FBFBFBFBFBFB"]),
];

/// 1F1B's order on each of `stages` stages for `m` micro-batches.
pub fn one_f_one_b(stages: usize, m: usize) -> Vec<Vec<StageOp>> {
    let Some((_, order)) = ONE_F_ONE_B.iter().find(|(case, _)| *case == (stages, m)) else {
        panic!("1F1B's order for {stages} stages and {m} micro-batches is not written out here: add it")
    };
    written(order)
}

/// The most micro-batches `schedule` holds between their forward and their backward.
pub fn most_in_flight(schedule: &[StageOp]) -> usize {
    let mut in_flight: isize = 0;
    let mut most = 0;
    for op in schedule {
        in_flight += if *op == Forward { 1 } else { -1 };
        most = most.max(in_flight);
    }
    most as usize
}

/// The stages' idle share when they run `schedules`, a backward as long as
/// a forward (as the stubs' traces draw them), for a failure message.
pub fn bubble(schedules: &[Vec<StageOp>]) -> String {
    bubble_fraction(schedules, 1.0, 1.0).map_or_else(|e| e.to_string(), |b| format!("{:.0}%", 100.0 * b))
}
