//! Exercise 23: a tensor-parallel block assembled from exercise 20's f and
//! g, its backward candle's. The expected values are one process's: the
//! whole block, built here from its modules, forward and backward; each
//! rank's weight gradients are that gradient's rows or columns for its heads
//! and hidden units. A recorder notes each all-reduce's operation and shape,
//! forward and backward apart; a wrong result is compared with what each
//! typical mistake gives (the block's output with a sublayer's parts left
//! unsummed or a residual summed over the ranks, computed here too), and
//! named only when it matches.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use candle_core::{Device, Module, Result, Tensor, Var};
use rstest::rstest;
use workbook::autograd::{vjp, Gradients};
use workbook::distributed::{
    spawn_with_timeout, Collective, CollectiveOverride, ProcessGroup, ReduceOp, SharedGroup, WithOverride,
};
use workbook::model::{Linear, Weights};
use workbook::parallel::tensor::TensorParallelBlock;
use workbook::phase4_under_the_hood::tensor_parallel_block;
use workbook::{init_params, CausalSelfAttention, GptConfig, InitRng, Mlp, ParamStore, RmsNorm, RotaryCache};

use crate::fsdp_runs::as_values;
use crate::process_ranks::on_processes;
use crate::support::{cause, every_rank, explain_error, first_scaled_difference, mistake, values};

pub(crate) const TIMEOUT: Duration = Duration::from_secs(20);
pub(crate) const HIDDEN: usize = 16;
const HEADS: usize = 4;
const HEAD_DIM: usize = HIDDEN / HEADS;
const INTERMEDIATE: usize = 24;
pub(crate) const P: &str = "model.layers.0";

pub(crate) type Grads = BTreeMap<String, Vec<f32>>;

/// The batch a block runs on and its key/value heads.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Case {
    /// Sequences.
    pub b: usize,
    /// Tokens per sequence.
    pub t: usize,
    pub kv_heads: usize,
}

/// Grouped-query attention, four heads reading two key/value heads, on 2
/// sequences of 6 tokens: even, so that exercise 27 cuts them in two.
pub(crate) const CASE: Case = Case { b: 2, t: 6, kv_heads: 2 };

pub(crate) fn config_of(case: Case) -> GptConfig {
    GptConfig {
        vocab_size: 16,
        hidden_size: HIDDEN,
        num_layers: 1,
        num_heads: HEADS,
        num_kv_heads: Some(case.kv_heads),
        intermediate_size: INTERMEDIATE,
        max_seq_len: case.t,
        rope_theta: 10_000.0,
        norm_eps: 1e-5,
        bias: false,
        tie_word_embeddings: false,
    }
}

pub(crate) fn params_of(case: Case) -> ParamStore {
    init_params(&config_of(case), 23, &Device::Cpu).unwrap()
}

/// The block's input and ∂L/∂output, (B, T, C), the same on every rank.
pub(crate) fn batch_of(case: Case) -> (Tensor, Tensor) {
    let mut rng = InitRng::from_seed(230);
    let shape = (case.b, case.t, HIDDEN).into();
    (rng.normal(&shape, 1.0, &Device::Cpu).unwrap(), rng.normal(&shape, 0.1, &Device::Cpu).unwrap())
}

/// What a rank ends the step with, or what it should.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub(crate) struct Outcome {
    pub output: Vec<f32>,
    pub grads: Grads,
    pub grad_input: Vec<f32>,
}

/// One process, the whole block: `h = x + attn(norm₁(x))`, `y = h + mlp(norm₂(h))`,
/// and its backward, the weight gradients cut to rank `rank` of `world`'s
/// part. With `residual_gradients` false the residual paths carry no
/// gradient (a mistake's result).
pub(crate) fn reference(rank: usize, world: usize, residual_gradients: bool) -> Outcome {
    reference_of(CASE, rank, world, residual_gradients)
}

/// [`reference`] for another case.
pub(crate) fn reference_of(case: Case, rank: usize, world: usize, residual_gradients: bool) -> Outcome {
    let params = params_of(case);
    let block = WholeBlock::of(case, &params, None);
    let residual = |t: &Tensor| if residual_gradients { t.clone() } else { t.detach() };
    let (x, grad_output) = batch_of(case);
    let x = Var::from_tensor(&x).unwrap();
    let h = (residual(x.as_tensor()) + block.attention.forward(&block.norm1.forward(&x).unwrap())).unwrap();
    let y = (residual(&h) + block.mlp.forward(&block.norm2.forward(&h).unwrap())).unwrap();
    let store = vjp(&y, &grad_output).unwrap();
    let grads = params
        .iter()
        .filter_map(|(name, var)| Some((name.to_string(), store.get(var)?.clone())))
        .map(|(name, grad)| {
            let part = part_of(case, &name, rank, world, &grad);
            (name, part.flatten_all().unwrap().to_vec1().unwrap())
        })
        .collect();
    Outcome { output: values(&y), grads, grad_input: values(store.get(x.as_tensor()).unwrap()) }
}

