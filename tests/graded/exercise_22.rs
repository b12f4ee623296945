//! Exercise 22: the FSDP unit step. Each rank runs the blocks on its own
//! batch; the expected values are one process's: the same blocks, resident,
//! run forward and backward on each rank's batch, their gradients averaged
//! over the ranks and cut into the ranks' shards. The process group counts
//! the collectives and records their order, the units count the bytes they
//! held whole (at each collective, and at most at once), and a wrong result
//! is compared with what each typical mistake gives.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use candle_core::{Device, Tensor, Var};
use rstest::rstest;
use workbook::autograd::vjp;
use workbook::distributed::{spawn_with_timeout, Collective, CollectiveOverride, ProcessGroup, ReduceOp, WithOverride};
use workbook::parallel::fsdp::GatheredBytes;
use workbook::parallel::fsdp_unit::BlockUnit;
use workbook::phase4_under_the_hood::{fsdp_backward, fsdp_forward};
use workbook::{init_params, Block, GptConfig, InitRng, ParamStore, RotaryCache};

use crate::process_ranks::on_processes;
use crate::support::{cause, every_rank, explain_error, first_scaled_difference, mistake, values};

const TIMEOUT: Duration = Duration::from_secs(20);
const B: usize = 2;
const T: usize = 6;
const HIDDEN: usize = 20;
const UNITS: usize = 3;

/// A block holds 4·20² + 3·20·28 + 2·20 = 3,320 parameters: three ranks pad it.
fn config() -> GptConfig {
    GptConfig {
        vocab_size: 16,
        hidden_size: HIDDEN,
        num_layers: UNITS,
        num_heads: 2,
        num_kv_heads: None,
        intermediate_size: 28,
        max_seq_len: T,
        rope_theta: 10_000.0,
        norm_eps: 1e-5,
        bias: false,
        tie_word_embeddings: false,
    }
}

fn params() -> ParamStore {
    init_params(&config(), 22, &Device::Cpu).unwrap()
}

/// Rank `rank`'s batch (B, T, C) and the gradient of its loss with respect to
/// the last block's output: different on every rank, as data parallelism has it.
fn batch(rank: usize) -> (Tensor, Tensor) {
    let mut rng = InitRng::from_seed(220 + rank as u64);
    let shape = (B, T, HIDDEN).into();
    (rng.normal(&shape, 1.0, &Device::Cpu).unwrap(), rng.normal(&shape, 0.1, &Device::Cpu).unwrap())
}

/// One process, the blocks resident, on rank `rank`'s batch: the output, each
/// unit's gradient laid out as its flat buffer (padded for `world`), and ∂L/∂x.
struct Reference {
    /// What goes into each unit: x, then each unit's output but the last's.
    unit_inputs: Vec<Vec<f32>>,
    output: Vec<f32>,
    unit_grads: Vec<Vec<f32>>,
    grad_input: Vec<f32>,
}

impl Reference {
    fn of_rank(rank: usize, world: usize) -> Self {
        let (config, params) = (config(), params());
        let rotary = RotaryCache::new(config.head_dim(), T, config.rope_theta, &Device::Cpu).unwrap();
        let (x, grad_output) = batch(rank);
        let x = Var::from_tensor(&x).unwrap();
        let mut h = x.as_tensor().clone();
        let mut unit_inputs = vec![];
        for layer in 0..UNITS {
            unit_inputs.push(values(&h));
            h = candle_core::Module::forward(&Block::new(&config, &params, layer, &rotary).unwrap(), &h).unwrap();
        }
        let grads = vjp(&h, &grad_output).unwrap();
        // The blocks' parameters have gradients; the embedding and the head do not take part.
        let by_name: HashMap<String, Tensor> = params
            .iter()
            .filter_map(|(name, var)| Some((name.to_string(), grads.get(var.as_tensor())?.clone())))
            .collect();
        let units = BlockUnit::shard_blocks(&config, &params, 0, world).unwrap();
        let unit_grads =
            units.iter().map(|unit| values(&unit.layout().flatten(&by_name, &Device::Cpu).unwrap())).collect();
        Self { unit_inputs, output: values(&h), unit_grads, grad_input: values(grads.get(x.as_tensor()).unwrap()) }
    }
}

/// Unit `unit`'s gradient shard that rank `rank` of `world` should hold: the
/// mean over the ranks' batches, times `factor`, cut to the rank's elements.
fn expected_shard(unit: usize, rank: usize, world: usize, factor: f32) -> Vec<f32> {
    let references: Vec<Reference> = (0..world).map(|r| Reference::of_rank(r, world)).collect();
    let len = references[0].unit_grads[unit].len() / world;
    (rank * len..(rank + 1) * len)
        .map(|i| factor * references.iter().map(|r| r.unit_grads[unit][i]).sum::<f32>() / world as f32)
        .collect()
}

