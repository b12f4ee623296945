//! The FSDP trainer: the learner's unit step (exercise 22) on the blocks,
//! and around it what the unit step does not cover. Phase 3's tests build
//! it; `train --strategy fsdp` runs the same units, root and step on the
//! mesh trainer's one stage (`crate::parallel::mesh`), with `--pp` and
//! `--tp` or without.
//!
//! ```text
//! forward:   gather root → embed → fsdp_forward (each block: gather, forward, free) → norm, head, loss
//! backward:  head, norm → free the root → fsdp_backward (each block, last first: gather, replay,
//!            backward, reduce-scatter its gradient, free) → embed → reduce-scatter the root's gradient
//! around:    each unit's gradient divided by the micro-batches, in the reduce dtype; reduced over
//!            the shard group when parameters are kept whole; across replicas under HYBRID_SHARD
//! step:      global gradient norm (one all-reduce of a scalar), clip, AdamW on the local shard
//! ```
//!
//! The unit step runs over each unit's parameter group ([`FsdpGroups::params`]):
//! the shard group when the plan shards parameters, this rank alone when it
//! keeps them whole (SHARD_GRAD_OP, NO_SHARD), so there the unit step's
//! collectives move nothing and the strategy's reductions happen around it.
//! Its forward keeps no graph (a graph would hold every unit's whole
//! parameters until backward), so backward replays each block: under FSDP
//! every block is recomputed, whatever the strategy (activation checkpointing
//! is implied). The root unit (embedding, final norm, head) stays gathered
//! from its forward to the end of the head's backward, and is freed before
//! the blocks' backward: the embedding's gradient needs only the token ids.
//! (PyTorch keeps the root gathered to the end of its backward.)

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use candle_core::{bail, Module, Result, Tensor};
use serde::{Deserialize, Serialize};

use super::shard::bytes;
use super::units::check_units;
use super::{embedding_grad, head_backward, head_forward, step, sum_of_squares_over, take_grads, HeadPass};
use super::{
    in_pass, BlockCompute, FlatLayout, FsdpGroups, GatheredBytes, LocalState, LossScaler, MemoryLedger,
    MixedPrecisionPolicy, OffloadFile, Pass, Precision, Prefetch, ShardedUnit, ShardingPlan, ShardingStrategy,
    StepLedger, UnitGroups, UnitParams, UnitPlacement,
};
use crate::called_early::{fsdp_backward, fsdp_forward};
use crate::distributed::{CommStats, ProcessGroup, ReduceOp};
use crate::memory::held_after;
use crate::model::{GptConfig, Outer, ParamStore, RotaryCache};
use crate::parallel::ddp::broadcast_parameters;
use crate::phase2_training::param_groups;
use crate::phase3_fsdp::{mixed_precision_policy, sharding_plan, wrap_policy};
use crate::train::{DataPosition, ParamGroup, StepCounters, StepStats, Train, TrainConfig, TrainerState, Verdict};

/// How a run shards and which precision it computes in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct FsdpConfig {
    pub sharding: ShardingStrategy,
    pub precision: Precision,
    /// Under HYBRID_SHARD, the ranks of one shard group (consecutive ranks,
    /// a node's as the launcher numbers them); the groups are replicas of
    /// each other. `None`: the whole job is one group, as FULL_SHARD.
    #[serde(default)]
    pub hybrid_group_size: Option<usize>,
    /// Reduce and accumulate the gradients in f32 whatever the precision
    /// computes in (see [`MixedPrecisionPolicy::reducing_in_f32`]).
    #[serde(default)]
    pub reduce_in_f32: bool,
}

pub struct FsdpTrainer {
    /// The units, root first, then one per block.
    /// Blocks are units 1.. ([`BlockUnit`](crate::parallel::fsdp_unit::BlockUnit)s).
    pub units: Vec<ShardedUnit>,
    /// What is sharded. The strategy it came from is not kept: ZeRO stage 1
    /// has none of its own.
    pub plan: ShardingPlan,
    pub precision: Precision,
    pub policy: MixedPrecisionPolicy,
    pub config: TrainConfig,
    pub counters: StepCounters,
    /// Dynamic loss scaling, when the policy asks for it.
    pub scaler: Option<LossScaler>,
    model_config: GptConfig,
    groups: FsdpGroups,
    /// The bytes of gathered parameters the units hold, shared by them.
    gathered: Arc<GatheredBytes>,
    /// Gathers the next unit while one computes, when asked for.
    prefetch: Option<Prefetch>,
    ledger: StepLedger,
}

