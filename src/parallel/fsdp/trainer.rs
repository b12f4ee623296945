//! The FSDP trainer: the model's own forward and backward, with each unit's
//! collectives around its part of them.
//!
//! candle has no module hooks, so the model's blocks carry them: under FSDP a
//! block is built on demand (`model::OnDemand`, implemented in `step.rs`),
//! and the trainer runs exercise 7's `Gpt::forward` and the recompute
//! engine's backward on such blocks:
//!
//! ```text
//! forward:   gather root → embed → for each block: gather, forward, free → norm, head, loss
//! backward:  head, norm → for each block, last first: gather, recompute, backward,
//!            reduce-scatter its gradient, free → embed → reduce-scatter the root's gradient
//! step:      global gradient norm (one all-reduce of a scalar), clip, AdamW on the local shard
//! ```
//!
//! Freeing a block's gathered weights after its forward only frees memory if
//! nothing still holds them, and candle's autograd graph does: PyTorch frees
//! the storage under autograd's feet and gathers again before backward; here
//! the block's graph is dropped and the block recomputed in backward. So under
//! FULL_SHARD every block is recomputed (activation checkpointing is implied);
//! the other strategies keep parameters whole and recompute only when
//! activation checkpointing is asked for. The root unit (embedding, final norm,
//! head) stays gathered from its forward to the end of its backward, as in
//! PyTorch, where the root is not resharded after forward.

use std::cell::RefCell;
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use candle_core::{bail, Result, Tensor};
use serde::{Deserialize, Serialize};

use super::step::{self, Gathered, ShardedBlock, Step};
use super::units::check_units;
use super::{
    FlatLayout, FlatView, FsdpGroups, LocalState, LossScaler, MemoryLedger, MixedPrecisionPolicy, Precision,
    ShardedUnit, ShardingPlan, ShardingStrategy, StepLedger,
};
use crate::autograd::{clip_factor, sum_of_squares};
use crate::distributed::{all_reduce_scalar, CommStats, ProcessGroup, ReduceOp};
use crate::memory::held_after;
use crate::model::{Block, ForwardPass, Gpt, GptConfig, Outer, ParamStore, RotaryCache};
use crate::parallel::ddp::broadcast_parameters;
use crate::phase2_training::param_groups;
use crate::phase3_fsdp::{mixed_precision_policy, sharding_plan, wrap_policy};
use crate::train::{DataPosition, ParamGroup, StepCounters, StepStats, Train, TrainConfig, TrainerState};

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
}

