//! Exercise 23: a tensor-parallel block, its forward recorded so that
//! candle's backward is right. The expected values are one process's: the
//! whole block, built here from its modules, forward and backward; each
//! rank's weight gradients are that gradient's rows or columns for its heads
//! and hidden units. A recorder counts the all-reduces and their operations;
//! a wrong result is compared with what each typical mistake gives.

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

pub(crate) fn config() -> GptConfig {
    config_of(CASE)
}

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

pub(crate) fn params() -> ParamStore {
    params_of(CASE)
}

pub(crate) fn params_of(case: Case) -> ParamStore {
    init_params(&config_of(case), 23, &Device::Cpu).unwrap()
}

pub(crate) fn batch() -> (Tensor, Tensor) {
    batch_of(CASE)
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
    let (config, params) = (config_of(case), params_of(case));
    let weight = |name: &str| params.tensor(&format!("{P}.{name}.weight")).unwrap();
    let linear = |name: &str| Linear::new(weight(name), None);
    let norm = |name: &str| RmsNorm::new(weight(name), config.norm_eps);
    let rotary = RotaryCache::new(HEAD_DIM, case.t, config.rope_theta, &Device::Cpu).unwrap();
    let attention = CausalSelfAttention::new(
        ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj"].map(linear),
        (HEADS, case.kv_heads),
        rotary,
    );
    let mlp = Mlp::new(linear("mlp.gate_proj"), linear("mlp.up_proj"), linear("mlp.down_proj"));
    let residual = |t: &Tensor| if residual_gradients { t.clone() } else { t.detach() };
    let (x, grad_output) = batch_of(case);
    let x = Var::from_tensor(&x).unwrap();
    let h = (residual(x.as_tensor()) + attention.forward(&norm("input_layernorm").forward(&x).unwrap())).unwrap();
    let y = (residual(&h) + mlp.forward(&norm("post_attention_layernorm").forward(&h).unwrap())).unwrap();
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

/// Notes every all-reduce's operation.
#[derive(Clone)]
struct Recorder(Arc<Mutex<Vec<String>>>);

impl CollectiveOverride for Recorder {
    fn all_reduce(&self, inner: &dyn ProcessGroup, t: &Tensor, op: ReduceOp) -> Result<Tensor> {
        self.0.lock().unwrap().push(format!("{op:?}"));
        inner.all_reduce(t, op)
    }
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct RankRun {
    step: std::result::Result<Outcome, String>,
    /// Each all-reduce's operation, in order.
    all_reduces: Vec<String>,
    /// Calls of any other collective.
    others: u64,
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

fn rank_run(pg: Box<dyn ProcessGroup>) -> Result<RankRun> {
    let block = TensorParallelBlock::shard(&config(), &params(), 0, pg.rank(), pg.world_size())?;
    let (x, grad_output) = batch();
    let ops = Arc::new(Mutex::new(vec![]));
    let tp = SharedGroup::new(Box::new(WithOverride::new(pg, Recorder(Arc::clone(&ops)))));
    let before = tp.stats();
    let step = forward_and_backward(&block, &x, &grad_output, |x| tensor_parallel_block(&tp, &block, x));
    let used = tp.stats().since(&before);
    let others = Collective::ALL.iter().filter(|&&c| c != Collective::AllReduce).map(|&c| used.calls(c)).sum();
    let all_reduces = ops.lock().unwrap().clone();
    Ok(RankRun { step: step.map_err(|e| explain_error(&e)), all_reduces, others })
}

fn steps(runs: &[RankRun]) -> Vec<Outcome> {
    every_rank(runs.iter().map(|run| &run.step), "tensor_parallel_block", "rank")
}

fn run(world: usize) -> Vec<RankRun> {
    spawn_with_timeout(world, TIMEOUT, |pg| rank_run(Box::new(pg)))
        .unwrap_or_else(|e| panic!("the tensor-parallel step on {world} rank(s) failed: {}", explain_error(&e)))
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

pub(crate) fn matches(got: &Outcome, want: &Outcome) -> bool {
    outcome_difference(got, want).is_none()
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

#[rstest]
fn every_rank_gets_the_whole_output_its_shards_gradients_and_the_whole_input_gradient(#[values(1, 2)] world: usize) {
    let runs = run(world);
    let got = steps(&runs);
    for (rank, outcome) in got.iter().enumerate() {
        let want = reference(rank, world, true);
        let Some(difference) = outcome_difference(outcome, &want) else { continue };
        let run = &runs[rank];
        let why = if run.all_reduces.iter().any(|op| op != "Sum") {
            Some(mistake(23, "averaged_not_summed"))
        } else if run.all_reduces.len() == 2 && first_scaled_difference(&outcome.output, &want.output).is_none() {
            Some(mistake(23, "no_backward_all_reduce"))
        } else if norm_gradients_are_parts(&got, &reference(0, world, true)) {
            Some(mistake(23, "norm_gradient_partial"))
        } else {
            matches(outcome, &reference(rank, world, false)).then(|| mistake(23, "residual_gradient_dropped"))
        };
        panic!("rank {rank} of {world}: {difference}{}", cause(why));
    }
}

#[test]
fn a_step_is_two_all_reduces_forward_and_two_backward() {
    let world = 2;
    let runs = run(world);
    steps(&runs);
    for (rank, run) in runs.iter().enumerate() {
        assert!(
            run.all_reduces.len() == 4 && run.others == 0,
            "rank {rank} of {world} issued {} all-reduce(s) ({:?}) and {} other collective(s); a block split by heads \
             and hidden units needs one all-reduce per sublayer in forward (g) and one in backward (f): 4, and nothing \
             else{}",
            run.all_reduces.len(),
            run.all_reduces,
            run.others,
            cause((run.all_reduces.len() == 2).then(|| mistake(23, "no_backward_all_reduce")))
        );
    }
}

/// Each rank a process, the activations and gradients all-reduced over TCP.
#[test]
fn it_runs_across_processes_over_tcp() {
    let runs: Vec<RankRun> = on_processes(2, |pg| rank_run(Box::new(pg)));
    for (rank, outcome) in steps(&runs).iter().enumerate() {
        let difference = outcome_difference(outcome, &reference(rank, 2, true));
        assert!(difference.is_none(), "rank {rank}'s process: {}", difference.unwrap());
    }
}