impl FsdpTrainer {
    /// Shards `params` as `fsdp.sharding` says (rank 0's parameters are
    /// broadcast first, so every rank starts equal); when the plan replicates
    /// the shards (HYBRID_SHARD), within groups of `fsdp.hybrid_group_size` ranks.
    pub fn new(
        model_config: &GptConfig,
        params: ParamStore,
        config: TrainConfig,
        fsdp: FsdpConfig,
        pg: Box<dyn ProcessGroup>,
    ) -> Result<Self> {
        let plan = sharding_plan(fsdp.sharding);
        // Exercise 12's plan says whether the shards are replicated.
        let groups = FsdpGroups::new(pg, fsdp.hybrid_group_size.filter(|_| plan.replicate_across_nodes))?;
        Self::with_plan(model_config, params, config, plan, fsdp.precision, fsdp.reduce_in_f32, groups)
    }

    /// Shards `params` by `plan`, which may be any ZeRO stage, including
    /// stage 1 (optimizer state only), which has no FSDP strategy of its own;
    /// computes in `precision`, and reduces in f32 too where `reduce_in_f32`.
    pub fn with_plan(
        model_config: &GptConfig,
        params: ParamStore,
        config: TrainConfig,
        plan: ShardingPlan,
        precision: Precision,
        reduce_in_f32: bool,
        groups: FsdpGroups,
    ) -> Result<Self> {
        if config.grad_accum_steps == 0 {
            bail!("grad_accum_steps must be at least 1");
        }
        model_config.validate()?;
        params.check_matches(model_config)?;
        plan.validate()?;
        let policy = match reduce_in_f32 {
            true => mixed_precision_policy(precision).reducing_in_f32(),
            false => mixed_precision_policy(precision),
        };
        let units = wrap_policy(model_config);
        check_units(model_config, &units)?;
        broadcast_parameters(groups.world(), &params)?;
        let pg = groups.shard();
        let decay = ParamGroup::decay_by_name(&param_groups(&params, config.optimizer.weight_decay), &params)?;
        let named: HashMap<String, Tensor> =
            params.iter().map(|(n, v)| (n.to_string(), v.as_tensor().clone())).collect();
        let device = params.device()?;
        let rotary =
            RotaryCache::new(model_config.head_dim(), model_config.max_seq_len, model_config.rope_theta, &device)?
                .to_dtype(policy.buffer_dtype)?;
        let gathered = Arc::<GatheredBytes>::default();
        let at = UnitPlacement {
            plan: &plan,
            policy: &policy,
            rank: pg.rank(),
            world_size: pg.world_size(),
            gathered: gathered.clone(),
        };
        let units = units
            .into_iter()
            .enumerate()
            .map(|(index, unit)| {
                let layout = FlatLayout::new(model_config, &unit.params, pg.world_size())?;
                let full = layout.flatten(&named, &device)?;
                let decay_of = |name: &str| decay.get(name).copied().unwrap_or(0.0);
                // Unit 0 is the root; unit k + 1 holds block k.
                let block = index.checked_sub(1).map(|layer| BlockCompute {
                    layer,
                    config: model_config.clone(),
                    rotary: rotary.clone(),
                    split: None,
                });
                ShardedUnit::new(unit.name, layout, &full, block, &at, decay_of)
            })
            .collect::<Result<Vec<_>>>()?;
        drop(named);
        Ok(Self {
            units,
            plan,
            precision,
            policy,
            config,
            counters: StepCounters::default(),
            scaler: policy.loss_scaling.then(LossScaler::default),
            model_config: model_config.clone(),
            groups,
            gathered,
            prefetch: None,
            ledger: StepLedger::default(),
        })
    }

