//! Pipeline parallelism: the model's blocks cut into consecutive stages, one
//! per rank. A micro-batch's activations travel forward from stage to stage
//! and their gradients travel back; the schedules that keep the stages busy
//! are exercises 21 (GPipe, `exercises/phase4_under_the_hood/ex21_gpipe.rs`)
//! and 24 (1F1B, `ex24_one_f_one_b.rs`).
//!
//! A stage runs only its own part of the model and records the order in
//! which it ran forwards and backwards, so a schedule can be checked and its
//! idle time (the bubble) worked out. On a mesh with tensor parallelism a
//! stage's blocks are split across its tp group and run by exercise 23, or
//! 27 with the tokens cut along the sequence ([`PipelineStage::split`]);
//! the schedule sees the same stage either way.

use std::collections::HashMap;
use std::fmt;
use std::ops::Range;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};

use candle_core::backprop::GradStore;
use candle_core::{bail, DType, Module, Result, Tensor, TensorId, Var};
use candle_nn::Embedding;

use crate::autograd::{accumulate, vjp, Checkpointed, Gradients, Recompute};
use crate::distributed::{ProcessGroup, SharedGroup};
use crate::memory::{held_after, thread_live_bytes};
use crate::model::{layer_of, lm_head, Block, GptConfig, Linear, ParamStore, RmsNorm, RotaryCache, Weights};
use crate::parallel::fsdp::{
    bytes, embedding_grad, head_backward, head_forward, FlatLayout, FsdpUnit, MemoryLedger, MixedPrecisionPolicy,
    ShardedUnit, ShardingPlan, UnitPlacement, ROOT_UNIT,
};
use crate::parallel::fsdp_unit::BlockUnit;
use crate::parallel::tensor::{join_tokens, split_tokens, BlockStep, SplitBlock, TensorParallelBlock};
use crate::phase1_model::next_token_loss;
use crate::phase4_under_the_hood::{gpipe_step, one_f_one_b_step};
use crate::timeline;

mod replayed;
pub use replayed::{HeldUnits, Units};
use replayed::{Kept, ReplayedBlocks};

/// One rank's stage: the embedding on the first stage, a run of blocks, and
/// the final norm, head and next-token loss on the last.
pub struct PipelineStage {
    index: usize,
    stages: usize,
    layers: Range<usize>,
    /// On the first stage, while its parameters are whole (under FSDP,
    /// between [`gather_root`](Self::gather_root) and [`reshard_root`](Self::reshard_root)).
    embed_tokens: Option<Embedding>,
    blocks: StageBlocks,
    /// On the last stage, while its parameters are whole.
    head: Option<Head>,
    params: ParamStore,
    config: GptConfig,
    dtype: DType,
    schedule: Mutex<Vec<StageOp>>,
    /// Forwards run on an input that tracks no gradient (see [`PipelineStage::take_untracked_inputs`]).
    untracked_inputs: AtomicUsize,
    /// What the last stage multiplies the loss's gradient by (fp16's loss
    /// scaling; 1 elsewhere), as an f64's bits.
    loss_scale: AtomicU64,
}

/// A stage's blocks: modules run with their graph (whole, or split across
/// a tensor-parallel group), or FSDP units replayed in backward.
enum StageBlocks {
    Whole(WholeBlocks),
    Replayed(Box<ReplayedBlocks>),
}

/// The last stage's final norm and head.
type Head = (RmsNorm, Linear);

/// How a stage holds its blocks, as it is built.
enum Holding<'a> {
    Whole,
    Split(SharedGroup, BlockStep),
    /// FSDP units across the first group (replicated across the second
    /// under HYBRID_SHARD), of this rank's shards of each block across the
    /// third when there is one (FSDP × TP), laid out as the plan says.
    Sharded((SharedGroup, Option<SharedGroup>), Option<(SharedGroup, BlockStep)>, FsdpPlan<'a>),
}