/// The whole block's modules on one process; with `heads_of` (rank, world),
/// attention holds only that rank's heads, as its shard does.
struct WholeBlock {
    norm1: RmsNorm,
    attention: CausalSelfAttention,
    norm2: RmsNorm,
    mlp: Mlp,
}

impl WholeBlock {
    fn of(case: Case, params: &ParamStore, heads_of: Option<(usize, usize)>) -> Self {
        let config = config_of(case);
        let weight = |name: &str| {
            let whole = params.tensor(&format!("{P}.{name}.weight")).unwrap();
            match heads_of {
                Some((rank, world)) => part_of(case, &format!("{P}.{name}.weight"), rank, world, &whole),
                None => whole,
            }
        };
        let linear = |name: &str| Linear::new(weight(name), None);
        let norm = |name: &str| RmsNorm::new(weight(name), config.norm_eps);
        let world = heads_of.map_or(1, |(_, world)| world);
        let rotary = RotaryCache::new(HEAD_DIM, case.t, config.rope_theta, &Device::Cpu).unwrap();
        let attention = CausalSelfAttention::new(
            ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj"].map(linear),
            (HEADS / world, case.kv_heads / world),
            rotary,
        );
        let mlp = Mlp::new(linear("mlp.gate_proj"), linear("mlp.up_proj"), linear("mlp.down_proj"));
        Self { norm1: norm("input_layernorm"), attention, norm2: norm("post_attention_layernorm"), mlp }
    }
}

/// A mistaken block's output on rank `rank` of `world`, computed on one
/// process: `h = residuals[0]·x + attn(scale · norm₁(x))` with attention of
/// the rank's heads only when `own_heads` (its part, unsummed), then
/// `y = residuals[1]·h + mlp(norm₂(h))`.
fn mistaken_output(
    case: Case,
    rank: usize,
    world: usize,
    own_heads: bool,
    scale: f64,
    residuals: [f64; 2],
) -> Vec<f32> {
    let params = params_of(case);
    let whole = WholeBlock::of(case, &params, None);
    let attention = match own_heads {
        true => WholeBlock::of(case, &params, Some((rank, world))).attention,
        false => whole.attention,
    };
    let (x, _) = batch_of(case);
    let normed = whole.norm1.forward(&x).and_then(|n| n.affine(scale, 0.0)).unwrap();
    let h = (x.affine(residuals[0], 0.0).unwrap() + attention.forward(&normed).unwrap()).unwrap();
    let y = (h.affine(residuals[1], 0.0).unwrap() + whole.mlp.forward(&whole.norm2.forward(&h).unwrap())).unwrap();
    values(&y)
}

/// The typical mistake whose output the block's output on rank `rank` of
/// `world` equals, if any.
fn mistaken_forward(case: Case, got: &[f32], rank: usize, world: usize) -> Option<&'static str> {
    if world == 1 {
        return None;
    }
    let n = world as f64;
    let is = |own_heads, scale, residuals| {
        first_scaled_difference(got, &mistaken_output(case, rank, world, own_heads, scale, residuals)).is_none()
    };
    if is(true, 1.0, [1.0, 1.0]) {
        Some(mistake(23, "g_missing"))
    } else if is(true, n, [1.0, 1.0]) {
        Some(mistake(23, "f_and_g_swapped"))
    } else {
        let residual_summed = [[n, 1.0], [1.0, n], [n, n]].into_iter().any(|residuals| is(false, 1.0, residuals));
        residual_summed.then(|| mistake(23, "g_after_residual"))
    }
}

/// Rank `rank` of `world`'s part of the whole tensor `name`: rows of q, k, v,
/// gate and up, columns of o and down for its heads and units; norms whole.
fn part_of(case: Case, name: &str, rank: usize, world: usize, whole: &Tensor) -> Tensor {
    let rows = |per_rank: usize| whole.narrow(0, rank * per_rank, per_rank).unwrap();
    let columns = |per_rank: usize| whole.narrow(1, rank * per_rank, per_rank).unwrap();
    match name.trim_start_matches(&format!("{P}.")).trim_end_matches(".weight") {
        "self_attn.q_proj" => rows(HEADS / world * HEAD_DIM),
        "self_attn.k_proj" | "self_attn.v_proj" => rows(case.kv_heads / world * HEAD_DIM),
        "self_attn.o_proj" => columns(HEADS / world * HEAD_DIM),
        "mlp.gate_proj" | "mlp.up_proj" => rows(INTERMEDIATE / world),
        "mlp.down_proj" => columns(INTERMEDIATE / world),
        _ => whole.clone(),
    }
}