    /// Gathers the next block's unit while one computes, in forward and in
    /// backward (PyTorch: `forward_prefetch` and `backward_prefetch=BACKWARD_PRE`).
    /// The numbers do not change; two units are whole at once.
    pub fn with_prefetch(mut self) -> Self {
        let prefetch = Prefetch::new(self.gathered.clone());
        self.groups.prefetch_with(prefetch.clone());
        self.prefetch = Some(prefetch);
        self
    }

    /// Keeps AdamW's moments and the f32 master shards in a new file in
    /// `dir` between uses: the moments are read back by the step alone, a
    /// shard by its all-gather and the step (PyTorch: `CPUOffload`, here one
    /// level further down). The numbers do not change.
    pub fn with_offload(mut self, dir: &Path) -> Result<Self> {
        let file = OffloadFile::create(dir, self.groups.world().rank())?;
        for unit in &mut self.units {
            unit.offload_to(&file)?;
        }
        Ok(self)
    }

    /// The ranks this rank's units are sharded across: the whole job, or
    /// under HYBRID_SHARD this rank's shard group.
    pub fn process_group(&self) -> &dyn ProcessGroup {
        self.groups.shard()
    }

    pub fn model_config(&self) -> &GptConfig {
        &self.model_config
    }

    /// What this rank held and sent during the last step.
    pub fn ledger(&self) -> &StepLedger {
        &self.ledger
    }

    /// Everything besides tensors that a checkpoint of this trainer records.
    pub fn trainer_state(&self, data: Option<DataPosition>) -> TrainerState {
        let StepCounters { step, optimizer_steps, .. } = self.counters;
        let mut state = TrainerState::new(step, optimizer_steps, self.model_config.clone(), self.config, data);
        state.layout = Some(self.layout());
        state
    }

    /// Replaces this rank's f32 state of unit `index` (see [`ShardedUnit::set_local_state`]).
    pub fn set_local_state(&mut self, index: usize, state: LocalState) -> Result<()> {
        let Some(unit) = self.units.get_mut(index) else {
            bail!("there is no unit {index}: the model has {} units", self.units.len());
        };
        unit.set_local_state(state, self.groups.shard())
    }

    /// Takes up the counters of a checkpoint's state.
    pub fn restore_counters(&mut self, state: &TrainerState) {
        self.counters.restore(state);
    }

    /// One optimizer step over `micro_batches` (each (B, T) token ids), as
    /// exercise 10's, with FSDP's collectives.
    pub fn train_step(&mut self, micro_batches: &[Tensor]) -> Result<StepStats> {
        if micro_batches.is_empty() {
            bail!("train_step needs at least one micro-batch");
        }
        let before = self.groups.stats();
        let mut memory = MemoryLedger::default();
        self.gathered.reset_peak();
        let k = micro_batches.len();
        for unit in &mut self.units {
            unit.fold_into_step(k);
        }
        let (mut loss_sum, mut tokens) = (0.0, 0);
        for batch in micro_batches {
            loss_sum += self.micro_batch(batch, k, &mut memory)?;
            tokens += batch.elem_count();
        }
        memory.grads = memory.grads.max(self.units.iter().map(ShardedUnit::grad_bytes).sum());
        memory.gathered_peak = self.gathered.peak();
        let groups = UnitGroups { shard: self.groups.shard(), replicas: self.groups.replicas(), plan: &self.plan };
        let unscale = self.scaler.map_or(1.0, |scaler| 1.0 / scaler.scale);
        let grads = take_grads(&mut self.units, groups, unscale)?;
        let device = grads[0].device().clone();
        let grad_norm = sum_of_squares_over(&self.units, &grads, groups, None, &device)?.sqrt();
        let lr = self.config.schedule.lr(self.counters.step);
        if let Verdict::Update { clip, t } =
            self.counters.settle(grad_norm, self.config.max_grad_norm, self.scaler.as_mut())
        {
            step(&mut self.units, grads, (clip, lr, t), &self.config.optimizer.adamw, groups.shard)?;
        }
        // What was measured in the step, and what the units hold after it.
        let MemoryLedger { grads, gathered_peak, activations_peak, .. } = memory;
        let memory = MemoryLedger { grads, gathered_peak, activations_peak, ..self.held_memory() };
        self.ledger = StepLedger { memory, comm: self.groups.stats().since(&before) };
        crate::memory::release_freed_memory();
        Ok(StepStats { loss: loss_sum / k as f64, grad_norm, lr, tokens })
    }

