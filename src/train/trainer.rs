//! The trainer's state: model, parameters, optimizer, schedule, gradient buffer and
//! data-parallel context. One optimizer step is exercise 10.

use std::path::Path;

use candle_core::{bail, Result, Tensor};
use serde::{Deserialize, Serialize};

use super::{AdamW, DataPosition, LrSchedule, OptimizerConfig, ParamGroup, StepCounters, Train};
use crate::autograd::Gradients;
use crate::distributed::ProcessGroup;
use crate::model::{Gpt, GptConfig, ParamStore};
use crate::parallel::ddp::Ddp;
use crate::parallel::threads::ThreadedGpt;
use crate::phase2_training::param_groups;

/// How the trainer steps.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct TrainConfig {
    /// Micro-batches whose gradients are summed into one optimizer step.
    pub grad_accum_steps: usize,
    /// The global gradient norm is clipped to this before each step.
    pub max_grad_norm: f64,
    pub schedule: LrSchedule,
    pub optimizer: OptimizerConfig,
    /// Recompute each block in backward instead of storing its activations.
    pub activation_checkpointing: bool,
}

/// What one optimizer step reports.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct StepStats {
    /// The mean loss over this rank's micro-batches.
    pub loss: f64,
    /// The global gradient norm before clipping.
    pub grad_norm: f64,
    /// The learning rate the step used.
    pub lr: f64,
    /// Tokens this rank processed in the step.
    pub tokens: usize,
}

pub struct Trainer {
    /// The model, whose forward may split each batch across threads ([`Trainer::split_batches_across`]).
    pub model: ThreadedGpt,
    pub params: ParamStore,
    pub optimizer: AdamW,
    /// Where micro-batch gradients accumulate until the optimizer step.
    pub grads: Gradients,
    pub ddp: Ddp,
    /// Optimizer steps taken so far.
    pub step: usize,
    pub config: TrainConfig,
}

impl Trainer {
    /// A trainer for `params`; under DDP, rank 0's parameters are first copied to every rank.
    pub fn new(model_config: &GptConfig, params: ParamStore, config: TrainConfig, ddp: Ddp) -> Result<Self> {
        if config.grad_accum_steps == 0 {
            bail!("grad_accum_steps must be at least 1");
        }
        ddp.broadcast_parameters(&params)?;
        let model = Gpt::new(model_config, &params)?.with_activation_checkpointing(config.activation_checkpointing);
        // Overlapping DDP takes backward a block at a time.
        let model = if ddp.overlaps() { model.with_blockwise_backward() } else { model };
        let groups = param_groups(&params, config.optimizer.weight_decay);
        ParamGroup::decay_by_name(&groups, &params)?;
        let optimizer = AdamW::new(groups, config.optimizer.adamw)?;
        let model = ThreadedGpt::new(model);
        Ok(Self { model, params, optimizer, grads: Gradients::default(), ddp, step: 0, config })
    }

    /// Splits each micro-batch's rows across up to `threads` threads of this
    /// rank (CPU only): a step's arithmetic is unchanged, its operations run
    /// side by side.
    pub fn split_batches_across(mut self, threads: usize) -> Result<Self> {
        if threads > 1 && self.ddp.overlaps() {
            bail!("overlapped DDP takes backward a block at a time, which a batch split across threads cannot");
        }
        self.model = self.model.split_across(threads)?;
        Ok(self)
    }
}

/// The loop's view of the trainer: its step and checkpoints are exercises 10 and 11.
impl Train for Trainer {
    fn train_step(&mut self, micro_batches: &[Tensor]) -> Result<StepStats> {
        match self.ddp.overlaps() {
            true => self.overlapped_train_step(micro_batches),
            false => Trainer::train_step(self, micro_batches),
        }
    }
    fn save_checkpoint(&self, dir: &Path, data: Option<DataPosition>) -> Result<()> {
        Trainer::save_checkpoint(self, dir, data)
    }
    fn load_checkpoint(&mut self, dir: &Path) -> Result<Option<DataPosition>> {
        Trainer::load_checkpoint(self, dir)
    }
    fn counters(&self) -> StepCounters {
        StepCounters::of(self.step, &self.optimizer)
    }
    fn process_group(&self) -> &dyn ProcessGroup {
        self.ddp.process_group()
    }
    fn eval_loss(&mut self, tokens: &Tensor) -> Result<f64> {
        self.model.forward(tokens, Some(tokens))?.loss_value()
    }
    fn layout(&self) -> String {
        let overlap = if self.ddp.overlaps() { ", buckets all-reduced during backward" } else { "" };
        let threads = self.model.threads();
        let split = if threads > 1 { format!(", each batch split across {threads} threads") } else { String::new() };
        format!("DDP over {} ranks{overlap}{split}", self.ddp.world_size())
    }
    fn report(&self) -> Option<String> {
        None
    }
}
