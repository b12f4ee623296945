//! Exercise 21: a pipelined step on GPipe's schedule. The expected gradients
//! are one process's: the whole model's forward (exercise 7) and backward on
//! each micro-batch, averaged over the micro-batches. Each stage records the
//! forwards and backwards it ran, in order, and the process group counts the
//! sends; a wrong result is compared with what each typical mistake gives.

use std::collections::BTreeMap;
use std::time::Duration;

use candle_core::{DType, Device, Tensor};
use rstest::rstest;
use workbook::autograd::Gradients;
use workbook::distributed::{spawn_with_timeout, Collective, ProcessGroup};
use workbook::parallel::pipeline::{bubble_fraction, PipelineStage, StageOp};
use workbook::phase4_under_the_hood::gpipe_step;
use workbook::{init_params, Gpt, GptConfig, InitRng};

use crate::fsdp_runs::as_values;
use crate::process_ranks::on_processes;
use crate::support::{cause, every_rank, explain_error, first_scaled_difference, mistake, number};

const TIMEOUT: Duration = Duration::from_secs(20);
/// Micro-batches per step, each (B, T) tokens.
const M: usize = 4;
const B: usize = 2;
const T: usize = 8;
const HIDDEN: usize = 16;

type Grads = BTreeMap<String, Vec<f32>>;

