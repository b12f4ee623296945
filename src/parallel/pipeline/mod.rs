//! Pipeline parallelism: the model's blocks cut into consecutive stages, one
//! per rank. A micro-batch's activations travel forward from stage to stage
//! and their gradients travel back; the schedule that keeps the stages busy
//! is exercise 21 (`exercises/phase4_under_the_hood/ex21_gpipe.rs`).
//!
//! A stage runs only its own part of the model and records the order in
//! which it ran forwards and backwards, so a schedule can be checked and its
//! idle time (the bubble) worked out.

use std::ops::Range;
use std::sync::{Mutex, PoisonError};

use candle_core::backprop::GradStore;
use candle_core::{bail, DType, Module, Result, Tensor};
use candle_nn::Embedding;

use crate::autograd::{vjp, Gradients};
use crate::model::{layer_of, Block, GptConfig, Linear, ParamStore, RmsNorm, RotaryCache, Weights};
use crate::phase1_model::next_token_loss;
use crate::timeline;

mod trainer;
pub use trainer::PipelineTrainer;

/// One rank's stage: the embedding on the first stage, a run of blocks, and
/// the final norm, head and next-token loss on the last.
pub struct PipelineStage {
    index: usize,
    stages: usize,
    layers: Range<usize>,
    embed_tokens: Option<Embedding>,
    blocks: Vec<Block>,
    head: Option<(RmsNorm, Linear)>,
    params: ParamStore,
    hidden_size: usize,
    dtype: DType,
    schedule: Mutex<Vec<StageOp>>,
}

/// What a stage ran, in the order it ran it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum StageOp {
    Forward,
    Backward,
}

/// What one stage ends a pipelined step with.
#[derive(Debug, Clone)]
pub struct PipelineStep {
    /// The step's loss, the mean over its micro-batches: on the last stage only.
    pub loss: Option<f32>,
    /// The gradients of this stage's parameters for the step's loss.
    pub grads: Gradients,
}

/// The layers stage `index` of `stages` holds: consecutive runs as even as
/// can be, the earlier stages taking one more when they do not divide.
pub fn stage_layers(num_layers: usize, stages: usize, index: usize) -> Range<usize> {
    let (base, extra) = (num_layers / stages, num_layers % stages);
    let start = index * base + index.min(extra);
    start..start + base + usize::from(index < extra)
}

/// The stage of `stages` that holds parameter `name`: its block's stage; the
/// embedding on the first, the final norm and the head on the last.
pub fn stage_holding(config: &GptConfig, stages: usize, name: &str) -> usize {
    match layer_of(name) {
        Some(layer) => (0..stages).find(|&s| stage_layers(config.num_layers, stages, s).contains(&layer)),
        None if name.starts_with("model.embed_tokens.") => Some(0),
        None => None,
    }
    .unwrap_or(stages - 1)
}

impl PipelineStage {
    /// Stage `index` of `stages` of the model `params` holds. The stage keeps
    /// only its own parameters, sharing their variables with `params`.
    pub fn new(config: &GptConfig, params: &ParamStore, index: usize, stages: usize) -> Result<Self> {
        config.validate()?;
        params.check_matches(config)?;
        if index >= stages {
            bail!("stage {index} of {stages}: stages are numbered 0 to {}", stages.saturating_sub(1));
        }
        if config.num_layers < stages {
            bail!("{} layers cannot fill {stages} pipeline stages: use at most one stage per layer", config.num_layers);
        }
        if config.tie_word_embeddings && stages > 1 {
            bail!(
                "tied embeddings would put one weight on the first and the last stage; \
                 set tie_word_embeddings = false to pipeline this model"
            );
        }
        let layers = stage_layers(config.num_layers, stages, index);
        let (first, last) = (index == 0, index + 1 == stages);
        let params = params.subset(|name| stage_holding(config, stages, name) == index);
        // Every stage holds at least one block, so at least one parameter.
        let Some((_, any)) = params.iter().next() else { bail!("stage {index} holds no parameters") };
        let (device, dtype) = (any.device().clone(), any.dtype());
        let rotary = RotaryCache::new(config.head_dim(), config.max_seq_len, config.rope_theta, &device)?;
        let blocks = layers.clone().map(|layer| Block::new(config, &params, layer, &rotary)).collect::<Result<_>>()?;
        let embed_tokens = match first {
            true => Some(Embedding::new(params.tensor("model.embed_tokens.weight")?, config.hidden_size)),
            false => None,
        };
        let head = match last {
            true => Some((
                RmsNorm::new(params.tensor("model.norm.weight")?, config.norm_eps),
                params.linear("lm_head", false)?,
            )),
            false => None,
        };
        Ok(Self {
            index,
            stages,
            layers,
            embed_tokens,
            blocks,
            head,
            params,
            hidden_size: config.hidden_size,
            dtype,
            schedule: Mutex::new(vec![]),
        })
    }