pub struct FsdpTrainer {
    /// The units, root first, then one per block.
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
    rotary: RotaryCache,
    groups: FsdpGroups,
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
        Self::with_plan(model_config, params, config, plan, fsdp.precision, groups)
    }

    /// Shards `params` by `plan`, which may be any ZeRO stage, including
    /// stage 1 (optimizer state only), which has no FSDP strategy of its own.
    pub fn with_plan(
        model_config: &GptConfig,
        params: ParamStore,
        config: TrainConfig,
        plan: ShardingPlan,
        precision: Precision,
        groups: FsdpGroups,
    ) -> Result<Self> {
        if config.grad_accum_steps == 0 {
            bail!("grad_accum_steps must be at least 1");
        }
        model_config.validate()?;
        params.check_matches(model_config)?;
        plan.validate()?;
        let policy = mixed_precision_policy(precision);
        let units = wrap_policy(model_config);
        check_units(model_config, &units)?;
        broadcast_parameters(groups.world(), &params)?;
        let pg = groups.shard();
        let decay = ParamGroup::decay_by_name(&param_groups(&params, config.optimizer.weight_decay), &params)?;
        let named: HashMap<String, Tensor> =
            params.iter().map(|(n, v)| (n.to_string(), v.as_tensor().clone())).collect();
        let device = params.device()?;
        let units = units
            .into_iter()
            .map(|unit| {
                let layout = FlatLayout::new(model_config, &unit.params, pg.world_size())?;
                let full = layout.flatten(&named, &device)?;
                let decay_of = |name: &str| decay.get(name).copied().unwrap_or(0.0);
                ShardedUnit::new(unit.name, layout, &full, &plan, &policy, pg, decay_of)
            })
            .collect::<Result<Vec<_>>>()?;
        drop(named);
        let rotary =
            RotaryCache::new(model_config.head_dim(), model_config.max_seq_len, model_config.rope_theta, &device)?
                .to_dtype(policy.buffer_dtype)?;
        Ok(Self {
            units,
            plan,
            precision,
            policy,
            config,
            counters: StepCounters::default(),
            scaler: policy.loss_scaling.then(LossScaler::default),
            model_config: model_config.clone(),
            rotary,
            groups,
            ledger: StepLedger::default(),
        })
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

    /// Whether blocks are recomputed in backward: always when their
    /// parameters are freed after forward, otherwise when asked.
    pub fn recomputes_blocks(&self) -> bool {
        self.plan.params || self.config.activation_checkpointing
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
        unit.set_local_state(state, self.groups.shard(), &self.policy)
    }

    /// Takes up the counters of a checkpoint's state.
    pub fn restore_counters(&mut self, state: &TrainerState) {
        self.counters.step = state.step;
        self.counters.optimizer_steps = state.optimizer_steps;
    }

    /// One optimizer step over `micro_batches` (each (B, T) token ids), as
    /// exercise 10's, with FSDP's collectives.
    pub fn train_step(&mut self, micro_batches: &[Tensor]) -> Result<StepStats> {
        if micro_batches.is_empty() {
            bail!("train_step needs at least one micro-batch");
        }
        let before = self.groups.stats();
        let mut memory = MemoryLedger::default();
        let k = micro_batches.len();
        let (mut loss_sum, mut tokens) = (0.0, 0);
        for batch in micro_batches {
            loss_sum += self.micro_batch(batch, k, &mut memory)?;
            tokens += batch.elem_count();
        }
        memory.grads = memory.grads.max(self.units.iter().map(ShardedUnit::grad_bytes).sum());
        let mut grads = Vec::with_capacity(self.units.len());
        for unit in &mut self.units {
            grads.push(unit.take_reduced_grad(self.groups.shard(), self.groups.replicas(), &self.plan)?);
        }
        if let Some(scaler) = &self.scaler {
            grads = grads.iter().map(|g| g * (1.0 / scaler.scale)).collect::<Result<_>>()?;
        }
        let grad_norm = self.global_norm(&grads)?;
        let overflowed = !grad_norm.is_finite();
        if let Some(scaler) = &mut self.scaler {
            scaler.update(overflowed);
        }
        let lr = self.config.schedule.lr(self.counters.step);
        if overflowed {
            self.counters.skipped_steps += 1;
        } else {
            if let Some(factor) = clip_factor(grad_norm, self.config.max_grad_norm) {
                grads = grads.iter().map(|g| g * factor).collect::<Result<_>>()?;
            }
            self.counters.optimizer_steps += 1;
            for (unit, grad) in self.units.iter_mut().zip(&grads) {
                unit.step(
                    grad,
                    lr,
                    self.counters.optimizer_steps,
                    &self.config.optimizer.adamw,
                    self.groups.shard(),
                    &self.policy,
                )?;
            }
        }
        self.counters.step += 1;
        for unit in &self.units {
            let (params, master, optimizer) = unit.held_bytes();
            memory.params += params;
            memory.master_params += master;
            memory.optimizer_state += optimizer;
        }
        self.ledger = StepLedger { memory, comm: self.groups.stats().since(&before) };
        Ok(StepStats { loss: loss_sum / k as f64, grad_norm, lr, tokens })
    }

    /// Forward and backward of one micro-batch: the model's own (exercise 7's
    /// forward, its recompute engine) on blocks that gather their units on
    /// demand; each unit's gradient (divided by `k`) goes to its shard.
    /// Returns the loss.
    fn micro_batch(&mut self, batch: &Tensor, k: usize, memory: &mut MemoryLedger) -> Result<f64> {
        let recompute = self.recomputes_blocks();
        let loss_scale = self.scaler.map_or(1.0, |s| s.scale);
        self.with_step(k, memory, |step| forward_and_backward(step, batch, recompute, loss_scale))
    }

    /// Runs `work` with this trainer's units lent to the blocks' hooks, as a
    /// step of `k` micro-batches whose memory `memory` records.
    fn with_step<R>(
        &mut self,
        k: usize,
        memory: &mut MemoryLedger,
        work: impl FnOnce(&Step<'_>) -> Result<R>,
    ) -> Result<R> {
        let step = Step {
            units: RefCell::new(&mut self.units),
            pg: self.groups.shard(),
            policy: &self.policy,
            plan: &self.plan,
            model_config: &self.model_config,
            rotary: &self.rotary,
            micro_batches: k,
            memory: RefCell::new(memory),
            gathered: Gathered::default(),
        };
        step::within(&step, || work(&step))
    }

    /// The L2 norm of the whole model's gradient, from every rank's local part.
    fn global_norm(&self, grads: &[Tensor]) -> Result<f64> {
        let mut sum_sq = sum_of_squares(grads)?;
        let pg = self.groups.shard();
        if self.plan.optimizer_state && pg.world_size() > 1 {
            // Each rank of a shard group holds a different part of the gradient
            // (and each replica the same parts): add up one group's parts.
            sum_sq = all_reduce_scalar(pg, sum_sq, ReduceOp::Sum, grads[0].device())?;
        }
        Ok(sum_sq.sqrt())
    }
}

/// The model's forward and backward in one FSDP step: the root unit gathered
/// for the embedding, final norm and head, the blocks gathered by their own
/// hooks. Units whose forward kept its graph are still gathered after the
/// backward; their gradients are reduced then, last block first, the root last.
fn forward_and_backward(step: &Step<'_>, batch: &Tensor, recompute: bool, loss_scale: f64) -> Result<f64> {
    let model = assemble(step, recompute)?;
    // Activations: what the forward leaves allocated for its backward, less the
    // gathered buffers its kept graph holds (the ledger counts those apart).
    let gathered_before = step.gathered_bytes();
    // The counting allocator sees host memory only: on a GPU there is nothing to count.
    let (pass, held) = match batch.device().is_cpu() {
        true => held_after(|| model.forward(batch, Some(batch))),
        false => (model.forward(batch, Some(batch)), None),
    };
    let pass = pass?;
    let kept = step.gathered_bytes() - gathered_before;
    {
        let mut memory = step.memory.borrow_mut();
        memory.activations_peak = memory.activations_peak.max(held.map(|h| h.saturating_sub(kept)));
    }
    let loss_value = pass.loss_value()?;
    let pass = match loss_scale {
        1.0 => pass,
        scale => ForwardPass { loss: pass.loss.as_ref().map(|loss| loss * scale).transpose()?, ..pass },
    };
    let mut grads = pass.backward()?;
    drop((pass, model));
    for unit in step.still_gathered() {
        step.reduce_gradient(unit, &mut grads)?;
    }
    Ok(loss_value)
}

/// The model of one step: the root unit gathered for the embedding, final
/// norm and head, the blocks gathering their units through their own hooks.
fn assemble(step: &Step<'_>, recompute: bool) -> Result<Gpt> {
    let root = step.gather(0)?;
    let units = step.units.borrow();
    let outer = Outer::new(step.model_config, &FlatView { flat: root.as_tensor(), layout: &units[0].layout })?;
    let blocks =
        (0..step.model_config.num_layers).map(|layer| Block::on_demand(Arc::new(ShardedBlock { layer }))).collect();
    Ok(Gpt::assemble(step.model_config, outer, blocks)?.with_activation_checkpointing(recompute))
}

/// The loss of `batch` with no backward; every unit the forward gathered is
/// released again.
fn forward_only(step: &Step<'_>, batch: &Tensor, recompute: bool) -> Result<f64> {
    let model = assemble(step, recompute)?;
    let loss = model.forward(batch, Some(batch))?.loss_value();
    drop(model);
    for unit in step.still_gathered() {
        step.release(unit);
    }
    loss
}

/// The loop's view of the sharded trainer: its checkpoints are exercise 15.
impl Train for FsdpTrainer {
    fn train_step(&mut self, micro_batches: &[Tensor]) -> Result<StepStats> {
        FsdpTrainer::train_step(self, micro_batches)
    }
    /// Under HYBRID_SHARD the first replica writes; the others hold the same shards.
    fn save_checkpoint(&self, dir: &Path, data: Option<DataPosition>) -> Result<()> {
        if self.groups.replica() == 0 {
            FsdpTrainer::save_checkpoint(self, dir, data)?;
        }
        self.groups.world().barrier()
    }
    fn load_checkpoint(&mut self, dir: &Path) -> Result<Option<DataPosition>> {
        FsdpTrainer::load_checkpoint(self, dir)
    }
    fn eval_loss(&mut self, tokens: &Tensor) -> Result<f64> {
        let recompute = self.recomputes_blocks();
        self.with_step(1, &mut MemoryLedger::default(), |step| forward_only(step, tokens, recompute))
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
        format!("FSDP over {world} ranks with {}{groups}, {} precision", self.plan.describe(), self.precision)
    }
    fn report(&self) -> Option<String> {
        Some(format!("{}, {} units; rank 0's last step:\n{}", self.layout(), self.units.len(), self.ledger()))
    }
}
