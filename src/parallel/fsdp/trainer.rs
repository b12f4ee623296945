//! The FSDP trainer: the model run unit by unit, with each unit's collectives
//! around its forward and backward.
//!
//! candle has no module hooks, so where PyTorch's FSDP hooks into a module's
//! forward and backward, this trainer drives the units itself:
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

use std::collections::HashMap;
use std::path::Path;

use candle_core::backprop::GradStore;
use candle_core::{bail, DType, Module, Result, Tensor, Var};
use serde::{Deserialize, Serialize};

use super::comm;
use super::shard::bytes;
use super::units::check_units;
use super::{
    FlatLayout, FlatView, LocalState, LossScaler, MemoryLedger, MixedPrecisionPolicy, Precision, ShardedUnit,
    ShardingPlan, ShardingStrategy, StepLedger,
};
use crate::autograd::{accumulate, clip_factor, sum_of_squares, vjp};
use crate::distributed::ProcessGroup;
use crate::memory::held_after;
use crate::model::{Block, GptConfig, Outer, ParamStore, RotaryCache};
use crate::parallel::ddp::broadcast_parameters;
use crate::phase1_model::next_token_loss;
use crate::phase2_training::param_groups;
use crate::phase3_fsdp::{mixed_precision_policy, sharding_plan, wrap_policy};
use crate::train::{DataPosition, ParamGroup, StepCounters, StepStats, Train, TrainConfig, TrainerState};

/// How a run shards and which precision it computes in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct FsdpConfig {
    pub sharding: ShardingStrategy,
    pub precision: Precision,
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
    pg: Box<dyn ProcessGroup>,
    ledger: StepLedger,
}

/// One block's forward, kept for its backward.
struct BlockRecord {
    input: Var,
    /// The output with its graph, when the block is not recomputed.
    kept: Option<(Tensor, Var)>,
}

impl FsdpTrainer {
    /// Shards `params` as `fsdp.sharding` says (rank 0's parameters are
    /// broadcast first, so every rank starts equal).
    pub fn new(
        model_config: &GptConfig,
        params: ParamStore,
        config: TrainConfig,
        fsdp: FsdpConfig,
        pg: Box<dyn ProcessGroup>,
    ) -> Result<Self> {
        Self::with_plan(model_config, params, config, sharding_plan(fsdp.sharding), fsdp.precision, pg)
    }

    /// Shards `params` by `plan`, which may be any ZeRO stage, including
    /// stage 1 (optimizer state only), which has no FSDP strategy of its own.
    pub fn with_plan(
        model_config: &GptConfig,
        params: ParamStore,
        config: TrainConfig,
        plan: ShardingPlan,
        precision: Precision,
        pg: Box<dyn ProcessGroup>,
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
        broadcast_parameters(pg.as_ref(), &params)?;
        let decay = ParamGroup::decay_by_name(&param_groups(&params, config.optimizer.weight_decay), &params)?;
        let named: HashMap<String, Tensor> =
            params.iter().map(|(n, v)| (n.to_string(), v.as_tensor().clone())).collect();
        let device = params.get("model.embed_tokens.weight")?.device().clone();
        let units = units
            .into_iter()
            .map(|unit| {
                let layout = FlatLayout::new(model_config, &unit.params, pg.world_size())?;
                let full = layout.flatten(&named, &device)?;
                let decay_of = |name: &str| decay.get(name).copied().unwrap_or(0.0);
                ShardedUnit::new(unit.name, layout, &full, &plan, &policy, pg.as_ref(), decay_of)
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
            pg,
            ledger: StepLedger::default(),
        })
    }

    pub fn process_group(&self) -> &dyn ProcessGroup {
        self.pg.as_ref()
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
        unit.set_local_state(state, self.pg.as_ref(), &self.policy)
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
        let before = self.pg.stats();
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
            grads.push(unit.take_reduced_grad(self.pg.as_ref(), &self.plan)?);
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
                    self.pg.as_ref(),
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
        self.ledger = StepLedger { memory, comm: self.pg.stats().since(&before) };
        Ok(StepStats { loss: loss_sum / k as f64, grad_norm, lr, tokens })
    }