    /// This stage's place in the pipeline, from 0: the rank that runs it.
    pub fn index(&self) -> usize {
        self.index
    }

    pub fn stages(&self) -> usize {
        self.stages
    }

    /// The first stage reads token ids; the others receive activations.
    pub fn is_first(&self) -> bool {
        self.index == 0
    }

    /// The last stage ends in the loss; the others send activations on.
    pub fn is_last(&self) -> bool {
        self.index + 1 == self.stages
    }

    /// The blocks this stage runs.
    pub fn layers(&self) -> Range<usize> {
        self.layers.clone()
    }

    /// This stage's parameters.
    pub fn params(&self) -> &ParamStore {
        &self.params
    }

    /// Runs one micro-batch through this stage. `input` is the micro-batch's
    /// token ids (B, T) on the first stage and the previous stage's output
    /// (B, T, C) on the others; `tokens` are the ids, which the last stage
    /// scores its predictions against. Returns the (B, T, C) activations to
    /// send on, or on the last stage the micro-batch's mean next-token loss
    /// (an f32 scalar).
    pub fn forward(&self, input: &Tensor, tokens: &Tensor) -> Result<Tensor> {
        let _span = timeline::span("compute", format!("forward, stage {}", self.index));
        self.record(StageOp::Forward);
        let mut x = match &self.embed_tokens {
            Some(embed_tokens) => embed_tokens.forward(input)?,
            None => {
                let (b, t) = tokens.dims2()?;
                if input.dims() != [b, t, self.hidden_size] {
                    bail!(
                        "stage {} takes activations of shape [{b}, {t}, {}] for tokens {:?}, got {:?}",
                        self.index,
                        self.hidden_size,
                        tokens.dims(),
                        input.dims()
                    );
                }
                input.clone()
            }
        };
        for block in &self.blocks {
            x = block.forward(&x)?;
        }
        match &self.head {
            Some((norm, lm_head)) => next_token_loss(&lm_head.forward(&norm.forward(&x)?)?, tokens),
            None => Ok(x),
        }
    }

    /// A tensor shaped like this stage's input activations for `tokens`
    /// (B, T): (B, T, C), in the model's dtype, on its device. `recv` takes
    /// the shape of what it receives from it.
    pub fn activation_like(&self, tokens: &Tensor) -> Result<Tensor> {
        let (b, t) = tokens.dims2()?;
        Tensor::zeros((b, t, self.hidden_size), self.dtype, tokens.device())
    }

    /// Back-propagates `grad_output`, the gradient of the step's loss with
    /// respect to `output` (what [`forward`](Self::forward) returned; of its
    /// shape, a scalar on the last stage), through the graph of that forward.
    /// The store holds the gradients of this stage's parameters and of every
    /// variable the forward read, its input among them when it was a `Var`.
    pub fn backward(&self, output: &Tensor, grad_output: &Tensor) -> Result<GradStore> {
        let _span = timeline::span("compute", format!("backward, stage {}", self.index));
        self.record(StageOp::Backward);
        if output.dims() != grad_output.dims() {
            bail!(
                "stage {}: the gradient of an output of shape {:?} has that shape, not {:?}",
                self.index,
                output.dims(),
                grad_output.dims()
            );
        }
        vjp(output, &grad_output.to_dtype(output.dtype())?)
    }

    /// The gradients of this stage's parameters in `store`, by name, as f32.
    pub fn gradients(&self, store: &GradStore) -> Result<Gradients> {
        Gradients::from_store(&self.params, store)
    }

    /// The forwards and backwards run since the last call, in order.
    pub fn take_schedule(&self) -> Vec<StageOp> {
        std::mem::take(&mut *self.schedule.lock().unwrap_or_else(PoisonError::into_inner))
    }

    fn record(&self, op: StageOp) {
        self.schedule.lock().unwrap_or_else(PoisonError::into_inner).push(op);
    }
}

