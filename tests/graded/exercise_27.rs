//! Exercise 27: sequence parallelism. The expected values are one process's,
//! as for exercise 23: the whole block, built from its modules, forward and
//! backward, its output and ∂L/∂x cut to each rank's tokens, the weight
//! gradients to its shards (the norms whole). The process group counts each
//! collective's calls and bytes; a wrong result is compared with what each
//! typical mistake gives.

use std::sync::{Arc, Mutex};

use candle_core::{Result, Tensor};
use rstest::rstest;
use workbook::distributed::{
    spawn_with_timeout, Collective, CollectiveOverride, ProcessGroup, ReduceOp, SharedGroup, WithOverride,
};
use workbook::parallel::tensor::TensorParallelBlock;
use workbook::phase4_under_the_hood::sequence_parallel_block;

use crate::exercise_23::{
    batch_of, config_of, forward_and_backward, matches, norm_gradients_are_parts, outcome_difference, params_of,
    reference_of, Case, Outcome, CASE, HIDDEN, P, TIMEOUT,
};
use crate::process_ranks::on_processes;
use crate::support::{cause, every_rank, explain_error, first_scaled_difference, mistake};

const NORMS: [&str; 2] = ["input_layernorm", "post_attention_layernorm"];

/// Exercise 23's block on 3 sequences of 8 tokens, one key/value head per
/// head: 8 tokens cut across 4 ranks, and 4 key/value heads split there too.
const EIGHT_TOKENS: Case = Case { b: 3, t: 8, kv_heads: 4 };

/// Rank `rank` of `world`'s tokens of a (B, T, C) tensor's values.
fn tokens_of(case: Case, whole: &[f32], rank: usize, world: usize) -> Vec<f32> {
    let per_rank = case.t / world * HIDDEN;
    let sequences = whole.chunks(case.t * HIDDEN);
    sequences.flat_map(|sequence| sequence[rank * per_rank..(rank + 1) * per_rank].to_vec()).collect()
}

/// What rank `rank` of `world` should end with: one process's step, its
/// output and ∂L/∂x cut to the rank's tokens. With `residual_gradients`
/// false, a mistake's result.
fn expected(case: Case, rank: usize, world: usize, residual_gradients: bool) -> Outcome {
    let whole = reference_of(case, rank, world, residual_gradients);
    Outcome {
        output: tokens_of(case, &whole.output, rank, world),
        grads: whole.grads,
        grad_input: tokens_of(case, &whole.grad_input, rank, world),
    }
}

/// A collective's name and the shape of the tensor it was handed.
type Call = (String, Vec<usize>);

/// Notes the shape of each all-gather's and reduce-scatter's input, in order.
#[derive(Clone, Default)]
struct Shapes(Arc<Mutex<Vec<Call>>>);

impl CollectiveOverride for Shapes {
    fn all_gather(&self, inner: &dyn ProcessGroup, t: &Tensor) -> Result<Tensor> {
        self.0.lock().unwrap().push(("all_gather".into(), t.dims().to_vec()));
        inner.all_gather(t)
    }

    fn reduce_scatter(&self, inner: &dyn ProcessGroup, t: &Tensor, op: ReduceOp) -> Result<Tensor> {
        self.0.lock().unwrap().push(("reduce_scatter".into(), t.dims().to_vec()));
        inner.reduce_scatter(t, op)
    }
}