    /// Forward and backward of one micro-batch, unit by unit; each unit's
    /// gradient (divided by `k`) goes to its shard. Returns the loss.
    fn micro_batch(&mut self, batch: &Tensor, k: usize, memory: &mut MemoryLedger) -> Result<f64> {
        let pg = self.pg.as_ref();
        let mut gathered = Gathered::default();
        let root = &self.units[0];
        let root_flat = root.materialize(pg, &self.policy)?;
        gathered.add(root, &root_flat, memory);
        let outer = Outer::new(&self.model_config, &FlatView { flat: root_flat.as_tensor(), layout: &root.layout })?;

        // Activations: what each piece of the forward leaves allocated for
        // backward, measured around work that runs no collective.
        let (embedded, mut activations) = held_after(|| outer.embed_tokens.forward(batch));
        let embedded = embedded?; // (B, T, C), graph to the root's buffer
        let mut x = embedded.detach();
        let mut records = Vec::with_capacity(self.model_config.num_layers);
        for layer in 0..self.model_config.num_layers {
            let unit = &self.units[layer + 1];
            let flat = unit.materialize(pg, &self.policy)?;
            gathered.add(unit, &flat, memory);
            let block = self.block(layer, &flat)?;
            let (ran, held) = held_after(|| -> Result<_> {
                let input = Var::from_tensor(&x)?;
                let y = block.forward(input.as_tensor())?;
                Ok((input, y))
            });
            let (input, y) = ran?;
            x = y.detach();
            let kept = match self.recomputes_blocks() {
                true => {
                    activations = activations.map(|a| a + bytes(input.as_tensor())); // only the input stays
                    gathered.remove(unit, &flat);
                    None
                }
                false => {
                    activations = activations.zip(held).map(|(a, h)| a + h);
                    Some((y, flat))
                }
            };
            records.push(BlockRecord { input, kept });
        }
        let (head, held) = held_after(|| -> Result<_> {
            let last = Var::from_tensor(&x)?;
            let logits = outer.lm_head.forward(&outer.norm.forward(last.as_tensor())?)?;
            let loss = next_token_loss(&logits, batch)?;
            Ok((last, loss))
        });
        let (last, loss) = head?;
        activations = activations.zip(held).map(|(a, h)| a + h);
        memory.activations_peak = memory.activations_peak.max(activations);
        let loss_value = loss.to_scalar::<f32>()? as f64;

        let loss_scale = self.scaler.map_or(1.0, |s| s.scale);
        let mut root_grads = match loss_scale {
            1.0 => loss.backward()?,
            scale => (&loss * scale)?.backward()?,
        };
        let mut grad_x = take(&mut root_grads, last.as_tensor(), "the last block's output")?;
        for (layer, record) in records.into_iter().enumerate().rev() {
            let unit = &self.units[layer + 1];
            let (y, flat) = match record.kept {
                Some(kept) => kept,
                None => {
                    let flat = unit.materialize(pg, &self.policy)?;
                    gathered.add(unit, &flat, memory);
                    (self.block(layer, &flat)?.forward(record.input.as_tensor())?, flat)
                }
            };
            let mut local = vjp(&y, &grad_x)?;
            grad_x = take(&mut local, record.input.as_tensor(), "a block's input")?;
            let grad = take(&mut local, flat.as_tensor(), "a block's parameters")?;
            drop((y, local));
            gathered.remove(unit, &flat);
            drop(flat);
            let grad = self.for_reduction(grad, k)?;
            self.units[layer + 1].add_grad(grad, pg, &self.plan)?;
            memory.grads = memory.grads.max(self.units.iter().map(ShardedUnit::grad_bytes).sum());
        }
        let embedding_grads = vjp(&embedded, &grad_x)?;
        let root_flat_grad = embedding_grads.get(root_flat.as_tensor()).cloned();
        if let Some(g) = root_flat_grad {
            accumulate(&mut root_grads, root_flat.as_tensor(), g.detach())?;
        }
        let grad = take(&mut root_grads, root_flat.as_tensor(), "the root's parameters")?;
        let grad = self.for_reduction(grad, k)?;
        self.units[0].add_grad(grad, pg, &self.plan)?;
        Ok(loss_value)
    }