/// The share of time the stages sit idle when stage s ran `schedules[s]`,
/// a forward costs `forward` and a backward `backward`: a stage's k-th
/// forward waits for the k-th forward of the stage before it (its input),
/// its k-th backward for the k-th backward of the stage after it (its
/// output's gradient). GPipe's schedule idles (S−1)/(M+S−1) of the time,
/// whatever the two costs.
pub fn bubble_fraction(schedules: &[Vec<StageOp>], forward: f64, backward: f64) -> Result<f64> {
    let stages = schedules.len();
    // done[s][op] holds the finish times of stage s's forwards (0) and backwards (1), in order.
    let mut done = vec![[Vec::new(), Vec::new()]; stages];
    let (mut next, mut free) = (vec![0; stages], vec![0.0f64; stages]);
    loop {
        let mut progressed = false;
        for s in 0..stages {
            while let Some(&op) = schedules[s].get(next[s]) {
                let (kind, cost, upstream) = match op {
                    StageOp::Forward => (0, forward, s.checked_sub(1)),
                    StageOp::Backward => (1, backward, Some(s + 1).filter(|&n| n < stages)),
                };
                let k = done[s][kind].len();
                let ready = match upstream {
                    None => 0.0,
                    Some(u) => match done[u][kind].get(k) {
                        Some(&t) => t,
                        None => break,
                    },
                };
                free[s] = free[s].max(ready) + cost;
                done[s][kind].push(free[s]);
                next[s] += 1;
                progressed = true;
            }
        }
        if next.iter().zip(schedules).all(|(n, schedule)| *n == schedule.len()) {
            break;
        }
        if !progressed {
            let s = (0..stages).find(|&s| next[s] < schedules[s].len()).unwrap_or(0);
            bail!("the schedules wait on each other: stage {s}'s step {} can never start", next[s] + 1);
        }
    }
    let makespan = free.iter().copied().fold(0.0, f64::max);
    let busy: f64 = schedules.iter().flatten().map(|op| if *op == StageOp::Forward { forward } else { backward }).sum();
    Ok(if makespan == 0.0 { 0.0 } else { 1.0 - busy / (stages as f64 * makespan) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::param_specs;

    fn model(num_layers: usize, tie_word_embeddings: bool) -> (GptConfig, ParamStore) {
        let config = GptConfig {
            vocab_size: 16,
            hidden_size: 8,
            num_layers,
            num_heads: 2,
            num_kv_heads: None,
            intermediate_size: 16,
            max_seq_len: 4,
            rope_theta: 10_000.0,
            norm_eps: 1e-5,
            bias: false,
            tie_word_embeddings,
        };
        let zeros = param_specs(&config)
            .into_iter()
            .map(|spec| (spec.name, Tensor::zeros(spec.shape, DType::F32, &candle_core::Device::Cpu).unwrap()));
        (config.clone(), ParamStore::from_tensors(zeros).unwrap())
    }

    #[test]
    fn each_stage_holds_its_blocks_and_the_ends_hold_the_rest() {
        let (config, params) = model(3, false);
        let names = |index| -> Vec<String> {
            let stage = PipelineStage::new(&config, &params, index, 2).unwrap();
            stage.params().iter().map(|(name, _)| name.to_string()).filter(|n| !n.contains(".layers.")).collect()
        };
        assert_eq!(names(0), ["model.embed_tokens.weight"]);
        assert_eq!(names(1), ["lm_head.weight", "model.norm.weight"]);
        assert_eq!(PipelineStage::new(&config, &params, 1, 2).unwrap().layers(), 2..3);
    }

    #[test]
    fn a_pipeline_longer_than_the_model_or_with_tied_ends_is_an_error() {
        let (config, params) = model(2, false);
        let error = PipelineStage::new(&config, &params, 0, 3).err().unwrap().to_string();
        assert!(error.contains("2 layers cannot fill 3 pipeline stages"), "{error}");
        let (config, params) = model(2, true);
        let error = PipelineStage::new(&config, &params, 0, 2).err().unwrap().to_string();
        assert!(error.contains("tie_word_embeddings = false"), "{error}");
    }

    fn gpipe(micro_batches: usize) -> Vec<StageOp> {
        [vec![StageOp::Forward; micro_batches], vec![StageOp::Backward; micro_batches]].concat()
    }

    #[test]
    fn layers_split_into_even_runs_the_first_stages_taking_the_rest() {
        let split: Vec<_> = (0..3).map(|i| stage_layers(8, 3, i)).collect();
        assert_eq!(split, [0..3, 3..6, 6..8]);
        assert_eq!(stage_layers(4, 4, 3), 3..4);
    }

    #[test]
    fn gpipe_idles_s_minus_one_over_m_plus_s_minus_one() {
        for (stages, micro_batches) in [(2, 4), (4, 4), (4, 8), (3, 1)] {
            let bubble = bubble_fraction(&vec![gpipe(micro_batches); stages], 1.0, 2.0).unwrap();
            let want = (stages - 1) as f64 / (micro_batches + stages - 1) as f64;
            assert!((bubble - want).abs() < 1e-12, "S {stages}, M {micro_batches}: {bubble} vs {want}");
        }
    }

    #[test]
    fn one_micro_batch_at_a_time_idles_all_but_one_stage() {
        let one_by_one = [StageOp::Forward, StageOp::Backward].repeat(4);
        let bubble = bubble_fraction(&vec![one_by_one; 4], 1.0, 2.0).unwrap();
        assert!((bubble - 0.75).abs() < 1e-12, "{bubble}");
    }

    #[test]
    fn schedules_that_wait_on_each_other_are_an_error() {
        // Stage 0 waits for a gradient of a micro-batch it has not sent yet.
        let crossed = vec![vec![StageOp::Backward, StageOp::Forward], vec![StageOp::Forward, StageOp::Backward]];
        assert!(bubble_fraction(&crossed, 1.0, 1.0).is_err());
    }
}
