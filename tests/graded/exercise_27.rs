//! Exercise 27: sequence parallelism. The two operators are checked alone on
//! small numbers that say where they came from, forward and backward, on 2
//! and 3 ranks. The block's expected values are one process's, as for
//! exercise 23: the whole block, built from its modules, forward and
//! backward, its output and ∂L/∂x cut to each rank's tokens, the weight
//! gradients to its shards (the norms whole). A recorder notes every
//! collective and the shape it was handed; a wrong result is named as a
//! typical mistake only when it equals that mistake's result.

use std::sync::{Arc, Mutex};

use candle_core::{Device, Result, Tensor, Var};
use rstest::rstest;
use workbook::autograd::vjp;
use workbook::distributed::{
    spawn_with_timeout, Collective, CollectiveOverride, ProcessGroup, ReduceOp, SharedGroup, WithOverride,
};
use workbook::parallel::tensor::TensorParallelBlock;
use workbook::phase4_under_the_hood::{all_gather_tokens, reduce_scatter_tokens, sequence_parallel_block};

use crate::exercise_23::{
    batch_of, config_of, forward_and_backward, outcome_difference, params_of, reference_of, Case, Outcome, CASE,
    HIDDEN, P, TIMEOUT,
};
use crate::process_ranks::on_processes;
use crate::support::{cause, every_rank, explain_error, first_scaled_difference, mistake, number, values};

const NORMS: [&str; 2] = ["input_layernorm", "post_attention_layernorm"];

/// Exercise 23's block on 3 sequences of 8 tokens, one key/value head per
/// head: 8 tokens cut across 4 ranks, and 4 key/value heads split there too.
const EIGHT_TOKENS: Case = Case { b: 3, t: 8, kv_heads: 4 };

// ------------------------------------------------------------ the collectives

/// A collective's name and the shape of the tensor it was handed.
type Call = (String, Vec<usize>);

/// Notes every all-reduce, all-gather and reduce-scatter, in order, with the
/// shape of its input.
#[derive(Clone, Default)]
struct Calls(Arc<Mutex<Vec<Call>>>);

impl Calls {
    fn note(&self, name: &str, t: &Tensor) {
        self.0.lock().unwrap().push((name.into(), t.dims().to_vec()));
    }

    fn len(&self) -> usize {
        self.0.lock().unwrap().len()
    }

    fn since(&self, start: usize) -> Vec<Call> {
        self.0.lock().unwrap()[start..].to_vec()
    }
}

impl CollectiveOverride for Calls {
    fn all_reduce(&self, inner: &dyn ProcessGroup, t: &Tensor, op: ReduceOp) -> Result<Tensor> {
        self.note("all_reduce", t);
        inner.all_reduce(t, op)
    }

    fn all_gather(&self, inner: &dyn ProcessGroup, t: &Tensor) -> Result<Tensor> {
        self.note("all_gather", t);
        inner.all_gather(t)
    }

    fn reduce_scatter(&self, inner: &dyn ProcessGroup, t: &Tensor, op: ReduceOp) -> Result<Tensor> {
        self.note("reduce_scatter", t);
        inner.reduce_scatter(t, op)
    }
}

/// `tp`, every collective on it noted by the returned recorder.
fn recorded(pg: Box<dyn ProcessGroup>) -> (SharedGroup, Calls) {
    let calls = Calls::default();
    (SharedGroup::new(Box::new(WithOverride::new(pg, calls.clone()))), calls)
}

/// How many of `calls` are `name` of a tensor of `elements` elements.
fn count(calls: &[Call], name: &str, elements: usize) -> usize {
    calls.iter().filter(|(call, dims)| call == name && dims.iter().product::<usize>() == elements).count()
}

/// The calls, said as a learner reads them.
fn listed(calls: &[Call]) -> String {
    if calls.is_empty() {
        return "none".into();
    }
    calls.iter().map(|(call, dims)| format!("{call} of {dims:?}")).collect::<Vec<_>>().join(", ")
}