/// Notes every all-reduce's operation and the shape of its tensor.
#[derive(Clone)]
struct Recorder(Arc<Mutex<Vec<AllReduce>>>);

/// An all-reduce's operation and the shape of its tensor.
type AllReduce = (String, Vec<usize>);

impl CollectiveOverride for Recorder {
    fn all_reduce(&self, inner: &dyn ProcessGroup, t: &Tensor, op: ReduceOp) -> Result<Tensor> {
        self.0.lock().unwrap().push((format!("{op:?}"), t.dims().to_vec()));
        inner.all_reduce(t, op)
    }
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct RankRun {
    step: std::result::Result<Outcome, String>,
    /// The all-reduces of the forward, in order.
    forward: Vec<AllReduce>,
    /// The all-reduces of the backward, in order.
    backward: Vec<AllReduce>,
    /// Calls of any other collective.
    others: u64,
}

impl RankRun {
    /// (forward, backward) all-reduces.
    fn counts(&self) -> (usize, usize) {
        (self.forward.len(), self.backward.len())
    }
}

/// `forward` of `block` on `x`, then candle's backward from `grad_output`:
/// the output, the gradients of the block's parameters that the backward
/// reached, and ∂L/∂x.
pub(crate) fn forward_and_backward(
    block: &TensorParallelBlock,
    x: &Tensor,
    grad_output: &Tensor,
    forward: impl FnOnce(&Tensor) -> Result<Tensor>,
) -> Result<Outcome> {
    let x = Var::from_tensor(x)?;
    let output = forward(x.as_tensor())?;
    if output.dims() != grad_output.dims() {
        candle_core::bail!("the block's output has shape {:?}, expected {:?}", output.dims(), grad_output.dims());
    }
    let store = vjp(&output, grad_output)?;
    let Some(grad_input) = store.get(x.as_tensor()) else {
        candle_core::bail!("a backward from the block's output gives x no gradient: the output was not computed from x")
    };
    let grads = Gradients::from_store(block.params(), &store)?;
    Ok(Outcome { output: values(&output), grads: as_values(grads.iter()), grad_input: values(grad_input) })
}

fn rank_run(case: Case, pg: Box<dyn ProcessGroup>) -> Result<RankRun> {
    let block = TensorParallelBlock::shard(&config_of(case), &params_of(case), 0, pg.rank(), pg.world_size())?;
    let (x, grad_output) = batch_of(case);
    let ops = Arc::new(Mutex::new(vec![]));
    let tp = SharedGroup::new(Box::new(WithOverride::new(pg, Recorder(Arc::clone(&ops)))));
    let before = tp.stats();
    let in_forward = Mutex::new(0);
    let step = forward_and_backward(&block, &x, &grad_output, |x| {
        let y = tensor_parallel_block(&tp, &block, x);
        *in_forward.lock().unwrap() = ops.lock().unwrap().len();
        y
    });
    let used = tp.stats().since(&before);
    let others = Collective::ALL.iter().filter(|&&c| c != Collective::AllReduce).map(|&c| used.calls(c)).sum();
    let mut forward = ops.lock().unwrap().clone();
    let backward = forward.split_off(in_forward.into_inner().unwrap().min(forward.len()));
    Ok(RankRun { step: step.map_err(|e| explain_error(&e)), forward, backward, others })
}

fn steps(runs: &[RankRun]) -> Vec<Outcome> {
    every_rank(runs.iter().map(|run| &run.step), "tensor_parallel_block", "rank")
}

fn run(case: Case, world: usize) -> Vec<RankRun> {
    spawn_with_timeout(world, TIMEOUT, |pg| rank_run(case, Box::new(pg)))
        .unwrap_or_else(|e| panic!("the tensor-parallel block on {world} rank(s) failed: {}", explain_error(&e)))
}

/// Where `got` first differs from `want`, in the order backward computes:
/// the output, the MLP's pieces, attention's, then ∂L/∂x.
pub(crate) fn outcome_difference(got: &Outcome, want: &Outcome) -> Option<String> {
    if let Some(d) = first_scaled_difference(&got.output, &want.output) {
        return Some(format!("the block's output: {d}"));
    }
    let order = ["mlp.down_proj", "mlp.gate_proj", "mlp.up_proj", "post_attention_layernorm", "self_attn.o_proj"]
        .into_iter()
        .chain(["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "input_layernorm"]);
    for piece in order {
        let name = format!("{P}.{piece}.weight");
        let Some(got_grad) = got.grads.get(&name) else { return Some(format!("`{name}` has no gradient")) };
        if let Some(d) = first_scaled_difference(got_grad, &want.grads[&name]) {
            return Some(format!("the gradient of this rank's `{name}`: {d}"));
        }
    }
    first_scaled_difference(&got.grad_input, &want.grad_input).map(|d| format!("∂L/∂x: {d}"))
}

/// Whether each norm weight's gradients on the ranks, though wrong, sum to
/// the right one, each rank's its own part (the same wrong value on every
/// rank, N times too small, is another mistake: an average).
pub(crate) fn norm_gradients_are_parts(got: &[Outcome], want: &Outcome) -> bool {
    got.len() > 1
        && ["input_layernorm", "post_attention_layernorm"].iter().any(|piece| {
            let name = format!("{P}.{piece}.weight");
            let sum: Vec<f32> =
                (0..want.grads[&name].len()).map(|i| got.iter().map(|o| o.grads[&name][i]).sum()).collect();
            let own_parts = got.iter().any(|o| o.grads[&name] != got[0].grads[&name]);
            own_parts
                && first_scaled_difference(&got[0].grads[&name], &want.grads[&name]).is_some()
                && first_scaled_difference(&sum, &want.grads[&name]).is_none()
        })
}

/// Grouped-query attention off: one key/value head per head, so that 4
/// ranks split the heads, on 1 sequence of 5 tokens.
const FOUR_RANKS: Case = Case { b: 1, t: 5, kv_heads: 4 };

#[rstest]
#[case(CASE, 1)]
#[case(CASE, 2)]
#[case(FOUR_RANKS, 4)]
fn every_rank_gets_the_whole_output_its_shards_gradients_and_the_whole_input_gradient(
    #[case] case: Case,
    #[case] world: usize,
) {
    let runs = run(case, world);
    let got = steps(&runs);
    for (rank, outcome) in got.iter().enumerate() {
        let want = reference_of(case, rank, world, true);
        let Some(difference) = outcome_difference(outcome, &want) else { continue };
        let output_right = first_scaled_difference(&outcome.output, &want.output).is_none();
        let norm_parts = norm_gradients_are_parts(&got, &reference_of(case, 0, world, true));
        let input_right = first_scaled_difference(&outcome.grad_input, &want.grad_input).is_none();
        let why = match runs[rank].counts() {
            _ if !output_right => mistaken_forward(case, &outcome.output, rank, world),
            (2, 2) if norm_parts && input_right => Some(mistake(23, "f_before_norm")),
            (2, 1) if norm_parts => Some(mistake(23, "f_missing")),
            (2, 3) => Some(mistake(23, "f_applied_twice")),
            _ => None,
        };
        panic!("rank {rank} of {world}: {difference}{}", cause(why));
    }
}

#[rstest]
#[case(CASE, 2)]
#[case(FOUR_RANKS, 4)]
fn a_step_is_two_all_reduces_forward_and_two_backward(#[case] case: Case, #[case] world: usize) {
    let runs = run(case, world);
    let got = steps(&runs);
    let shape = vec![case.b, case.t, HIDDEN];
    for (rank, run) in runs.iter().enumerate() {
        let sums_of = |calls: &[AllReduce]| calls.iter().all(|(op, dims)| op == "Sum" && *dims == shape);
        if run.counts() == (2, 2) && sums_of(&run.forward) && sums_of(&run.backward) && run.others == 0 {
            continue;
        }
        let output_right =
            first_scaled_difference(&got[rank].output, &reference_of(case, rank, world, true).output).is_none();
        let why = match run.counts() {
            (2, 1) if output_right => Some(mistake(23, "f_missing")),
            (2, 3) if output_right => Some(mistake(23, "f_applied_twice")),
            _ => None,
        };
        panic!(
            "rank {rank} of {world}: forward issued the all-reduces {:?}, backward {:?} (each an operation and a \
             shape), and {} other collective(s); a block split by heads and hidden units needs one all-reduce per \
             sublayer forward (g) and one backward (f), each a Sum of a {shape:?} activation, and nothing else{}",
            run.forward,
            run.backward,
            run.others,
            cause(why)
        );
    }
}

/// Each rank a process, the activations and gradients all-reduced over TCP.
#[test]
fn it_runs_across_processes_over_tcp() {
    let runs: Vec<RankRun> = on_processes(2, |pg| rank_run(CASE, Box::new(pg)));
    for (rank, outcome) in steps(&runs).iter().enumerate() {
        let difference = outcome_difference(outcome, &reference(rank, 2, true));
        assert!(difference.is_none(), "rank {rank}'s process: {}", difference.unwrap());
    }
}