    /// Forward and backward of one micro-batch, the blocks by the unit step;
    /// each unit's gradient (divided by `k`) joins the step's. Returns the loss.
    fn micro_batch(&mut self, batch: &Tensor, k: usize, memory: &mut MemoryLedger) -> Result<f64> {
        let loss_scale = self.scaler.map_or(1.0, |s| s.scale);
        let pg = self.groups.params(self.plan.params);
        let (root, blocks) = split_root(&mut self.units)?;
        root.unshard(pg.all_gather(&root.shard()?)?)?;
        let outer = root_modules(&self.model_config, root)?;
        let prefetch = self.prefetch.as_ref();
        let run_forward = |blocks: &mut [ShardedUnit]| {
            in_pass(prefetch, blocks, Pass::Forward, |blocks| forward(&outer, pg, blocks, batch))
        };
        let pass = run_forward(blocks)?;
        // The counting allocator sees host memory only: on a GPU there is nothing to count.
        if batch.device().is_cpu() {
            memory.activations_peak = memory.activations_peak.max(pass.held);
        }
        let loss_value = pass.head.loss.to_scalar::<f32>()? as f64;
        let embedding = outer.embed_tokens.embeddings().id();
        let (mut grads, grad_output) = head_backward(&outer.lm_head, pass.head, loss_scale)?;
        // Nothing holds the root's parameters after the head's backward (the
        // embedding's gradient needs only the token ids): freed before the
        // blocks' backward instead of held through it.
        let embedding_slot = root.whole().and_then(|whole| whole.iter().position(|p| p.as_tensor().id() == embedding));
        drop(outer);
        let mut root_grads = root.reshard_taking_grads(&mut grads);
        drop(grads);
        let grad_embedded =
            in_pass(prefetch, blocks, Pass::Backward, |blocks| fsdp_backward(pg, blocks, &pass.inputs, &grad_output))?;
        for unit in blocks.iter_mut() {
            unit.end_micro_batch(self.groups.shard(), &self.plan, k)?;
        }
        let Some(slot) = embedding_slot.and_then(|i| root_grads.get_mut(i)) else {
            bail!("the root unit does not hold the token embedding");
        };
        let grad = embedding_grad(batch, &grad_embedded, self.model_config.vocab_size)?;
        *slot = Some(match slot.take() {
            Some(head) => (head + grad)?, // tied: the head's use of the same weight
            None => grad,
        });
        let Some(root_grad) = root.lay_out(root_grads)? else { unreachable!("the embedding's gradient is in it") };
        let root_shard = pg.reduce_scatter(&root_grad, ReduceOp::Avg)?;
        // The whole gradient, the step's largest buffer, goes before the
        // shard joins the step's gradient, which takes two shards' room.
        drop(root_grad);
        root.add_grad(&root_shard)?;
        root.end_micro_batch(self.groups.shard(), &self.plan, k)?;
        Ok(loss_value)
    }

    /// What this rank's units hold between steps, and the gradient buffer a step fills.
    fn held_memory(&self) -> MemoryLedger {
        self.units.iter().map(ShardedUnit::held_memory).sum()
    }
}

/// The root unit first, then the blocks' units.
fn split_root(units: &mut [ShardedUnit]) -> Result<(&mut ShardedUnit, &mut [ShardedUnit])> {
    units.split_first_mut().ok_or_else(|| candle_core::Error::Msg("an FSDP model has at least its root unit".into()))
}

/// The embedding, final norm and head on the root unit's gathered parameters.
fn root_modules(config: &GptConfig, root: &ShardedUnit) -> Result<Outer> {
    let Some(whole) = root.whole() else { bail!("the root unit is not gathered") };
    Outer::new(config, &UnitParams { params: whole, layout: &root.layout })
}

/// Whose unit step the blocks run, in words.
fn unit_step_body() -> &'static str {
    use crate::exercise_bodies::{body, Body};
    match body(22) {
        Body::NotStarted => "the reference unit step standing in for exercise 22",
        Body::Leaned => "exercise 22's reference unit step",
        Body::DoesNotParse => "exercise 22's reference unit step, in place of your file, which does not parse",
        Body::Yours => "your unit step (exercise 22)",
    }
}

