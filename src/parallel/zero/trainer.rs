//! The ZeRO-1 trainer (`train --strategy zero1`): whole replicas as under
//! DDP, but AdamW's moments sharded across the ranks and each step taken by
//! the learner's exercise 17 over the whole model as one flat vector:
//!
//! ```text
//! micro-batches   forward and backward on the whole model, gradients summed, divided by their count
//! flatten         every parameter and its gradient end to end, in the model's order, padded to a
//!                 multiple of the ranks (FSDP's FlatLayout over the whole model)
//! decay           p · (1 − lr · wd) per element, here: exercise 8's groups give each parameter its wd
//! step            exercise 17: reduce-scatter the gradient (clipped on its way, see clip.rs),
//!                 AdamW on this rank's shard, all-gather the new parameters
//! unflatten       the P new values back into the parameters
//! ```
//!
//! The traffic is DDP's (a reduce-scatter and an all-gather make one
//! all-reduce), the optimizer state per rank 1/N of DDP's. Weight decay is
//! applied before the step, so the learner's step runs with a decay of 0:
//! AdamW's decay is decoupled, so where it is applied does not change the
//! result. A checkpoint holds whole tensors under AdamW's names, so a run
//! moves between DDP, FSDP and ZeRO-1.

use std::collections::HashMap;
use std::path::Path;

use candle_core::{bail, Device, Result, Tensor};

use super::{ClipShards, ShardedAdamW};
use crate::autograd::Gradients;
use crate::distributed::{ProcessGroup, WithOverride};
use crate::model::{param_specs, Gpt, GptConfig, ParamStore};
use crate::parallel::ddp::broadcast_parameters;
use crate::parallel::fsdp::{DecayRuns, FlatLayout};
use crate::phase2_training::param_groups;
use crate::train::{
    AdamW, Checkpoint, DataPosition, Moments, ParamGroup, StepCounters, StepStats, Train, TrainConfig, TrainerState,
};

pub struct ZeroTrainer {
    model: Gpt,
    model_config: GptConfig,
    params: ParamStore,
    /// Every parameter end to end in the model's order, padded to a
    /// multiple of the ranks: the flat vector exercise 17 steps.
    layout: FlatLayout,
    /// Each element's weight decay.
    decays: DecayRuns,
    optimizer: ShardedAdamW,
    /// The job's group, its reduce-scatter clipping.
    pg: WithOverride<ClipShards>,
    clip: ClipShards,
    config: TrainConfig,
    step: usize,
    /// Steps whose gradient norm was not finite, taken without an update.
    skipped_steps: u64,
    device: Device,
}

impl ZeroTrainer {
    /// A ZeRO-1 trainer for `params` over `pg`; rank 0's parameters are first
    /// copied to every rank.
    pub fn new(
        model_config: &GptConfig,
        params: ParamStore,
        config: TrainConfig,
        pg: Box<dyn ProcessGroup>,
    ) -> Result<Self> {
        if config.grad_accum_steps == 0 {
            bail!("grad_accum_steps must be at least 1");
        }
        broadcast_parameters(pg.as_ref(), &params)?;
        let model = Gpt::new(model_config, &params)?.with_activation_checkpointing(config.activation_checkpointing);
        let decay_of = ParamGroup::decay_by_name(&param_groups(&params, config.optimizer.weight_decay), &params)?;
        let device = params.device()?;
        let names: Vec<String> = param_specs(model_config).into_iter().map(|spec| spec.name).collect();
        let layout = FlatLayout::new(model_config, &names, pg.world_size())?;
        let decays = layout.decay_runs(0..layout.padded_len(), |name| decay_of[name]);
        let clip = ClipShards::new(config.max_grad_norm);
        Ok(Self {
            model,
            model_config: model_config.clone(),
            params,
            layout,
            decays,
            optimizer: ShardedAdamW::new(config.optimizer.adamw, 0.0),
            pg: WithOverride::new(pg, clip.clone()),
            clip,
            config,
            step: 0,
            skipped_steps: 0,
            device,
        })
    }

    /// The parameters' values by name.
    fn param_values(&self) -> HashMap<String, Tensor> {
        self.params.iter().map(|(name, var)| (name.to_string(), var.as_tensor().clone())).collect()
    }
}