/// What one rank ends its step with.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct RankRun {
    step: Result<Step, String>,
    /// How many units were whole when `fsdp_forward` returned, if it did.
    whole_after_forward: Option<usize>,
    /// (all-gather, reduce-scatter, all-reduce) calls.
    collectives: (u64, u64, u64),
    /// The most bytes this rank's units held whole at once, and one unit's.
    peak_gathered: u64,
    unit_bytes: u64,
    /// Each all-gather and reduce-scatter, in the order issued.
    issued: Vec<Issued>,
}

/// A collective a rank issued, with the bytes its units held whole then.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
enum Issued {
    Gather { whole: u64 },
    Scatter { whole: u64 },
}

/// Notes each all-gather and reduce-scatter before passing it on.
#[derive(Clone)]
struct Recorder {
    issued: Arc<Mutex<Vec<Issued>>>,
    gathered: Arc<GatheredBytes>,
}

impl CollectiveOverride for Recorder {
    fn all_gather(&self, inner: &dyn ProcessGroup, t: &Tensor) -> candle_core::Result<Tensor> {
        self.issued.lock().unwrap().push(Issued::Gather { whole: self.gathered.now() });
        inner.all_gather(t)
    }

    fn reduce_scatter(&self, inner: &dyn ProcessGroup, t: &Tensor, op: ReduceOp) -> candle_core::Result<Tensor> {
        self.issued.lock().unwrap().push(Issued::Scatter { whole: self.gathered.now() });
        inner.reduce_scatter(t, op)
    }
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct Step {
    /// How many units were whole when `fsdp_forward` returned, and when `fsdp_backward` did.
    whole_after: (usize, usize),
    output: Vec<f32>,
    /// Whether the output, and each kept input, carry a graph.
    graphs: Vec<bool>,
    /// The inputs the forward kept, one per unit.
    inputs: Vec<Vec<f32>>,
    unit_grads: Vec<Option<Vec<f32>>>,
    grad_input: Vec<f32>,
}

fn rank_run(pg: impl ProcessGroup + 'static) -> candle_core::Result<RankRun> {
    let (x, grad_output) = batch(pg.rank());
    // A graph behind x, as behind the embedding's output in the trainer.
    let x = (Var::from_tensor(&x)?.as_tensor() * 1.0)?;
    let mut units = BlockUnit::shard_blocks(&config(), &params(), pg.rank(), pg.world_size())?;
    let issued: Arc<Mutex<Vec<Issued>>> = Arc::default();
    let recorder = Recorder { issued: Arc::clone(&issued), gathered: units[0].gathered_bytes() };
    let pg = WithOverride::new(Box::new(pg), recorder);
    let pg: &dyn ProcessGroup = &pg;
    let before = pg.stats();
    let whole = |units: &[BlockUnit]| units.iter().filter(|unit| unit.whole().is_some()).count();
    let mut whole_after_forward = None;
    let step = fsdp_forward(pg, &mut units, &x).and_then(|forward| {
        let graphs = std::iter::once(&forward.output).chain(&forward.inputs).map(Tensor::track_op).collect();
        let after_forward = whole(&units);
        whole_after_forward = Some(after_forward);
        let grad_input = fsdp_backward(pg, &mut units, &forward.inputs, &grad_output)?;
        Ok(Step {
            whole_after: (after_forward, whole(&units)),
            output: values(&forward.output),
            graphs,
            inputs: forward.inputs.iter().map(values).collect(),
            unit_grads: units.iter().map(|u| u.grad().map(values)).collect(),
            grad_input: values(&grad_input),
        })
    });
    let used = pg.stats().since(&before);
    let issued = std::mem::take(&mut *issued.lock().unwrap());
    Ok(RankRun {
        step: step.map_err(|e| explain_error(&e)),
        whole_after_forward,
        collectives: (
            used.calls(Collective::AllGather),
            used.calls(Collective::ReduceScatter),
            used.calls(Collective::AllReduce),
        ),
        peak_gathered: units[0].peak_gathered_bytes(),
        unit_bytes: (units[0].layout().padded_len() * 4) as u64,
        issued,
    })
}

/// Every rank's step, or a failure naming the ranks that failed (and the
/// mistake, where the evidence singles it out).
fn steps(runs: &[RankRun]) -> Vec<Step> {
    // A rank whose forward returned with units still whole, and whose backward
    // then all-gathered once more than the forward did and failed: it met a
    // unit the forward had left whole.
    let regathered = |run: &RankRun| {
        run.step.is_err() && run.whole_after_forward.is_some_and(|n| n > 0) && run.collectives.0 > UNITS as u64
    };
    if let Some(rank) = runs.iter().position(regathered) {
        panic!(
            "rank {rank}'s fsdp_forward returned with {} of {UNITS} units whole, and its fsdp_backward failed \
             after gathering one again: {}{}",
            runs[rank].whole_after_forward.unwrap_or_default(),
            runs[rank].step.as_ref().err().map_or("", String::as_str),
            cause(Some(mistake(22, "never_resharded")))
        );
    }
    every_rank(runs.iter().map(|run| &run.step), "the FSDP step", "rank")
}

fn run(world: usize) -> Vec<RankRun> {
    spawn_with_timeout(world, TIMEOUT, rank_run)
        .unwrap_or_else(|e| panic!("the FSDP step on {world} rank(s) failed: {}", explain_error(&e)))
}

#[rstest]
fn each_rank_keeps_its_shard_of_the_gradient_averaged_over_ranks(#[values(1, 2, 3)] world: usize) {
    let got = steps(&run(world));
    for (rank, step) in got.iter().enumerate() {
        let reference = Reference::of_rank(rank, world);
        if let Some(difference) = first_scaled_difference(&step.output, &reference.output) {
            panic!("rank {rank} of {world}: the last unit's output differs from the unsharded blocks': {difference}");
        }
        // Backward runs from the last unit to the first: the last one that is wrong is where it starts.
        for unit in (0..UNITS).rev() {
            let Some(grad) = &step.unit_grads[unit] else {
                panic!("rank {rank} of {world}: unit {unit} has no gradient after backward: add its shard with unit.add_grad");
            };
            let want = expected_shard(unit, rank, world, 1.0);
            let Some(difference) = first_scaled_difference(grad, &want) else { continue };
            let summed =
                world > 1 && first_scaled_difference(grad, &expected_shard(unit, rank, world, world as f32)).is_none();
            // This rank's own gradient, cut to its shard: nothing came from the other ranks.
            let own = &reference.unit_grads[unit][rank * want.len()..(rank + 1) * want.len()];
            let not_reduced = world > 1 && first_scaled_difference(grad, own).is_none();
            let why = match (summed, not_reduced) {
                (true, _) => Some(mistake(22, "gradient_summed")),
                (_, true) => Some(mistake(22, "gradient_not_reduced")),
                _ => None,
            };
            // The units after it were right: the difference starts at this one.
            let after = match UNITS - 1 - unit {
                0 => String::new(),
                1 => format!(
                    " (unit {}, after it, is right: the difference starts at unit {unit}, in what its replay reads: \
                     its input, or the gradient handed back to it)",
                    unit + 1
                ),
                _ => format!(
                    " (units {}..={}, after it, are right: the difference starts at unit {unit}, in what its replay \
                     reads: its input, or the gradient handed back to it)",
                    unit + 1,
                    UNITS - 1
                ),
            };
            panic!(
                "rank {rank} of {world}: unit {unit}'s gradient shard (elements {}..{} of the flat buffer): \
                 {difference}{after}{}",
                rank * want.len(),
                (rank + 1) * want.len(),
                cause(why)
            );
        }
        if let Some(difference) = first_scaled_difference(&step.grad_input, &reference.grad_input) {
            panic!(
                "rank {rank} of {world}: the gradient of the first unit's input, for this rank's batch alone: \
                 {difference}"
            );
        }
    }
}

#[rstest]
fn each_unit_is_gathered_twice_and_reduce_scattered_once(#[values(2, 3)] world: usize) {
    let runs = run(world);
    steps(&runs);
    for (rank, run) in runs.iter().enumerate() {
        let (gathers, scatters, all_reduces) = run.collectives;
        let units = UNITS as u64;
        let once_kept = gathers == units && run.peak_gathered == units * run.unit_bytes;
        // Every reduce-scatter an all-reduce instead, the gathers right.
        let all_reduced = gathers == 2 * units && scatters == 0 && all_reduces == units;
        let why = match (once_kept, all_reduced) {
            (true, _) => Some(mistake(22, "no_second_gather")),
            (_, true) => Some(mistake(22, "all_reduced")),
            _ => None,
        };
        assert!(
            run.collectives == (2 * units, units, 0),
            "rank {rank} of {world} issued {gathers} all-gather(s), {scatters} reduce-scatter(s) and {all_reduces} \
             all-reduce(s) for {UNITS} units; FULL_SHARD issues, per unit, an all-gather before its forward, another \
             before its backward and one reduce-scatter of its gradient: {}, {UNITS} and 0{}",
            2 * UNITS,
            cause(why)
        );
    }
}

#[rstest]
fn only_one_unit_is_whole_at_a_time(#[values(2, 3)] world: usize) {
    let runs = run(world);
    let steps = steps(&runs);
    for (rank, (run, step)) in runs.iter().zip(&steps).enumerate() {
        let at_once = run.peak_gathered as f64 / run.unit_bytes as f64;
        let gathered_twice = run.collectives.0 == 2 * UNITS as u64;
        // What the units held when each half returned singles out the half that kept them.
        let established = match step.whole_after {
            (0, 0) if resharded_late(run) => Some(mistake(22, "kept_after_backward")),
            (0, 0) => None,
            (0, _) => Some(mistake(22, "kept_after_backward")),
            (_, _) if gathered_twice => Some(mistake(22, "never_resharded")),
            (_, _) => Some(mistake(22, "no_second_gather")),
        };
        assert!(
            run.peak_gathered == run.unit_bytes,
            "rank {rank} of {world}: its units held {} bytes whole at once ({at_once:.1} units of {} bytes); FSDP holds \
             one unit whole at a time, on top of 1/{world} of each; {} of {UNITS} units were whole when fsdp_forward \
             returned, {} when fsdp_backward did{}",
            run.peak_gathered,
            run.unit_bytes,
            step.whole_after.0,
            step.whole_after.1,
            cause(established)
        );
    }
}

/// The forward gathered each unit with none whole, and the backward took
/// the units one at a time, each gathered, then reduce-scattered before the
/// next was gathered, yet some unit was still whole at a later gather: kept
/// past its backward. (Gathering units early would put gathers side by side.)
fn resharded_late(run: &RankRun) -> bool {
    let (forward, backward) = run.issued.split_at(UNITS.min(run.issued.len()));
    let forward_one_at_a_time = forward.iter().all(|issued| *issued == Issued::Gather { whole: 0 });
    let backward_in_pairs = backward.len() == 2 * UNITS
        && backward.chunks(2).all(|pair| matches!(pair, [Issued::Gather { .. }, Issued::Scatter { .. }]));
    let gathered_beside_another =
        backward.iter().any(|issued| matches!(issued, Issued::Gather { whole } if *whole > 0));
    forward_one_at_a_time && backward_in_pairs && gathered_beside_another
}

/// Backward replays each unit from the input the forward kept for it.
#[test]
fn the_forward_keeps_each_units_input() {
    let got = steps(&run(2));
    for (rank, step) in got.iter().enumerate() {
        let reference = Reference::of_rank(rank, 2);
        assert!(step.inputs.len() == UNITS, "rank {rank} kept {} inputs for {UNITS} units", step.inputs.len());
        for (unit, (kept, want)) in step.inputs.iter().zip(&reference.unit_inputs).enumerate() {
            let Some(difference) = first_scaled_difference(kept, want) else { continue };
            // What the unit gave out, which is the next one's input (or the output, for the last).
            let given = reference.unit_inputs.get(unit + 1).unwrap_or(&reference.output);
            let its_output = first_scaled_difference(kept, given).is_none();
            panic!(
                "rank {rank}: the input kept for unit {unit} is not what went into it: {difference}{}",
                if its_output { "; it is what came out of it" } else { "" }
            );
        }
    }
}

#[test]
fn the_forward_keeps_no_graph() {
    let got = steps(&run(2));
    for (rank, step) in got.iter().enumerate() {
        let Some(i) = step.graphs.iter().position(|&tracked| tracked) else { continue };
        let message = match i {
            0 => format!("the last unit's output carries a graph{}", cause(Some(mistake(22, "forward_kept_graph")))),
            // Unit 0's input is x, whose graph is the caller's, not the units'.
            1 => "the input kept for unit 0 carries a graph: the x this test passes has one behind it, as the \
                  embedding's output has in the trainer, and nothing the forward keeps may carry one"
                .to_string(),
            i => format!(
                "the input kept for unit {} carries a graph{}",
                i - 1,
                cause(Some(mistake(22, "forward_kept_graph")))
            ),
        };
        panic!("rank {rank}: {message}");
    }
}

/// Each rank a process, the shards gathered and the gradients scattered over TCP.
#[test]
fn it_runs_across_processes_over_tcp() {
    let runs: Vec<RankRun> = on_processes(2, rank_run);
    for (rank, step) in steps(&runs).iter().enumerate() {
        for unit in 0..UNITS {
            let grad = step.unit_grads[unit].as_deref().unwrap_or_default();
            let difference = first_scaled_difference(grad, &expected_shard(unit, rank, 2, 1.0));
            assert!(
                difference.is_none(),
                "rank {rank}'s process, unit {unit}'s gradient shard: {}",
                difference.unwrap()
            );
        }
    }
}