    /// Block `layer` built on views of its unit's buffer.
    fn block(&self, layer: usize, flat: &Var) -> Result<Block> {
        let view = FlatView { flat: flat.as_tensor(), layout: &self.units[layer + 1].layout };
        Block::new(&self.model_config, &view, layer, &self.rotary)
    }

    /// A unit's raw gradient, divided by the micro-batch count as exercise 10
    /// does, in the reduce dtype.
    fn for_reduction(&self, grad: Tensor, k: usize) -> Result<Tensor> {
        let grad = grad.detach().to_dtype(DType::F32)?;
        let grad = if k == 1 { grad } else { (grad * (1.0 / k as f64))? };
        grad.to_dtype(self.policy.reduce_dtype)
    }

    /// The L2 norm of the whole model's gradient, from every rank's local part.
    fn global_norm(&self, grads: &[Tensor]) -> Result<f64> {
        let mut sum_sq = sum_of_squares(grads)?;
        if self.plan.optimizer_state && self.pg.world_size() > 1 {
            // Each rank holds a different part of the gradient: add up the parts.
            sum_sq = comm::sum_over_ranks(self.pg.as_ref(), sum_sq, &grads[0])?;
        }
        Ok(sum_sq.sqrt())
    }
}

/// Bytes of gathered unit buffers alive now; the peak goes to the ledger.
#[derive(Default)]
struct Gathered {
    now: u64,
}

impl Gathered {
    fn add(&mut self, unit: &ShardedUnit, flat: &Var, memory: &mut MemoryLedger) {
        if unit.gathers() {
            self.now += bytes(flat.as_tensor());
            memory.gathered_peak = memory.gathered_peak.max(self.now);
        }
    }

    fn remove(&mut self, unit: &ShardedUnit, flat: &Var) {
        if unit.gathers() {
            self.now -= bytes(flat.as_tensor());
        }
    }
}

fn take(grads: &mut GradStore, tensor: &Tensor, what: &str) -> Result<Tensor> {
    match grads.remove(tensor) {
        Some(g) => Ok(g.detach()),
        None => bail!("no gradient reached {what}: the loss does not depend on it"),
    }
}

/// The loop's view of the sharded trainer: its checkpoints are exercise 15.
impl Train for FsdpTrainer {
    fn train_step(&mut self, micro_batches: &[Tensor]) -> Result<StepStats> {
        FsdpTrainer::train_step(self, micro_batches)
    }
    fn save_checkpoint(&self, dir: &Path, data: Option<DataPosition>) -> Result<()> {
        FsdpTrainer::save_checkpoint(self, dir, data)
    }
    fn load_checkpoint(&mut self, dir: &Path) -> Result<Option<DataPosition>> {
        FsdpTrainer::load_checkpoint(self, dir)
    }
    fn counters(&self) -> StepCounters {
        self.counters
    }
    fn process_group(&self) -> &dyn ProcessGroup {
        self.pg.as_ref()
    }
    fn layout(&self) -> String {
        format!("FSDP over {} ranks with {}, {} precision", self.pg.world_size(), self.plan.describe(), self.precision)
    }
    fn report(&self) -> Option<String> {
        Some(format!("{}, {} units; rank 0's last step:\n{}", self.layout(), self.units.len(), self.ledger()))
    }
}