impl Train for ZeroTrainer {
    fn train_step(&mut self, micro_batches: &[Tensor]) -> Result<StepStats> {
        if micro_batches.is_empty() {
            bail!("train_step needs at least one micro-batch");
        }
        let (mut grads, mut loss) = (Gradients::default(), 0.0);
        for batch in micro_batches {
            let pass = self.model.forward(batch, Some(batch))?;
            loss += pass.loss_value()?;
            grads.accumulate(&Gradients::from_store(&self.params, &pass.backward()?)?)?;
        }
        let k = micro_batches.len() as f64;
        grads.scale(1.0 / k)?;
        if let Some(name) = self.layout.names().find(|name| grads.get(name).is_none()) {
            bail!("no gradient reached `{name}`: the loss does not depend on it");
        }
        let grads: HashMap<String, Tensor> = grads.iter().map(|(name, g)| (name.to_string(), g.clone())).collect();
        let grad = self.layout.flatten(&grads, &self.device)?;
        let lr = self.config.schedule.lr(self.step);
        let params = self.layout.flatten(&self.param_values(), &self.device)?;
        let decayed = FlatLayout::decayed(&params, &self.decays, lr)?;
        // Exercise 17 updates the moments within its step, and the norm is
        // known only after it: a step whose gradient is not finite puts the
        // moments (tensors are immutable: these are the old ones, not copies)
        // and the step count back and leaves the parameters, as every
        // strategy skips such a step. The norm is the same on every rank.
        let (moments_before, steps_before) = (self.optimizer.moments.clone(), self.optimizer.steps);
        let updated = self.optimizer.step(&self.pg, &decayed, &grad, lr)?;
        let grad_norm = self.clip.take_norm()?;
        if grad_norm.is_finite() {
            for (name, value) in self.layout.unflatten(&updated)? {
                self.params.get(&name)?.set(&value)?;
            }
        } else {
            (self.optimizer.moments, self.optimizer.steps) = (moments_before, steps_before);
            self.skipped_steps += 1;
        }
        self.step += 1;
        let tokens = micro_batches.iter().map(Tensor::elem_count).sum();
        Ok(StepStats { loss: loss / k, grad_norm, lr, tokens })
    }

    /// Every rank gathers the moments' shards; rank 0 writes them whole,
    /// under AdamW's names, beside the parameters.
    fn save_checkpoint(&self, dir: &Path, data: Option<DataPosition>) -> Result<()> {
        let mut optimizer = HashMap::new();
        if let Some(moments) = &self.optimizer.moments {
            for (kind, shard) in [&moments.exp_avg, &moments.exp_avg_sq].into_iter().enumerate() {
                for (name, moment) in self.layout.unflatten(&self.pg.all_gather(shard)?)? {
                    optimizer.insert(AdamW::moment_names(&name)[kind].clone(), moment);
                }
            }
        }
        if self.pg.rank() == 0 {
            let params = self.param_values();
            let state =
                TrainerState::new(self.step, self.optimizer.steps, self.model_config.clone(), self.config, data);
            Checkpoint { params, optimizer, state }.write(dir)?;
        }
        self.pg.barrier()
    }

    /// Every rank reads the whole checkpoint and keeps its shard of the moments.
    fn load_checkpoint(&mut self, dir: &Path) -> Result<Option<DataPosition>> {
        let checkpoint = Checkpoint::read(dir)?;
        checkpoint.ensure_fits(&self.model_config)?;
        for (name, var) in self.params.iter() {
            let Some(saved) = checkpoint.params.get(name) else {
                bail!("the checkpoint in {} has no parameter `{name}`", dir.display());
            };
            var.set(&saved.to_dtype(var.dtype())?.to_device(var.device())?)?;
        }
        let steps = checkpoint.state.optimizer_steps;
        self.optimizer.moments = match steps {
            0 => None,
            _ => {
                let range = self.layout.shard_range(self.pg.rank(), self.pg.world_size());
                let shard_of = |kind: usize| -> Result<Tensor> {
                    let mut named = HashMap::new();
                    for (name, _) in self.params.iter() {
                        let moment_name = &AdamW::moment_names(name)[kind];
                        let Some(moment) = checkpoint.optimizer.get(moment_name) else {
                            bail!(
                                "the checkpoint in {} has no {moment_name}: it was written before any optimizer \
                                 step, or by another optimizer",
                                dir.display()
                            );
                        };
                        named.insert(name.to_string(), moment.clone());
                    }
                    // A copy of this rank's part, not a view that would keep the whole model's alive.
                    self.layout.flatten(&named, &self.device)?.narrow(0, range.start, range.len())?.force_contiguous()
                };
                Some(Moments { exp_avg: shard_of(0)?, exp_avg_sq: shard_of(1)? })
            }
        };
        self.optimizer.steps = steps;
        self.step = checkpoint.state.step;
        Ok(checkpoint.state.data)
    }

    fn counters(&self) -> StepCounters {
        StepCounters { step: self.step, optimizer_steps: self.optimizer.steps, skipped_steps: self.skipped_steps }
    }

    fn process_group(&self) -> &dyn ProcessGroup {
        &self.pg
    }

    fn eval_loss(&mut self, tokens: &Tensor) -> Result<f64> {
        self.model.forward(tokens, Some(tokens))?.loss_value()
    }

    fn layout(&self) -> String {
        format!("ZeRO-1 over {} ranks: whole replicas, AdamW's state sharded by your exercise 17", self.pg.world_size())
    }

    fn report(&self) -> Option<String> {
        None
    }
}