/// The first all-gather or reduce-scatter handed a (B, ·, C) tensor as it
/// is, said as what it did: both work along dimension 0, here the batch,
/// where the sequence is dimension 1. `None` where the shapes cannot tell
/// (a batch as long as the tokens it would be mistaken for), and on one rank,
/// where either dimension gives the same.
fn along_the_batch(calls: &[Call], [b, t, c]: [usize; 3], world: usize) -> Option<String> {
    if world == 1 {
        return None;
    }
    let (own, whole) = ([b, t / world, c], [b, t, c]);
    calls.iter().find_map(|(call, dims)| match call.as_str() {
        "all_gather" if dims == &own && b != t / world => Some(format!(
            "an all_gather was handed this rank's tokens as they are, {own:?} (B, T/N, C): it stacks the ranks' \
             tensors along dimension 0, the batch, into {:?}, where every rank needs all {t} tokens of each \
             sequence, {whole:?}; the sequence is dimension 1. Everything after it works on the wrong tokens",
            [world * b, t / world, c]
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

// ------------------------------------------------------------ the operators

/// The operators' own shape, not the block's: 2 sequences of 6 tokens of 2
/// channels, 3 tokens a rank on 2 ranks, 2 on 3.
const SHAPE: [usize; 3] = [2, 6, 2];

/// Token `t` (its place in the whole sequence) of sequence `b`, channel `c`:
/// 100·b + 10·t + c, so that a number says where it came from.
fn value(b: usize, t: usize, c: usize) -> f32 {
    (100 * b + 10 * t + c) as f32
}

/// Rank `rank`'s part of a sum over the ranks at a place whose value is v:
/// 2^rank·(v + 1). The parts sum to (2^N − 1)·(v + 1); no rank's part, nor
/// their mean, is that sum.
fn part(rank: usize, v: f32) -> f32 {
    (1 << rank) as f32 * (v + 1.0)
}

/// The sum of the N ranks' parts at a place whose value is v.
fn sum_of_parts(world: usize, v: f32) -> f32 {
    ((1 << world) - 1) as f32 * (v + 1.0)
}

/// A (B, tokens, C) tensor's values, `f(value)` at each place, for the
/// tokens `tokens` of each sequence.
fn tokens(tokens: std::ops::Range<usize>, f: impl Fn(f32) -> f32) -> Values {
    let [b, _, c] = SHAPE;
    let values =
        (0..b).flat_map(|b| tokens.clone().flat_map(move |t| (0..c).map(move |c| value(b, t, c)))).map(f).collect();
    Values { dims: vec![b, tokens.len(), c], first_token: tokens.start, values }
}

/// Rank `rank` of `world`'s tokens.
fn own(rank: usize, world: usize) -> std::ops::Range<usize> {
    let per_rank = SHAPE[1] / world;
    rank * per_rank..(rank + 1) * per_rank
}

/// A (B, tokens, C) tensor's shape and values; its tokens start at `first_token` of the sequence.
#[derive(Debug, Clone, PartialEq)]
struct Values {
    dims: Vec<usize>,
    first_token: usize,
    values: Vec<f32>,
}

impl Values {
    fn of(t: &Tensor, first_token: usize) -> Self {
        Values { dims: t.dims().to_vec(), first_token, values: values(t) }
    }

    fn tensor(&self) -> Tensor {
        Tensor::from_vec(self.values.clone(), self.dims.as_slice(), &Device::Cpu).unwrap()
    }

    /// Where `self` first differs from `want`: a place (sequence, token,
    /// channel) and the two numbers, or the two shapes.
    fn difference(&self, want: &Values) -> Option<String> {
        if self.dims != want.dims {
            return Some(format!("its shape is {:?}, expected {:?}", self.dims, want.dims));
        }
        let scale = want.values.iter().fold(0f32, |m, v| m.max(v.abs()));
        let i = self.values.iter().zip(&want.values).position(|(g, w)| g.is_nan() || (g - w).abs() > 1e-5 * scale)?;
        let (tokens, c) = (want.dims[1], want.dims[2]);
        Some(format!(
            "at sequence {}, token {}, channel {} it is {}, expected {}",
            i / (tokens * c),
            want.first_token + i / c % tokens,
            i % c,
            number(self.values[i] as f64),
            number(want.values[i] as f64)
        ))
    }

    fn matches(&self, want: &Values) -> bool {
        self.difference(want).is_none()
    }
}

/// `want` divided by `world`: the mean where the sum over the ranks belongs.
fn mean(want: &Values, world: usize) -> Values {
    Values { values: want.values.iter().map(|v| v / world as f32).collect(), ..want.clone() }
}

/// The operator under test.
#[derive(Debug, Clone, Copy)]
enum Operator {
    AllGather,
    ReduceScatter,
}

/// What a backward through an operator gave its input.
#[derive(Debug, Clone)]
enum Gradient {
    Some(Values),
    /// The backward ran, and no gradient reached the input.
    Missing,
    Failed(String),
    /// The forward failed or gave a shape the output's gradient does not have.
    NotRun,
}

/// One rank's forward and backward through one operator.
#[derive(Debug, Clone)]
struct OperatorRun {
    forward: std::result::Result<Values, String>,
    gradient: Gradient,
    forward_calls: Vec<Call>,
    backward_calls: Vec<Call>,
}

impl Operator {
    fn name(self) -> &'static str {
        match self {
            Operator::AllGather => "all_gather_tokens",
            Operator::ReduceScatter => "reduce_scatter_tokens",
        }
    }

    /// What rank `rank` of `world` hands the operator and the gradient of
    /// its output: the gather takes its tokens of the values and each rank's
    /// part of the gradient of every token; the reduce-scatter each rank's
    /// part of every token and its tokens of the gradient.
    fn inputs(self, rank: usize, world: usize) -> (Values, Values) {
        let all = 0..SHAPE[1];
        match self {
            Operator::AllGather => (tokens(own(rank, world), |v| v), tokens(all, |v| part(rank, v))),
            Operator::ReduceScatter => (tokens(all, |v| part(rank, v)), tokens(own(rank, world), |v| v)),
        }
    }

    /// The right output and the right gradient of the input on rank `rank` of `world`.
    fn expected(self, rank: usize, world: usize) -> (Values, Values) {
        let all = 0..SHAPE[1];
        match self {
            Operator::AllGather => (tokens(all, |v| v), tokens(own(rank, world), |v| sum_of_parts(world, v))),
            Operator::ReduceScatter => (tokens(own(rank, world), |v| sum_of_parts(world, v)), tokens(all, |v| v)),
        }
    }

    /// The collective its forward makes, and the one its backward makes, with their inputs' elements.
    fn collectives(self, world: usize) -> [(&'static str, usize); 2] {
        let [b, t, c] = SHAPE;
        let (chunk, whole) = (b * t / world * c, b * t * c);
        match self {
            Operator::AllGather => [("all_gather", chunk), ("reduce_scatter", whole)],
            Operator::ReduceScatter => [("reduce_scatter", whole), ("all_gather", chunk)],
        }
    }

    fn apply(self, tp: &SharedGroup, x: &Tensor) -> Result<Tensor> {
        match self {
            Operator::AllGather => all_gather_tokens(tp, x),
            Operator::ReduceScatter => reduce_scatter_tokens(tp, x),
        }
    }

    fn run(self, pg: Box<dyn ProcessGroup>) -> Result<OperatorRun> {
        let (rank, world) = (pg.rank(), pg.world_size());
        let (tp, calls) = recorded(pg);
        let (input, grad_output) = self.inputs(rank, world);
        let x = Var::from_tensor(&input.tensor())?;
        let output = self.apply(&tp, x.as_tensor());
        let forward_calls = calls.since(0);
        let start = calls.len();
        let first_token = match self {
            Operator::AllGather => 0,
            Operator::ReduceScatter => own(rank, world).start,
        };
        let forward = output.as_ref().map(|y| Values::of(y, first_token)).map_err(explain_error);
        let gradient = match &output {
            Ok(y) if y.dims() == grad_output.dims.as_slice() => match vjp(y, &grad_output.tensor()) {
                Ok(store) => store
                    .get(x.as_tensor())
                    .map_or(Gradient::Missing, |g| Gradient::Some(Values::of(g, input.first_token))),
                Err(e) => Gradient::Failed(explain_error(&e)),
            },
            _ => Gradient::NotRun,
        };
        Ok(OperatorRun { forward, gradient, forward_calls, backward_calls: calls.since(start) })
    }
}

fn run_operator(operator: Operator, world: usize) -> Vec<OperatorRun> {
    spawn_with_timeout(world, TIMEOUT, |pg| operator.run(Box::new(pg)))
        .unwrap_or_else(|e| panic!("{} on {world} ranks failed: {}", operator.name(), explain_error(&e)))
}

/// Rank `rank` of `world`'s forward through `operator`, or a failure that says how it went wrong.
fn checked_forward(operator: Operator, rank: usize, world: usize, run: &OperatorRun) {
    let name = operator.name();
    let along = along_the_batch(&run.forward_calls, SHAPE, world);
    let got = match &run.forward {
        Ok(got) => got,
        Err(e) => panic!(
            "rank {rank} of {world}: {name} failed: {e}{}",
            cause(along.is_some().then(|| mistake(27, "along_the_batch")))
        ),
    };
    let (want, _) = operator.expected(rank, world);
    let Some(difference) = got.difference(&want) else { return };
    let why = if along.is_some() {
        Some(mistake(27, "along_the_batch"))
    } else if !matches!(operator, Operator::ReduceScatter) {
        None
    } else if got.matches(&mean(&want, world)) {
        Some(mistake(27, "averaged_not_summed"))
    } else {
        got.matches(&tokens(0..SHAPE[1], |v| sum_of_parts(world, v))).then(|| mistake(27, "reduced_not_scattered"))
    };
    panic!(
        "rank {rank} of {world}: {name}'s output: {difference}{}{}",
        along.map(|what| format!("; {what}")).unwrap_or_default(),
        cause(why)
    );
}

/// Whether `calls` hold a `name`.
fn has(calls: &[Call], name: &str) -> bool {
    calls.iter().any(|(call, _)| call == name)
}

/// The two operators, forward: the gather on 2 and 3 ranks gives every rank
/// 100·b + 10·t + c at every token t; the reduce-scatter gives rank r the
/// sum of the ranks' parts 2^s·(100·b + 10·t + c + 1) at its tokens.
#[rstest]
#[case::all_gather_tokens_on_2(Operator::AllGather, 2)]
#[case::all_gather_tokens_on_3(Operator::AllGather, 3)]
#[case::reduce_scatter_tokens_on_2(Operator::ReduceScatter, 2)]
#[case::reduce_scatter_tokens_on_3(Operator::ReduceScatter, 3)]
fn each_operators_forward_puts_together_or_sums_and_cuts_the_tokens(#[case] operator: Operator, #[case] world: usize) {
    for (rank, run) in run_operator(operator, world).iter().enumerate() {
        checked_forward(operator, rank, world, run);
    }
}

/// The two operators, backward: the gather's input gets the sum of the
/// ranks' gradients at its tokens; the reduce-scatter's gets every rank's
/// gradient of its tokens, put together.
#[rstest]
#[case::all_gather_tokens_on_2(Operator::AllGather, 2)]
#[case::all_gather_tokens_on_3(Operator::AllGather, 3)]
#[case::reduce_scatter_tokens_on_2(Operator::ReduceScatter, 2)]
#[case::reduce_scatter_tokens_on_3(Operator::ReduceScatter, 3)]
fn each_operators_backward_is_the_conjugate_collective(#[case] operator: Operator, #[case] world: usize) {
    let name = operator.name();
    for (rank, run) in run_operator(operator, world).iter().enumerate() {
        checked_forward(operator, rank, world, run);
        let (_, want) = operator.expected(rank, world);
        let [(forward_collective, _), _] = operator.collectives(world);
        let calls = &run.backward_calls;
        let (difference, why) = match &run.gradient {
            Gradient::Some(got) => {
                let Some(difference) = got.difference(&want) else { continue };
                // Only the gather's backward sums over the ranks.
                let gather = matches!(operator, Operator::AllGather);
                let why = if gather && calls.is_empty() && got.matches(&tokens(own(rank, world), |v| part(rank, v))) {
                    Some(mistake(27, "gather_backward_keeps_own_chunk"))
                } else {
                    (gather && got.matches(&mean(&want, world))).then(|| mistake(27, "averaged_not_summed"))
                };
                (difference, why)
            }
            Gradient::Missing => (
                "no gradient reached the input: the backward from the output does not lead back to it".to_string(),
                Some(mistake(27, "not_recorded")),
            ),
            Gradient::Failed(e) => {
                let why = if has(calls, forward_collective) {
                    Some(mistake(27, "backward_repeats_forward"))
                } else {
                    (!calls.is_empty() && calls.iter().all(|(call, _)| call == "all_reduce"))
                        .then(|| mistake(27, "backward_all_reduces"))
                };
                (format!("the backward failed: {e}"), why)
            }
            Gradient::NotRun => unreachable!("checked_forward passed"),
        };
        panic!(
            "rank {rank} of {world}: the gradient {name} gives its input: {difference} (its backward made: {}){}",
            listed(calls),
            cause(why)
        );
    }
}

/// Each operator is one collective forward and one backward, of the sizes
/// that move chunks and not whole copies.
#[rstest]
#[case::all_gather_tokens_on_2(Operator::AllGather, 2)]
#[case::all_gather_tokens_on_3(Operator::AllGather, 3)]
#[case::reduce_scatter_tokens_on_2(Operator::ReduceScatter, 2)]
#[case::reduce_scatter_tokens_on_3(Operator::ReduceScatter, 3)]
fn each_operator_is_one_collective_forward_and_one_backward(#[case] operator: Operator, #[case] world: usize) {
    let name = operator.name();
    let whole = SHAPE.iter().product::<usize>();
    for (rank, run) in run_operator(operator, world).iter().enumerate() {
        checked_forward(operator, rank, world, run);
        let [(forward, forward_elements), (backward, backward_elements)] = operator.collectives(world);
        let right = |calls: &[Call], name: &str, elements: usize| calls.len() == 1 && count(calls, name, elements) == 1;
        let (forward_right, backward_right) = (
            right(&run.forward_calls, forward, forward_elements),
            right(&run.backward_calls, backward, backward_elements),
        );
        if forward_right && (backward_right || !matches!(run.gradient, Gradient::Some(_))) {
            continue;
        }
        // Right numbers from an all-reduce of a whole activation and a cut.
        let gradient_right = matches!(&run.gradient, Gradient::Some(g) if g.matches(&operator.expected(rank, world).1));
        let all_reduced =
            |calls: &[Call], replaced: &str| !has(calls, replaced) && count(calls, "all_reduce", whole) == 1;
        let why = ((!forward_right && all_reduced(&run.forward_calls, forward))
            || (!backward_right && gradient_right && all_reduced(&run.backward_calls, backward)))
        .then(|| mistake(27, "all_reduce_for_activations"));
        panic!(
            "rank {rank} of {world}: {name}'s forward made {} and its backward {}; expected one {forward} of \
             {forward_elements} elements forward and one {backward} of {backward_elements} backward{}",
            listed(&run.forward_calls),
            listed(&run.backward_calls),
            cause(why)
        );
    }
}

// ------------------------------------------------------------ the block

/// Rank `rank` of `world`'s tokens of a (B, T, C) tensor's values.
fn tokens_of(case: Case, whole: &[f32], rank: usize, world: usize) -> Vec<f32> {
    let per_rank = case.t / world * HIDDEN;
    let sequences = whole.chunks(case.t * HIDDEN);
    sequences.flat_map(|sequence| sequence[rank * per_rank..(rank + 1) * per_rank].to_vec()).collect()
}

/// What rank `rank` of `world` should end with: one process's step, its
/// output and ∂L/∂x cut to the rank's tokens.
fn expected(case: Case, rank: usize, world: usize) -> Outcome {
    let whole = reference_of(case, rank, world, true);
    Outcome {
        output: tokens_of(case, &whole.output, rank, world),
        grads: whole.grads,
        grad_input: tokens_of(case, &whole.grad_input, rank, world),
    }
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct RankRun {
    step: std::result::Result<Outcome, String>,
    /// Where the sequence was gathered or scattered along the batch instead, if it was.
    along_the_batch: Option<String>,
    forward_calls: Vec<Call>,
    backward_calls: Vec<Call>,
    /// Calls of any collective but an all-reduce, an all-gather and a reduce-scatter.
    others: u64,
}

fn rank_run(pg: Box<dyn ProcessGroup>, case: Case) -> Result<RankRun> {
    let (rank, world) = (pg.rank(), pg.world_size());
    let (tp, calls) = recorded(pg);
    let block = TensorParallelBlock::shard(&config_of(case), &params_of(case), 0, rank, world)?;
    let (x, grad_output) = batch_of(case);
    let own = |t: &Tensor| t.narrow(1, rank * case.t / world, case.t / world);
    let before = tp.stats();
    let mut forward_calls = None;
    let step = forward_and_backward(&block, &own(&x)?, &own(&grad_output)?, |x| {
        let y = sequence_parallel_block(&tp, &block, x);
        forward_calls = Some(calls.len());
        y
    });
    let used = tp.stats().since(&before);
    let counted = [Collective::AllGather, Collective::ReduceScatter, Collective::AllReduce];
    let others = Collective::ALL.iter().filter(|c| !counted.contains(c)).map(|&c| used.calls(c)).sum();
    let all = calls.since(0);
    let split = forward_calls.unwrap_or(all.len());
    Ok(RankRun {
        step: step.map_err(|e| explain_error(&e)),
        along_the_batch: along_the_batch(&all, [case.b, case.t, HIDDEN], world),
        forward_calls: all[..split].to_vec(),
        backward_calls: all[split..].to_vec(),
        others,
    })
}

/// Every rank's outcome; a failure at the first rank whose sequence went
/// along the batch (what follows from it, an error or wrong values, says
/// nothing more), else at the ranks whose step failed.
fn steps(runs: &[RankRun]) -> Vec<Outcome> {
    let world = runs.len();
    if let Some((rank, what)) = runs.iter().enumerate().find_map(|(r, run)| Some((r, run.along_the_batch.as_ref()?))) {
        panic!("rank {rank} of {world}: {what}{}", cause(Some(mistake(27, "along_the_batch"))));
    }
    every_rank(runs.iter().map(|run| &run.step), "sequence_parallel_block", "rank")
}

fn run(case: Case, world: usize) -> Vec<RankRun> {
    spawn_with_timeout(world, TIMEOUT, |pg| rank_run(Box::new(pg), case)).unwrap_or_else(|e| {
        panic!("the sequence-parallel step on {world} rank(s), {case:?}, failed: {}", explain_error(&e))
    })
}

fn norm_gradient<'a>(outcome: &'a Outcome, piece: &str) -> &'a [f32] {
    &outcome.grads[&format!("{P}.{piece}.weight")]
}

/// Whether every norm weight's gradient on every rank is the right one divided by `world`.
fn norm_gradients_divided(got: &[Outcome], want: &Outcome, world: usize) -> bool {
    world > 1
        && got.iter().all(|outcome| {
            NORMS.iter().all(|piece| {
                let divided: Vec<f32> = norm_gradient(want, piece).iter().map(|g| g / world as f32).collect();
                first_scaled_difference(norm_gradient(outcome, piece), &divided).is_none()
            })
        })
}

/// Whether each norm weight's gradients on the ranks, though wrong, sum to
/// the right one, each rank's its own part.
fn norm_gradients_are_parts(got: &[Outcome], want: &Outcome) -> bool {
    got.len() > 1
        && NORMS.iter().any(|piece| {
            let right = norm_gradient(want, piece);
            let sum: Vec<f32> =
                (0..right.len()).map(|i| got.iter().map(|o| norm_gradient(o, piece)[i]).sum()).collect();
            let own_parts = got.iter().any(|o| norm_gradient(o, piece) != norm_gradient(&got[0], piece));
            own_parts
                && first_scaled_difference(norm_gradient(&got[0], piece), right).is_some()
                && first_scaled_difference(&sum, right).is_none()
        })
}

/// Whether `got` is right but for the norms' weight gradients.
fn right_but_the_norms(got: &Outcome, want: &Outcome) -> bool {
    let mut with_norms = got.clone();
    for piece in NORMS {
        let name = format!("{P}.{piece}.weight");
        with_norms.grads.insert(name.clone(), want.grads[&name].clone());
    }
    outcome_difference(&with_norms, want).is_none()
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
        let want = expected(case, rank, world);
        let Some(difference) = outcome_difference(outcome, &want) else { continue };
        let why = if !right_but_the_norms(outcome, &want) {
            None
        } else if norm_gradients_divided(&got, &want, world) {
            Some(mistake(27, "averaged_not_summed"))
        } else {
            norm_gradients_are_parts(&got, &want).then(|| mistake(27, "norm_gradient_from_own_tokens"))
        };
        panic!(
            "rank {rank} of {world} (tokens {} to {}): {difference}{}",
            rank * case.t / world,
            (rank + 1) * case.t / world - 1,
            cause(why)
        );
    }
}

/// Forward: an all-gather of this rank's tokens before each sublayer's
/// matrices and a reduce-scatter of every token after them; backward, the
/// same two per sublayer the other way round; besides them nothing larger
/// than a norm's weight.
#[rstest]
#[case::six_tokens_on_2(CASE, 2)]
#[case::eight_tokens_on_4(EIGHT_TOKENS, 4)]
fn a_step_gathers_and_scatters_the_activations_and_nothing_larger_than_a_norm_weight_besides(
    #[case] case: Case,
    #[case] world: usize,
) {
    let runs = run(case, world);
    let got = steps(&runs);
    let (chunk, whole) = (case.b * case.t / world * HIDDEN, case.b * case.t * HIDDEN);
    for (rank, run) in runs.iter().enumerate() {
        for (phase, calls) in [("forward", &run.forward_calls), ("backward", &run.backward_calls)] {
            let (gathers, scatters) = (count(calls, "all_gather", chunk), count(calls, "reduce_scatter", whole));
            let rest: Vec<Call> = calls
                .iter()
                .filter(|(call, dims)| {
                    let elements = dims.iter().product::<usize>();
                    !(call == "all_gather" && elements == chunk || call == "reduce_scatter" && elements == whole)
                })
                .cloned()
                .collect();
            let small = rest.iter().all(|(_, dims)| dims.iter().product::<usize>() <= HIDDEN);
            if gathers == 2 && scatters == 2 && small && run.others == 0 {
                continue;
            }
            // The right numbers, each missing reduce-scatter an all-reduce of every token.
            let right = outcome_difference(&got[rank], &expected(case, rank, world)).is_none();
            let all_reduced = count(calls, "all_reduce", whole);
            let why = (right && all_reduced > 0 && scatters + all_reduced == 2)
                .then(|| mistake(27, "all_reduce_for_activations"));
            panic!(
                "rank {rank} of {world}, {phase}: all-gathers of this rank's tokens ({chunk} elements each): \
                 {gathers}; reduce-scatters of every token ({whole} elements each): {scatters}; other collectives \
                 besides: {} ({}); a block whose norms and residuals keep only this rank's tokens needs two of each \
                 per pass and nothing else larger than a norm's weight ({HIDDEN} elements){}",
                rest.len() + run.others as usize,
                listed(&rest),
                cause(why)
            );
        }
    }
}

/// Each rank a process, the activations and gradients exchanged over TCP.
#[test]
fn it_runs_across_processes_over_tcp() {
    let runs: Vec<RankRun> = on_processes(2, |pg| rank_run(Box::new(pg), CASE));
    for (rank, outcome) in steps(&runs).iter().enumerate() {
        let difference = outcome_difference(outcome, &expected(CASE, rank, 2));
        assert!(difference.is_none(), "rank {rank}'s process: {}", difference.unwrap());
    }
}