/// What one micro-batch's forward leaves for its backward.
struct Forwarded {
    /// Each block's input, kept by the unit step; the first is the
    /// embedding's output, without a graph.
    inputs: Vec<Tensor>,
    head: HeadPass,
    /// Bytes the pass leaves allocated for backward (see [`MemoryLedger::activations_peak`]).
    held: Option<u64>,
}

/// The embedding, the blocks by the unit step, the final norm, head and loss.
fn forward(outer: &Outer, pg: &dyn ProcessGroup, blocks: &mut [ShardedUnit], batch: &Tensor) -> Result<Forwarded> {
    // The root's pieces are measured where they run: the unit step's
    // collectives would spoil a count of this thread's allocations, since
    // another rank's thread may free what they hand over. The embedding
    // keeps no graph: one would hold the root's parameters until the
    // embedding's backward, which needs only the token ids ([`embedding_grad`]).
    let (embedded, embed_held) = held_after(|| outer.embed_tokens.forward(batch).map(|e| e.detach())); // (B, T, C)
    let blocks_pass = fsdp_forward(pg, blocks, &embedded?)?;
    let (head, head_held) = held_after(|| head_forward(&outer.norm, &outer.lm_head, &blocks_pass.output, batch));
    let head = head?;
    // The unit step keeps each block's input, the first being the embedding's output.
    let inputs_held: u64 = blocks_pass.inputs.iter().skip(1).map(bytes).sum();
    let held = embed_held.zip(head_held).map(|(embed, head)| embed + head + inputs_held);
    Ok(Forwarded { inputs: blocks_pass.inputs, head, held })
}

/// The loop's view of the sharded trainer: its checkpoints go through exercise 15.
impl Train for FsdpTrainer {
    fn train_step(&mut self, micro_batches: &[Tensor]) -> Result<StepStats> {
        FsdpTrainer::train_step(self, micro_batches)
    }
    /// Under HYBRID_SHARD the first replica writes; the others hold the same shards.
    fn save_checkpoint(&self, dir: &Path, data: Option<DataPosition>) -> Result<()> {
        if self.groups.replica() == 0 {
            self.write_whole_checkpoint(dir, data)?;
        }
        self.groups.world().barrier()
    }
    fn load_checkpoint(&mut self, dir: &Path) -> Result<Option<DataPosition>> {
        self.read_whole_checkpoint(dir)
    }
    /// The loss of `tokens` with no backward; every unit it gathered is released again.
    fn eval_loss(&mut self, tokens: &Tensor) -> Result<f64> {
        let pg = self.groups.params(self.plan.params);
        let (root, blocks) = split_root(&mut self.units)?;
        root.unshard(pg.all_gather(&root.shard()?)?)?;
        let loss = root_modules(&self.model_config, root).and_then(|outer| forward(&outer, pg, blocks, tokens));
        root.reshard();
        Ok(loss?.head.loss.to_scalar::<f32>()? as f64)
    }
    fn counters(&self) -> StepCounters {
        self.counters
    }
    fn process_group(&self) -> &dyn ProcessGroup {
        self.groups.world()
    }
    fn comm_stats(&self) -> CommStats {
        self.groups.stats()
    }
    fn layout(&self) -> String {
        let (world, shard) = (self.groups.world().world_size(), self.groups.shard().world_size());
        let groups = match world / shard {
            1 => String::new(),
            replicas => format!(" (shard groups of {shard} ranks, {replicas} replicas)"),
        };
        let reduce = match self.policy.reduce_dtype == self.policy.param_dtype {
            true => String::new(),
            false => " (gradients reduced in f32)".to_string(),
        };
        format!(
            "FSDP over {world} ranks with {}{groups}, {} precision{reduce}, {}",
            self.plan.describe(),
            self.precision,
            unit_step_body()
        )
    }
    fn model_states_bytes(&self) -> Option<u64> {
        Some(self.held_memory().model_states())
    }
    fn report(&self) -> Option<String> {
        Some(format!("{}, {} units; rank 0's last step:\n{}", self.layout(), self.units.len(), self.ledger()))
    }
}