/// Four layers: one to four stages of whole blocks.
fn config() -> GptConfig {
    GptConfig {
        vocab_size: 32,
        hidden_size: HIDDEN,
        num_layers: 4,
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

fn micro_batches() -> Vec<Tensor> {
    let mut rng = InitRng::from_seed(21);
    (0..M)
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
    fn new() -> Self {
        let params = init_params(&config(), 21, &Device::Cpu).unwrap();
        let model = Gpt::new(&config(), &params).unwrap();
        let (mut losses, mut grads) = (vec![], vec![]);
        for tokens in micro_batches() {
            let pass = model.forward(&tokens, Some(&tokens)).unwrap();
            losses.push(pass.loss.as_ref().unwrap().to_scalar::<f32>().unwrap());
            grads.push(Gradients::from_store(&params, &pass.backward().unwrap()).unwrap());
        }
        Self { losses, grads }
    }

    fn mean_loss(&self) -> f32 {
        self.losses.iter().sum::<f32>() / M as f32
    }

    /// The gradients of the step's loss, the mean over the micro-batches.
    fn mean_grads(&self) -> Grads {
        let mut mean = Gradients::default();
        for grads in &self.grads {
            mean.accumulate(grads).unwrap();
        }
        mean.scale(1.0 / M as f64).unwrap();
        as_values(mean.iter())
    }

    /// The gradients of micro-batch `m`'s loss alone.
    fn of_micro_batch(&self, m: usize) -> Grads {
        as_values(self.grads[m].iter())
    }
}

/// What one stage ends with.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct StageRun {
    /// The step's loss and gradients, or its error.
    step: Result<(Option<f32>, Grads), String>,
    schedule: Vec<StageOp>,
    /// (send calls, their bytes).
    sends: (u64, u64),
}

fn stage_run(pg: &dyn ProcessGroup) -> candle_core::Result<StageRun> {
    let params = init_params(&config(), 21, &Device::Cpu)?;
    let stage = PipelineStage::new(&config(), &params, pg.rank(), pg.world_size())?;
    let before = pg.stats();
    let step = gpipe_step(pg, &stage, &micro_batches()).map(|s| (s.loss, as_values(s.grads.iter())));
    let used = pg.stats().since(&before);
    Ok(StageRun {
        step: step.map_err(|e| explain_error(&e)),
        schedule: stage.take_schedule(),
        sends: (used.calls(Collective::Send), used.bytes(Collective::Send)),
    })
}

/// Every stage's step, or a failure naming the stages that failed.
fn steps(runs: &[StageRun]) -> Vec<(Option<f32>, Grads)> {
    every_rank(runs.iter().map(|run| &run.step), "gpipe_step", "stage")
}

fn run(stages: usize) -> Vec<StageRun> {
    spawn_with_timeout(stages, TIMEOUT, |pg| stage_run(&pg))
        .unwrap_or_else(|e| panic!("the pipeline of {stages} stages failed: {}", explain_error(&e)))
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

#[rstest]
fn every_stage_gets_its_gradients_of_the_mean_loss(#[values(1, 2, 3, 4)] stages: usize) {
    let reference = Reference::new();
    let want = reference.mean_grads();
    let got = steps(&run(stages));
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
    let one_micro_batch = [0, M - 1].iter().any(|&m| {
        let alone = of_stage(&reference.of_micro_batch(m), grads);
        matches(grads, &alone) || matches(grads, &scaled(&alone, 1.0 / M as f32))
    });
    let why = if matches(grads, &scaled(&want_here, M as f32)) {
        Some(mistake(21, "loss_summed"))
    } else {
        one_micro_batch.then(|| mistake(21, "gradients_not_accumulated"))
    };
    let cut = match (why, bad + 1 < stages) {
        (None, true) => format!(
            "\n  Stage {}'s gradients are right and stage {bad}'s are not: look at what crosses that cut backward \
             (the gradient of stage {}'s input) and at how stage {bad} uses it.",
            bad + 1,
            bad + 1
        ),
        _ => String::new(),
    };
    panic!(
        "with {stages} stage(s), stage {bad} (layers {:?}): {}{cut}{}",
        workbook::parallel::pipeline::stage_layers(4, stages, bad),
        first_difference(grads, &want_here).unwrap_or_else(|| "it holds other parameters".into()),
        cause(why)
    );
}

#[rstest]
fn the_last_stage_reports_the_mean_loss(#[values(1, 3)] stages: usize) {
    let reference = Reference::new();
    let got = steps(&run(stages));
    for (s, (loss, _)) in got.iter().enumerate().take(stages - 1) {
        assert!(loss.is_none(), "stage {s} is not the last, so it has no loss to report, but reports {loss:?}");
    }
    let Some(loss) = got[stages - 1].0 else { panic!("the last stage reports no loss: it should report the step's") };
    let want = reference.mean_loss();
    let summed = (loss - want * M as f32).abs() <= 1e-4 * want.abs();
    assert!(
        (loss - want).abs() <= 1e-5 * want.abs().max(1.0),
        "the last stage reports a loss of {}, expected the mean over the {M} micro-batches, {}{}",
        number(loss as f64),
        number(want as f64),
        cause(summed.then(|| mistake(21, "loss_summed")))
    );
}

#[rstest]
fn every_stage_runs_all_forwards_then_all_backwards(#[values(2, 4)] stages: usize) {
    let runs = run(stages);
    steps(&runs);
    let gpipe = [vec![StageOp::Forward; M], vec![StageOp::Backward; M]].concat();
    let schedules: Vec<Vec<StageOp>> = runs.iter().map(|r| r.schedule.clone()).collect();
    let Some(s) = schedules.iter().position(|schedule| *schedule != gpipe) else { return };
    let one_by_one = schedules[s] == [StageOp::Forward, StageOp::Backward].repeat(M);
    let bubble = |schedules: &[Vec<StageOp>]| {
        bubble_fraction(schedules, 1.0, 2.0).map_or_else(|e| e.to_string(), |b| format!("{:.0}%", 100.0 * b))
    };
    panic!(
        "with {stages} stages and {M} micro-batches, stage {s} ran {:?}; GPipe runs the {M} forwards, then the {M} \
         backwards. Idle share of the stages, a backward costing two forwards: yours {}, GPipe's {} = (S−1)/(M+S−1){}",
        schedules[s],
        bubble(&schedules),
        bubble(&vec![gpipe; stages]),
        cause(one_by_one.then(|| mistake(21, "one_micro_batch_at_a_time")))
    );
}

#[rstest]
fn activations_and_their_gradients_cross_each_cut_once_per_micro_batch(#[values(2, 3)] stages: usize) {
    let activation_bytes = (B * T * HIDDEN * 4) as u64;
    let runs = run(stages);
    steps(&runs);
    for (s, run) in runs.iter().enumerate() {
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

/// Each stage a process, activations and gradients sent over TCP.
#[test]
fn it_runs_across_processes_over_tcp() {
    let want = Reference::new().mean_grads();
    let runs: Vec<StageRun> = on_processes(2, |pg| stage_run(&pg));
    for (s, (_, grads)) in steps(&runs).iter().enumerate() {
        let difference = first_difference(grads, &of_stage(&want, grads));
        assert!(difference.is_none(), "stage {s}'s process: {}", difference.unwrap_or_default());
    }
}