/// How FSDP lays a stage out: the plan of what is sharded (exercise 12's),
/// the model's units (exercise 14's wrap policy: the root, then one per
/// block; the stage takes its blocks' and its part of the root), and each
/// parameter's weight decay, which the units' AdamW applies element by element.
#[derive(Clone, Copy)]
pub struct FsdpPlan<'a> {
    pub plan: &'a ShardingPlan,
    /// The dtypes the units gather, compute and reduce in (exercise 13's).
    pub policy: &'a MixedPrecisionPolicy,
    pub units: &'a [FsdpUnit],
    pub weight_decay_of: &'a dyn Fn(&str) -> f64,
}

/// Blocks run as modules, each under activation checkpointing when asked:
/// a forward then keeps only each block's input, on a tape its backward
/// replays, found by the output the forward handed out.
struct WholeBlocks {
    blocks: Vec<StageBlock>,
    /// Under sequence parallelism, the group whose ranks each run a chunk of
    /// the tokens through the blocks.
    sequence: Option<SharedGroup>,
    checkpointing: bool,
    tapes: Mutex<HashMap<TensorId, Recompute>>,
}

/// One block of a stage: the whole block, or this rank's shard of it.
#[derive(Clone)]
enum StageBlock {
    Whole(Block),
    Split(SplitBlock),
}

impl Module for StageBlock {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        match self {
            Self::Whole(block) => block.forward(x),
            Self::Split(block) => block.forward(x),
        }
    }
}

impl Checkpointed for StageBlock {
    fn variables(&self) -> Option<Vec<Tensor>> {
        match self {
            Self::Whole(block) => block.variables(),
            Self::Split(block) => block.variables(),
        }
    }
}

impl WholeBlocks {
    fn new(blocks: Vec<StageBlock>, sequence: Option<SharedGroup>) -> Self {
        Self { blocks, sequence, checkpointing: false, tapes: Mutex::new(HashMap::new()) }
    }
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

/// The order in which a pipelined step runs its micro-batches' forwards and
/// backwards. Both give the same gradients and idle the stages as long;
/// they differ in how many micro-batches a stage holds in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PipelineSchedule {
    /// All M forwards, then all M backwards (exercise 21).
    #[default]
    GPipe,
    /// Each backward as early as its gradient can arrive, so that stage s
    /// holds at most S − s micro-batches in flight (exercise 24).
    OneFOneB,
}

impl PipelineSchedule {
    /// One step of `stage` over `micro_batches`, with the learner's exercise.
    pub fn step(self, pg: &dyn ProcessGroup, stage: &PipelineStage, micro_batches: &[Tensor]) -> Result<PipelineStep> {
        match self {
            Self::GPipe => gpipe_step(pg, stage, micro_batches),
            Self::OneFOneB => one_f_one_b_step(pg, stage, micro_batches),
        }
    }

    /// The exercise that writes this schedule.
    pub fn exercise(self) -> u32 {
        match self {
            Self::GPipe => 21,
            Self::OneFOneB => 24,
        }
    }

    /// The most micro-batches stage `index` of `stages` holds between their
    /// forward and their backward, of `micro_batches`: all of them under
    /// GPipe, S − s under 1F1B.
    pub fn most_in_flight(self, index: usize, stages: usize, micro_batches: usize) -> usize {
        match self {
            Self::GPipe => micro_batches,
            Self::OneFOneB => (stages - index).min(micro_batches),
        }
    }
}

impl fmt::Display for PipelineSchedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::GPipe => "GPipe",
            Self::OneFOneB => "1F1B",
        })
    }
}

impl FromStr for PipelineSchedule {
    type Err = candle_core::Error;