/// The first all-gather or reduce-scatter handed a (B, ·, C) tensor as it
/// is, said as what it did: both work along dimension 0, here the batch,
/// where the sequence is dimension 1. `None` where the shapes cannot tell
/// (a batch as long as the tokens it would be mistaken for), and on one rank,
/// where either dimension gives the same.
fn along_the_batch(shapes: &[Call], case: Case, world: usize) -> Option<String> {
    if world == 1 {
        return None;
    }
    let (b, t) = (case.b, case.t);
    let (own, whole) = ([b, t / world, HIDDEN], [b, t, HIDDEN]);
    shapes.iter().find_map(|(call, dims)| match call.as_str() {
        "all_gather" if dims == &own && b != t / world => Some(format!(
            "an all_gather was handed this rank's tokens as they are, {own:?} (B, T/N, C): it stacks the ranks' \
             tensors along dimension 0, the batch, into {:?}, where every rank needs all {t} tokens of each \
             sequence, {whole:?}; the sequence is dimension 1. Everything after it works on the wrong tokens",
            [world * b, t / world, HIDDEN]
        )),
        "reduce_scatter" if dims == &whole && b != t => Some(format!(
            "a reduce_scatter was handed {whole:?} (B, T, C) as it is: it splits dimension 0, the batch, among the \
             ranks, where this rank's share is its {} tokens of each sequence, dimension 1. Everything after it \
             works on the wrong tokens",
            t / world
        )),
        _ => None,
    })
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct RankRun {
    step: std::result::Result<Outcome, String>,
    /// Where the sequence was gathered or scattered along the batch instead, if it was.
    along_the_batch: Option<String>,
    all_gathers: u64,
    reduce_scatters: u64,
    all_reduce_bytes: u64,
    /// Calls of any other collective.
    others: u64,
}

fn rank_run(pg: Box<dyn ProcessGroup>, case: Case) -> Result<RankRun> {
    let (rank, world) = (pg.rank(), pg.world_size());
    let shapes = Shapes::default();
    let pg = SharedGroup::new(Box::new(WithOverride::new(pg, shapes.clone())));
    let block = TensorParallelBlock::shard(&config_of(case), &params_of(case), 0, rank, world)?;
    let (x, grad_output) = batch_of(case);
    let own = |t: &Tensor| t.narrow(1, rank * case.t / world, case.t / world);
    let before = pg.stats();
    let step =
        forward_and_backward(&block, &own(&x)?, &own(&grad_output)?, |x| sequence_parallel_block(&pg, &block, x));
    let used = pg.stats().since(&before);
    let counted = [Collective::AllGather, Collective::ReduceScatter, Collective::AllReduce];
    let others = Collective::ALL.iter().filter(|c| !counted.contains(c)).map(|&c| used.calls(c)).sum();
    let along_the_batch = along_the_batch(&shapes.0.lock().unwrap(), case, world);
    Ok(RankRun {
        step: step.map_err(|e| explain_error(&e)),
        along_the_batch,
        all_gathers: used.calls(Collective::AllGather),
        reduce_scatters: used.calls(Collective::ReduceScatter),
        all_reduce_bytes: used.bytes(Collective::AllReduce),
        others,
    })
}

/// Every rank's outcome; a failure at the first rank whose sequence went
/// along the batch (what follows from it, an error or wrong values, says
/// nothing more), else at the ranks whose step failed.
fn steps(runs: &[RankRun]) -> Vec<Outcome> {
    let world = runs.len();
    if let Some((rank, what)) = runs.iter().enumerate().find_map(|(r, run)| Some((r, run.along_the_batch.as_ref()?))) {
        panic!("rank {rank} of {world}: {what}");
    }
    every_rank(runs.iter().map(|run| &run.step), "sequence_parallel_block", "rank")
}

fn run(case: Case, world: usize) -> Vec<RankRun> {
    spawn_with_timeout(world, TIMEOUT, |pg| rank_run(Box::new(pg), case)).unwrap_or_else(|e| {
        panic!("the sequence-parallel step on {world} rank(s), {case:?}, failed: {}", explain_error(&e))
    })
}

/// Whether every norm weight's gradient on every rank is the right one divided by `world`.
fn norm_gradients_divided(got: &[Outcome], want: &Outcome, world: usize) -> bool {
    world > 1
        && got.iter().all(|outcome| {
            NORMS.iter().all(|piece| {
                let name = format!("{P}.{piece}.weight");
                let divided: Vec<f32> = want.grads[&name].iter().map(|g| g / world as f32).collect();
                first_scaled_difference(&outcome.grads[&name], &divided).is_none()
            })
        })
}

/// Whether `got` is right but for the norms' weight gradients.
fn right_but_the_norms(got: &Outcome, want: &Outcome) -> bool {
    let mut with_norms = got.clone();
    for piece in NORMS {
        let name = format!("{P}.{piece}.weight");
        with_norms.grads.insert(name.clone(), want.grads[&name].clone());
    }
    matches(&with_norms, want)
}

/// Six tokens on 1 and 2 ranks; eight, a batch of 3, on 1, 2 and 4.
#[rstest]
#[case::six_tokens_on_1(CASE, 1)]
#[case::six_tokens_on_2(CASE, 2)]
#[case::eight_tokens_on_1(EIGHT_TOKENS, 1)]
#[case::eight_tokens_on_2(EIGHT_TOKENS, 2)]
#[case::eight_tokens_on_4(EIGHT_TOKENS, 4)]
fn every_rank_gets_its_tokens_of_the_output_whole_norm_gradients_and_its_tokens_of_the_input_gradient(
    #[case] case: Case,
    #[case] world: usize,
) {
    let runs = run(case, world);
    let got = steps(&runs);
    for (rank, outcome) in got.iter().enumerate() {
        let want = expected(case, rank, world, true);
        let Some(difference) = outcome_difference(outcome, &want) else { continue };
        let why = if !right_but_the_norms(outcome, &want) {
            matches(outcome, &expected(case, rank, world, false)).then(|| mistake(27, "residual_gradient_dropped"))
        } else if norm_gradients_divided(&got, &want, world) {
            Some(mistake(27, "norm_gradient_averaged"))
        } else if norm_gradients_are_parts(&got, &want) {
            Some(mistake(27, "norm_gradient_from_own_tokens"))
        } else {
            None
        };
        panic!(
            "rank {rank} of {world} (tokens {} to {}): {difference}{}",
            rank * case.t / world,
            (rank + 1) * case.t / world - 1,
            cause(why)
        );
    }
}

#[rstest]
#[case::six_tokens_on_2(CASE, 2)]
#[case::eight_tokens_on_4(EIGHT_TOKENS, 4)]
fn a_step_gathers_and_scatters_the_activations_and_all_reduces_only_the_norm_gradients(
    #[case] case: Case,
    #[case] world: usize,
) {
    let runs = run(case, world);
    steps(&runs);
    let norm_bytes = (NORMS.len() * HIDDEN * 4) as u64;
    let activation_bytes = (case.b * case.t * HIDDEN * 4) as u64;
    for (rank, run) in runs.iter().enumerate() {
        let why = (run.all_reduce_bytes >= activation_bytes && run.reduce_scatters < 4)
            .then(|| mistake(27, "all_reduce_for_activations"));
        assert!(
            run.all_gathers == 4 && run.reduce_scatters == 4 && run.all_reduce_bytes <= norm_bytes && run.others == 0,
            "rank {rank} of {world} issued {} all-gather(s), {} reduce-scatter(s), all-reduces of {} bytes and {} \
             other collective(s); a block whose norms and residuals keep only this rank's tokens needs one all-gather \
             and one reduce-scatter per sublayer in forward and again in backward (4 of each), and all-reduces of \
             nothing but the norms' weight gradients ({norm_bytes} bytes){}",
            run.all_gathers,
            run.reduce_scatters,
            run.all_reduce_bytes,
            run.others,
            cause(why)
        );
    }
}

/// Each rank a process, the activations and gradients exchanged over TCP.
#[test]
fn it_runs_across_processes_over_tcp() {
    let runs: Vec<RankRun> = on_processes(2, |pg| rank_run(Box::new(pg), CASE));
    for (rank, outcome) in steps(&runs).iter().enumerate() {
        let difference = outcome_difference(outcome, &expected(CASE, rank, 2, true));
        assert!(difference.is_none(), "rank {rank}'s process: {}", difference.unwrap());
    }
}