    fn from_str(name: &str) -> Result<Self> {
        match name {
            "gpipe" => Ok(Self::GPipe),
            "1f1b" => Ok(Self::OneFOneB),
            // A flag's value: the message alone, no backtrace.
            other => Err(candle_core::Error::Msg(format!("unknown pipeline schedule `{other}`: use gpipe or 1f1b"))),
        }
    }
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
        Self::build(config, params, index, stages, Holding::Whole)
    }

    /// Stage `index` of `stages`, its blocks split across the group `tp` and
    /// run by exercise 23, or 27 when `step` says so (this rank's shard of
    /// each; the embedding, final norm and head whole). Its parameters are
    /// its own copies.
    pub fn split(
        config: &GptConfig,
        params: &ParamStore,
        index: usize,
        stages: usize,
        tp: SharedGroup,
        step: BlockStep,
    ) -> Result<Self> {
        Self::build(config, params, index, stages, Holding::Split(tp, step))
    }

    /// Stage `index` of `stages`, each of its blocks an FSDP unit across the
    /// group `shard` (in f32), stepped by exercise 22, and under
    /// HYBRID_SHARD replicated across `replicas`; with `split`, each unit
    /// holds this rank's shards of its block across that tensor-parallel
    /// group, run by that exercise (FSDP × TP). The embedding, final norm
    /// and head (those of them the stage holds) are its root unit, sharded
    /// the same way and whole on every rank of a tensor-parallel group.
    /// `fsdp` gives the plan, the units and the weight decays.
    pub fn sharded(
        config: &GptConfig,
        params: &ParamStore,
        (index, stages): (usize, usize),
        groups: (SharedGroup, Option<SharedGroup>),
        split: Option<(SharedGroup, BlockStep)>,
        fsdp: FsdpPlan<'_>,
    ) -> Result<Self> {
        Self::build(config, params, index, stages, Holding::Sharded(groups, split, fsdp))
    }

    fn build(
        config: &GptConfig,
        params: &ParamStore,
        index: usize,
        stages: usize,
        holding: Holding<'_>,
    ) -> Result<Self> {
        config.validate()?;
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
        params.check_holds(config, |name| stage_holding(config, stages, name) == index)?;
        let layers = stage_layers(config.num_layers, stages, index);
        let (first, last) = (index == 0, index + 1 == stages);
        let mine = params.subset(|name| stage_holding(config, stages, name) == index);
        // Every stage holds at least one block, so at least one parameter.
        let Some((_, any)) = mine.iter().next() else { bail!("stage {index} holds no parameters") };
        let device = any.device().clone();
        // The activations a stage hands on: in the dtype its blocks compute in.
        let dtype = match &holding {
            Holding::Sharded(_, _, fsdp) => fsdp.policy.param_dtype,
            _ => any.dtype(),
        };
        let outer = || mine.subset(|name| layer_of(name).is_none());
        let (blocks, params) = match holding {
            Holding::Whole => {
                let rotary = RotaryCache::new(config.head_dim(), config.max_seq_len, config.rope_theta, &device)?;
                let blocks =
                    layers.clone().map(|layer| Ok(StageBlock::Whole(Block::new(config, &mine, layer, &rotary)?)));
                let blocks = blocks.collect::<Result<_>>()?;
                (StageBlocks::Whole(WholeBlocks::new(blocks, None)), mine)
            }
            Holding::Split(tp, step) => {
                let (rank, ranks) = (tp.rank(), tp.world_size());
                let blocks = layers
                    .clone()
                    .map(|layer| TensorParallelBlock::shard(config, params, layer, rank, ranks))
                    .map(|block| Ok(SplitBlock::new(block?, tp.clone(), step)))
                    .collect::<Result<Vec<_>>>()?;
                let held =
                    ParamStore::union(std::iter::once(&outer()).chain(blocks.iter().map(|b| b.block().params())))?;
                let sequence = (step == BlockStep::SequenceParallel).then_some(tp);
                let blocks = blocks.into_iter().map(StageBlock::Split).collect();
                (StageBlocks::Whole(WholeBlocks::new(blocks, sequence)), held)
            }
            Holding::Sharded((shard, replicas), split, FsdpPlan { plan, policy, units, weight_decay_of }) => {
                let (rank, ranks) = (shard.rank(), shard.world_size());
                let Some((root_names, block_names)) = units.split_first() else {
                    bail!("the wrap policy made no unit")
                };
                let names_of = |layer: usize| block_names.get(layer).map_or(vec![], |unit| unit.params.clone());
                let blocks = BlockUnit::shard_layers(
                    config,
                    params,
                    layers.clone(),
                    (rank, ranks),
                    (plan, policy),
                    split.clone(),
                    (&names_of, weight_decay_of),
                )?;
                let sequence = split.and_then(|(tp, step)| (step == BlockStep::SequenceParallel).then_some(tp));
                // The blocks' units count what is whole; so does the root.
                let Some(gathered) = blocks.first().map(ShardedUnit::gathered_bytes) else {
                    bail!("stage {index} holds no block")
                };
                let at = UnitPlacement { plan, policy, rank, world_size: ranks, gathered };
                let mine: Vec<&String> =
                    root_names.params.iter().filter(|name| stage_holding(config, stages, name) == index).collect();
                let root = root_unit(&mine, &outer(), &at, weight_decay_of)?;
                let units = Units { root, blocks };
                let replayed = ReplayedBlocks::new(units, (shard, replicas), *plan, sequence);
                (StageBlocks::Replayed(Box::new(replayed)), ParamStore::from_vars(std::iter::empty()))
            }
        };
        let (embed_tokens, head) = match blocks {
            StageBlocks::Replayed(_) => (None, None),
            StageBlocks::Whole(_) => ends(config, (first, last), &params)?,
        };
        Ok(Self {
            index,
            stages,
            layers,
            embed_tokens,
            blocks,
            head,
            params,
            config: config.clone(),
            dtype,
            schedule: Mutex::new(vec![]),
            untracked_inputs: AtomicUsize::new(0),
            loss_scale: AtomicU64::new(1f64.to_bits()),
        })
    }

    /// Runs every block (whole or split) under activation checkpointing: a
    /// forward keeps only each block's input, and backward recomputes the
    /// block, its forward collectives included. FSDP units already
    /// recompute (exercise 22 replays a unit in backward): they are refused.
    pub fn with_activation_checkpointing(mut self) -> Result<Self> {
        match &mut self.blocks {
            StageBlocks::Whole(whole) => whole.checkpointing = true,
            StageBlocks::Replayed(_) => bail!(
                "a stage of FSDP units already runs each block twice (exercise 22 replays a unit in backward): \
                 drop --activation-checkpointing"
            ),
        }
        Ok(self)
    }

    /// Gathers each FSDP unit's parameters one unit early, in forward and in
    /// backward (FSDP's `--prefetch`); refused for a stage without units.
    pub fn with_prefetch(mut self) -> Result<Self> {
        match &mut self.blocks {
            StageBlocks::Replayed(replayed) => replayed.prefetching()?,
            StageBlocks::Whole(_) => bail!("prefetching gathers FSDP units early: this stage holds none"),
        }
        Ok(self)
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

    /// This stage's parameters; under FSDP, its root's while it is gathered.
    pub fn params(&self) -> &ParamStore {
        &self.params
    }

    /// Under FSDP, gathers the stage's root unit (its embedding, or its final
    /// norm and head) across the shard group: until
    /// [`reshard_root`](Self::reshard_root) the stage runs them as whole
    /// modules, their variables in [`params`](Self::params). Every rank of
    /// the shard group calls it. Does nothing elsewhere.
    pub fn gather_root(&mut self) -> Result<()> {
        let StageBlocks::Replayed(replayed) = &self.blocks else { return Ok(()) };
        let Some(whole) = replayed.gather_root()? else { return Ok(()) };
        self.params = ParamStore::from_vars(whole);
        (self.embed_tokens, self.head) = ends(&self.config, (self.is_first(), self.is_last()), &self.params)?;
        Ok(())
    }

    /// Under FSDP, frees the root's whole parameters; with `grads`, the
    /// step's gradients, their part for the root is taken out and
    /// reduce-scattered into the root's gradient shard first. Every rank of
    /// the shard group calls it. Does nothing elsewhere.
    pub fn reshard_root(&mut self, grads: Option<&mut Gradients>) -> Result<()> {
        let StageBlocks::Replayed(replayed) = &self.blocks else { return Ok(()) };
        (self.embed_tokens, self.head) = (None, None);
        self.params = ParamStore::from_vars(std::iter::empty());
        replayed.reshard_root(grads)
    }

    /// Whether the stage's embedding or head is sharded away right now.
    fn ends_sharded(&self) -> bool {
        (self.is_first() && self.embed_tokens.is_none()) || (self.is_last() && self.head.is_none())
    }

    /// The stage's FSDP units and their groups, when its blocks are sharded.
    pub fn sharded_units(&self) -> Option<HeldUnits<'_>> {
        match &self.blocks {
            StageBlocks::Replayed(replayed) => Some(replayed.units()),
            StageBlocks::Whole(_) => None,
        }
    }

    /// Under FSDP, the most bytes of gathered units and of activations kept
    /// for backward this stage held at once since the last
    /// [`reset_peaks`](Self::reset_peaks) (the ledger's peaks, the rest zero).
    pub fn peaks(&self) -> Option<MemoryLedger> {
        let StageBlocks::Replayed(replayed) = &self.blocks else { return None };
        let gathered_peak = replayed.units().units.iter().next().map_or(0, ShardedUnit::peak_gathered_bytes);
        Some(MemoryLedger { gathered_peak, activations_peak: replayed.activations_peak(), ..MemoryLedger::default() })
    }

    /// Starts new [`peaks`](Self::peaks) from what the stage holds now.
    pub fn reset_peaks(&self) {
        if let StageBlocks::Replayed(replayed) = &self.blocks {
            replayed.reset_peaks();
        }
    }

    /// Runs one micro-batch through this stage. `input` is the micro-batch's
    /// token ids (B, T) on the first stage and the previous stage's output
    /// (B, T, C) on the others; `tokens` are the ids, which the last stage
    /// scores its predictions against. Returns the (B, T, C) activations to
    /// send on, or on the last stage the micro-batch's mean next-token loss
    /// (an f32 scalar).
    pub fn forward(&self, input: &Tensor, tokens: &Tensor) -> Result<Tensor> {
        let _span = timeline::span("compute", format!("forward, stage {}", self.index));
        if self.ends_sharded() {
            bail!("stage {}'s root unit is sharded: gather_root before running the stage", self.index);
        }
        self.record(StageOp::Forward);
        let mut x = match &self.embed_tokens {
            Some(embed_tokens) => embed_tokens.forward(input)?,
            None => {
                let (b, t) = tokens.dims2()?;
                if input.dims() != [b, t, self.config.hidden_size] {
                    bail!(
                        "stage {} takes activations of shape [{b}, {t}, {}] for tokens {:?}, got {:?}",
                        self.index,
                        self.config.hidden_size,
                        tokens.dims(),
                        input.dims()
                    );
                }
                input.clone()
            }
        };
        let replayed = match &self.blocks {
            StageBlocks::Whole(whole) => {
                if !self.is_first() && !input.track_op() {
                    self.untracked_inputs.fetch_add(1, Ordering::Relaxed);
                }
                let mut tape = Recompute::default();
                if let Some(tp) = &whole.sequence {
                    x = split_tokens(tp, &x)?;
                }
                for block in &whole.blocks {
                    x = if whole.checkpointing { tape.checkpoint(block, &x)? } else { block.forward(&x)? };
                }
                if let Some(tp) = &whole.sequence {
                    x = join_tokens(tp, &x)?;
                }
                let output = self.head_of(&x, tokens)?;
                if whole.checkpointing {
                    whole.tapes.lock().unwrap_or_else(PoisonError::into_inner).insert(output.id(), tape);
                }
                return Ok(output);
            }
            StageBlocks::Replayed(replayed) => replayed,
        };
        // The embedding keeps no graph: its weight's gradient needs only the token ids.
        let (block_inputs, h) = replayed.forward(&x.detach())?;
        // The head's saved tensors are counted where they are made: the unit
        // step's collectives would spoil a count of this thread's
        // allocations, since another rank's thread may free what they hand over.
        let ((output, head), head_held) = match &self.head {
            Some((norm, lm_head)) => {
                let (head, held) = held_after(|| head_forward(norm, lm_head, &h, tokens));
                let head = head?;
                ((head.loss.clone(), Some(head)), held)
            }
            None => ((h, None), thread_live_bytes().map(|_| 0)),
        };
        // The counting allocator sees host memory only: on a GPU there is nothing to count.
        let inputs_held: u64 = block_inputs.iter().map(bytes).sum();
        let held = head_held.filter(|_| tokens.device().is_cpu()).map(|head| head + inputs_held);
        replayed.keep(&output, Kept { input: input.clone(), block_inputs, head, held });
        Ok(output)
    }

    /// The last stage's final norm, head and loss on `x`; `x` itself elsewhere.
    fn head_of(&self, x: &Tensor, tokens: &Tensor) -> Result<Tensor> {
        match &self.head {
            Some((norm, lm_head)) => next_token_loss(&lm_head.forward(&norm.forward(x)?)?, tokens),
            None => Ok(x.clone()),
        }
    }

    /// Forgets what a forward kept for a backward that will not come (an
    /// evaluation's forward).
    pub fn discard(&self, output: &Tensor) {
        match &self.blocks {
            StageBlocks::Whole(whole) => {
                drop(whole.tapes.lock().unwrap_or_else(PoisonError::into_inner).remove(&output.id()))
            }
            StageBlocks::Replayed(replayed) => drop(replayed.take(output)),
        }
    }

    /// A tensor shaped like this stage's input activations for `tokens`
    /// (B, T): (B, T, C), in the model's dtype, on its device. `recv` takes
    /// the shape of what it receives from it.
    pub fn activation_like(&self, tokens: &Tensor) -> Result<Tensor> {
        let (b, t) = tokens.dims2()?;
        Tensor::zeros((b, t, self.config.hidden_size), self.dtype, tokens.device())
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
        let grad_output = match (self.is_last(), f64::from_bits(self.loss_scale.load(Ordering::Relaxed))) {
            (true, scale) if scale != 1.0 => (grad_output.to_dtype(DType::F32)? * scale)?,
            _ => grad_output.clone(),
        };
        let grad_output = grad_output.to_dtype(output.dtype())?;
        let replayed = match &self.blocks {
            StageBlocks::Whole(whole) => {
                let mut store = vjp(output, &grad_output)?;
                if let Some(tape) = whole.tapes.lock().unwrap_or_else(PoisonError::into_inner).remove(&output.id()) {
                    tape.backward(&mut store)?;
                }
                return Ok(store);
            }
            StageBlocks::Replayed(replayed) => replayed,
        };
        let Some(kept) = replayed.take(output) else {
            bail!(
                "stage {}: backward of an output this stage's forward did not return, or returned once only",
                self.index
            );
        };
        if self.ends_sharded() {
            bail!("stage {}'s root unit was sharded between a forward and its backward", self.index);
        }
        let (mut store, grad) = match (kept.head, &self.head) {
            (Some(head), Some((_, lm_head))) => {
                let seed = grad_output.to_dtype(DType::F64)?.to_scalar::<f64>()?;
                head_backward(lm_head, head, seed)?
            }
            _ => (empty_grad_store()?, grad_output),
        };
        let grad_input = replayed.backward(&kept.block_inputs, &grad)?;
        match &self.embed_tokens {
            Some(embed_tokens) => {
                let grad = embedding_grad(&kept.input, &grad_input, self.config.vocab_size)?;
                accumulate(&mut store, embed_tokens.embeddings(), grad)?;
            }
            None => drop(store.insert(&kept.input, grad_input)),
        }
        Ok(store)
    }

    /// The gradients of this stage's parameters in `store`, by name, as f32.
    pub fn gradients(&self, store: &GradStore) -> Result<Gradients> {
        Gradients::from_store(&self.params, store)
    }

    /// The forwards and backwards run since the last call, in order.
    pub fn take_schedule(&self) -> Vec<StageOp> {
        std::mem::take(&mut *self.schedule.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// How many forwards since the last call read an input that tracks no
    /// gradient (neither a `Var` nor computed from one), on a stage of whole
    /// blocks after the first. candle's backward gives such an input only
    /// the part of its gradient that flows through operations where it met
    /// a tracked tensor (such as a block's residual additions): the gradient
    /// a stage sends back for it is incomplete, and nothing fails.
    pub fn take_untracked_inputs(&self) -> usize {
        self.untracked_inputs.swap(0, Ordering::Relaxed)
    }

    /// From now on the last stage's backward multiplies the loss's gradient
    /// by `scale`, so that 16-bit gradients stay above fp16's smallest
    /// numbers (dynamic loss scaling); every gradient of the step is then
    /// `scale` times the true one, until the step divides it back out.
    pub fn set_loss_scale(&self, scale: f64) {
        self.loss_scale.store(scale.to_bits(), Ordering::Relaxed);
    }

    fn record(&self, op: StageOp) {
        self.schedule.lock().unwrap_or_else(PoisonError::into_inner).push(op);
    }
}

/// The embedding a first stage runs and the final norm and head a last
/// stage runs, on `params`. Tied embeddings are refused by the stage's
/// build unless one stage holds both ends.
fn ends(
    config: &GptConfig,
    (first, last): (bool, bool),
    params: &ParamStore,
) -> Result<(Option<Embedding>, Option<Head>)> {
    let embed_tokens = match first {
        true => Some(Embedding::new(params.tensor("model.embed_tokens.weight")?, config.hidden_size)),
        false => None,
    };
    let head = match last {
        true => Some((RmsNorm::new(params.tensor("model.norm.weight")?, config.norm_eps), lm_head(config, params)?)),
        false => None,
    };
    Ok((embed_tokens, head))
}

/// The root unit of a stage whose blocks are FSDP units: its parameters
/// `names` (of the embedding, final norm and head, the stage's part of the
/// wrap policy's root, in its order), read from `outer`, flattened and
/// sharded as `at` places them; `None` when it holds none of them.
fn root_unit(
    names: &[&String],
    outer: &ParamStore,
    at: &UnitPlacement<'_>,
    weight_decay_of: &dyn Fn(&str) -> f64,
) -> Result<Option<ShardedUnit>> {
    let Some(first) = names.first() else { return Ok(None) };
    let device = outer.get(first)?.device().clone();
    let vars = names.iter().map(|name| Ok(((*name).clone(), outer.get(name)?))).collect::<Result<Vec<_>>>()?;
    let shapes = vars.iter().map(|(name, var)| (name.clone(), var.shape().clone()));
    let layout = FlatLayout::of_shapes(shapes.collect::<Vec<_>>(), at.world_size);
    let named = vars.iter().map(|(name, var)| (name.clone(), var.as_tensor().clone())).collect();
    let full = layout.flatten(&named, &device)?;
    ShardedUnit::new(ROOT_UNIT.to_string(), layout, &full, None, at, weight_decay_of).map(Some)
}

/// A gradient store with nothing in it (candle makes stores only by a backward).
fn empty_grad_store() -> Result<GradStore> {
    let leaf = Var::zeros((), DType::F32, &candle_core::Device::Cpu)?;
    let mut store = leaf.as_tensor().backward()?;
    store.remove(leaf.as_tensor());
    Ok(store)
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
