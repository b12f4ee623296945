//! The mesh's data-parallel axis: how the replicas finish a step once each
//! holds the gradient of its own share of the batch. DDP averages the
//! gradients across the replicas (all-reduces, in buckets) and every replica
//! takes the same AdamW step; ZeRO-1 keeps 1/dp of AdamW's state on each:
//! exercise 17's step reduce-scatters this rank's parameters' gradient as
//! one flat vector, updates this replica's shard of it and all-gathers the
//! parameters back; ZeRO-2 keeps 1/dp of the gradient too: each
//! micro-batch's gradient is reduce-scattered as soon as its backward ends,
//! the shards summed, and exercise 17's shard update takes the step; a DDP of the learner's own design (exercise 26) runs
//! each micro-batch's forward and backward itself and hands over averaged
//! gradients. Either way the norm for clipping is the whole model's, and a
//! step whose norm is not finite changes nothing, on every rank.

use std::collections::HashMap;
use std::ops::Range;

use candle_core::{bail, DType, Device, Result, Tensor};

use super::units;
use crate::autograd::Gradients;
use crate::distributed::{all_reduce_scalar, DeviceMesh, ProcessGroup, ReduceOp, WithOverride};
use crate::model::{GptConfig, ParamStore};
use crate::parallel::ddp::Ddp;
use crate::parallel::fsdp::{self, FlatLayout, Precision, ShardingStrategy};
use crate::parallel::pipeline::PipelineStage;
use crate::parallel::pipeline::PipelineStep;
use crate::parallel::tensor::ShardCuts;
use crate::parallel::zero::{ClipShards, ModelParts, ShardedAdamW};
use crate::phase2_training::param_groups;
use crate::phase4_under_the_hood::DataParallel;
use crate::train::{AdamW, AdamWConfig, Moments, ParamGroup, TrainConfig, Verdict};

/// What the data-parallel axis of a mesh shards.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DataAxis {
    /// Nothing (DDP): whole gradients averaged, the same AdamW step on every replica.
    #[default]
    Replicate,
    /// AdamW's state (ZeRO-1): each replica updates its shard by exercise 17.
    ShardOptimizer,
    /// AdamW's state and the gradients (ZeRO-2): each micro-batch's gradient
    /// reduce-scattered once its backward ends, only this replica's shard
    /// kept, which exercise 17's shard update steps. One stage only: a
    /// pipeline's schedule holds a stage's gradients over all its micro-batches.
    ShardGradients,
    /// Nothing, by the learner's own DDP (exercise 26), which owns each
    /// micro-batch's forward and backward: one stage of whole blocks only.
    YourDdp,
    /// The blocks: each an FSDP unit across the replicas, sharded as
    /// exercise 12's plan of `sharding` says, under HYBRID_SHARD across
    /// groups of `shard_group` consecutive replicas that are replicas of each
    /// other, stepped by exercise 22; each stage's embedding, final norm and
    /// head one more unit, its root, sharded the same way. With a tp axis
    /// each block's unit holds this rank's tensor-parallel shards of it
    /// (FSDP × TP); the root is whole on every rank of the tp group. The
    /// units compute in `precision` as exercise 13's policy says (f32 master
    /// shards and moments), and reduce in f32 as well where `reduce_in_f32`.
    ShardBlocks { sharding: ShardingStrategy, shard_group: Option<usize>, precision: Precision, reduce_in_f32: bool },
}

impl DataAxis {
    /// Whether the replicas shard some of the model states (ZeRO-1, ZeRO-2,
    /// FSDP): runs whose point is memory.
    pub fn shards(self) -> bool {
        matches!(self, Self::ShardOptimizer | Self::ShardGradients | Self::ShardBlocks { .. })
    }
}

/// The optimizer of a rank's parameters under one [`DataAxis`] choice.
pub(super) enum Update {
    Replicated {
        optimizer: AdamW,
        /// Averages the gradients across the replicas, in buckets (with
        /// PowerSGD's estimates when asked for), as a plain DDP run does.
        ddp: Ddp,
    },
    Sharded(Box<Sharded>),
    /// FSDP's units alone, the stage's root among them: each keeps its
    /// own shards of the parameters, gradient and moments.
    Units {
        adamw: AdamWConfig,
    },
    /// Exercise 26's wrapper, which averages the gradients itself.
    YourDdp {
        optimizer: AdamW,
        ddp: Box<DataParallel>,
    },
}

/// ZeRO-1 or ZeRO-2 over the dp group: this rank's parameters as one flat vector.
pub(super) struct Sharded {
    /// The shards of split blocks first, then the whole parameters: the
    /// clipping adds the first part's squares over the tp group.
    layout: FlatLayout,
    /// Each parameter's weight decay, applied before the step.
    decay_of: HashMap<String, f64>,
    optimizer: ShardedAdamW,
    /// The dp group, its reduce-scatter clipping.
    dp: WithOverride<ClipShards>,
    clip: ClipShards,
    /// Under ZeRO-2, this step's gradient shard so far, summed over its
    /// micro-batches; `None` under ZeRO-1, which reduces once in exercise 17's step.
    grad_shard: Option<GradShard>,
}

/// ZeRO-2's gradient: this rank's shard of the averaged flat gradient.
#[derive(Default)]
struct GradShard {
    sum: Option<Tensor>,
}

impl Update {
    /// The optimizer of `params`, this rank's parts of a model of
    /// `model_config`, under `kind`.
    pub(super) fn new(
        kind: DataAxis,
        (model_config, params): (&GptConfig, &ParamStore),
        config: &TrainConfig,
        mesh: &DeviceMesh,
        cuts: &ShardCuts,
        bucket_bytes: usize,
    ) -> Result<Self> {
        let groups = param_groups(params, config.optimizer.weight_decay);
        let decay_of = ParamGroup::decay_by_name(&groups, params)?;
        match kind {
            DataAxis::Replicate => {
                let optimizer = AdamW::new(groups, config.optimizer.adamw)?;
                let ddp = Ddp::new(Box::new(mesh.dp_shared())).with_bucket_bytes(bucket_bytes);
                return Ok(Self::Replicated { optimizer, ddp });
            }
            DataAxis::ShardBlocks { .. } => return Ok(Self::Units { adamw: config.optimizer.adamw }),
            DataAxis::YourDdp => {
                if mesh.shape().pp > 1 || mesh.shape().tp > 1 {
                    bail!(
                        "your DataParallel (exercise 26) wraps a whole model: it takes no --pp or --tp, not {}",
                        mesh.shape()
                    );
                }
                let optimizer = AdamW::new(groups, config.optimizer.adamw)?;
                // The wrapper trains the very variables the optimizer steps.
                let ddp = DataParallel::new(model_config, params.clone(), Box::new(mesh.dp_shared()), bucket_bytes)?;
                return Ok(Self::YourDdp { optimizer, ddp: Box::new(ddp) });
            }
            DataAxis::ShardOptimizer | DataAxis::ShardGradients => {}
        }
        if kind == DataAxis::ShardGradients && mesh.shape().pp > 1 {
            bail!(
                "ZeRO-2 reduce-scatters each micro-batch's gradient as soon as its backward ends, and a pipeline's \
                 schedule (exercises 21 and 24) holds a stage's gradients over all its micro-batches: use ZeRO-1 \
                 with a pipeline"
            );
        }
        let (shards, whole): (Vec<_>, Vec<_>) = params.iter().partition(|(name, _)| cuts.is_cut(name));
        let shard_elements = shards.iter().map(|(_, var)| var.elem_count()).sum();
        let shapes = shards.into_iter().chain(whole).map(|(name, var)| (name.to_string(), var.shape().clone()));
        let layout = FlatLayout::of_shapes(shapes, mesh.dp().world_size());
        let spread = |size: usize, group| (size > 1).then_some(group);
        let parts = ModelParts {
            shard_elements,
            tp: spread(mesh.shape().tp, mesh.tp_shared()),
            pp: spread(mesh.shape().pp, mesh.pp_shared()),
        };
        let clip = ClipShards::of_part(config.max_grad_norm, parts);
        Ok(Self::Sharded(Box::new(Sharded {
            layout,
            decay_of,
            // Decay is applied before the step, element by element, with each parameter's own.
            optimizer: ShardedAdamW::new(config.optimizer.adamw, 0.0),
            dp: WithOverride::new(Box::new(mesh.dp_shared()), clip.clone()),
            clip,
            grad_shard: (kind == DataAxis::ShardGradients).then(GradShard::default),
        })))
    }

    /// Finishes a step from `grads`, the gradients of `stage`'s parameters
    /// (on `device`) for this replica's share of the batch (its FSDP units,
    /// if any, hold their own), all `loss_scale` times the true ones: the
    /// whole model's gradient norm, which `settle` turns into the step's
    /// verdict, then AdamW at `lr`, clipped, or nothing. Returns the norm
    /// before clipping.
    pub(super) fn step(
        &mut self,
        (mesh, cuts): (&DeviceMesh, &ShardCuts),
        stage: &PipelineStage,
        mut grads: Gradients,
        (lr, loss_scale, settle): (f64, f64, impl FnOnce(f64) -> Verdict),
        device: &Device,
    ) -> Result<f64> {
        let params = stage.params();
        let unscale = 1.0 / loss_scale;
        if loss_scale != 1.0 {
            grads.scale(unscale)?;
        }
        // AdamW over the parameters the stage holds whole, if any, and the units' settings.
        let (optimizer, adamw) = match self {
            Self::Sharded(sharded) => return sharded.step(params, grads, (lr, settle), device),
            Self::Replicated { optimizer, ddp } => {
                ddp.sync_gradients(&mut grads)?;
                let adamw = optimizer.config();
                (Some(optimizer), adamw)
            }
            Self::YourDdp { optimizer, .. } => {
                let adamw = optimizer.config(); // its gradients arrive averaged
                (Some(optimizer), adamw)
            }
            Self::Units { adamw } => (None, *adamw),
        };
        // FSDP units hold their own gradients, stepped by `fsdp::step`.
        let mut units = stage.sharded_units();
        let unit_grads = match units.as_mut() {
            Some(held) => {
                let groups = held.groups();
                fsdp::take_grads(held.units.iter_mut(), groups, unscale)?
            }
            None => vec![],
        };
        let unit_sum_sq = match &units {
            Some(held) => {
                let split = Some((cuts, mesh.tp()));
                fsdp::sum_of_squares_over(held.units.iter(), &unit_grads, held.groups(), split, device)?
            }
            None => 0.0,
        };
        // The stages hold different parameters: their sums of squares add up.
        let sum_sq = cuts.sum_of_squares(&grads, mesh.tp(), device)? + unit_sum_sq;
        let grad_norm = all_reduce_scalar(mesh.pp(), sum_sq, ReduceOp::Sum, device)?.sqrt();
        if let Verdict::Update { clip, t } = settle(grad_norm) {
            if let Some(factor) = clip {
                grads.scale(factor)?;
            }
            if let Some(optimizer) = optimizer {
                optimizer.step(params, &grads, lr)?;
            }
            if let Some(held) = units.as_mut() {
                let shard = held.shard;
                fsdp::step(held.units.iter_mut(), unit_grads, (clip, lr, t), &adamw, shard)?;
            }
        }
        Ok(grad_norm)
    }

    /// Averages the replicas' matrix gradients as rank-`approx_rank`
    /// PowerSGD estimates (exercise 18), as a plain DDP run does with
    /// `--powersgd-rank`; refused where the replicas do not all-reduce whole
    /// gradients (DDP).
    pub(super) fn with_powersgd(self, approx_rank: usize) -> Result<Self> {
        match self {
            Self::Replicated { optimizer, ddp } => {
                Ok(Self::Replicated { optimizer, ddp: ddp.with_powersgd(approx_rank) })
            }
            _ => bail!(
                "PowerSGD compresses the all-reduce of DDP's whole gradients; this mesh's replicas shard them \
                 (--strategy zero1, zero2 or fsdp) or average them by your exercise 26"
            ),
        }
    }

    /// Takes one micro-batch's gradients `grads`: ZeRO-2
    /// reduce-scatters them over the replicas and keeps its shard, and
    /// returns `None`; the others hand them back to be accumulated.
    pub(super) fn take_micro_batch(&mut self, grads: Gradients, device: &Device) -> Result<Option<Gradients>> {
        let Self::Sharded(sharded) = self else { return Ok(Some(grads)) };
        if sharded.grad_shard.is_none() {
            return Ok(Some(grads));
        }
        sharded.add_micro_batch(grads, device)?;
        Ok(None)
    }

    /// Under exercise 26, the step's forwards and backwards, run by the
    /// learner's wrapper: the mean loss and the gradients averaged over the
    /// ranks, divided by the micro-batches. `None` under the other axes,
    /// where the model's stage runs them.
    pub(super) fn run_micro_batches(&mut self, micro_batches: &[Tensor]) -> Result<Option<PipelineStep>> {
        let Self::YourDdp { ddp, .. } = self else { return Ok(None) };
        if micro_batches.is_empty() {
            bail!("train_step needs at least one micro-batch");
        }
        let mut loss = 0.0;
        for (i, batch) in micro_batches.iter().enumerate() {
            loss += ddp.forward_backward(batch, i + 1 == micro_batches.len())?;
        }
        let mut grads = ddp.take_gradients()?;
        let k = micro_batches.len() as f64;
        grads.scale(1.0 / k)?;
        Ok(Some(PipelineStep { loss: Some((loss / k) as f32), grads }))
    }

    /// The elements of AdamW's two moments this rank keeps for its `held`
    /// parameter elements (once it has stepped).
    pub(super) fn moment_elements(&self, held: u64) -> u64 {
        match self {
            Self::Replicated { .. } | Self::YourDdp { .. } | Self::Units { .. } => 2 * held,
            Self::Sharded(sharded) => 2 * sharded.shard_len() as u64,
        }
    }

    /// The elements of gradient this rank keeps for its `held` parameter
    /// elements: a shard under ZeRO-2, all of them otherwise.
    pub(super) fn grad_elements(&self, held: u64) -> u64 {
        match self {
            Self::Sharded(sharded) if sharded.grad_shard.is_some() => sharded.shard_len() as u64,
            _ => held,
        }
    }

    /// AdamW's moments of this rank's parameters, by AdamW's names; none
    /// before the first update. Under ZeRO-1 every rank of the dp group
    /// calls it: the shards are gathered.
    pub(super) fn moments(&self) -> Result<HashMap<String, Tensor>> {
        match self {
            Self::Replicated { optimizer, .. } | Self::YourDdp { optimizer, .. } => match optimizer.steps() {
                0 => Ok(HashMap::new()),
                _ => Ok(optimizer.state_tensors().into_iter().collect()),
            },
            Self::Sharded(sharded) => sharded.moments(),
            Self::Units { .. } => Ok(HashMap::new()), // the units hold theirs
        }
    }

    /// Takes up a checkpoint's `steps` and `moments` (AdamW's names, this
    /// rank's parts of the model) for `params`, on `device`.
    pub(super) fn load(
        &mut self,
        steps: u64,
        moments: &HashMap<String, Tensor>,
        params: &ParamStore,
        device: &Device,
    ) -> Result<()> {
        match self {
            Self::Replicated { optimizer, .. } | Self::YourDdp { optimizer, .. } => {
                optimizer.load_state(steps, moments, params)
            }
            Self::Sharded(sharded) => sharded.load(steps, moments, device),
            Self::Units { .. } => Ok(()), // the units take theirs
        }
    }
}

/// `tensors` by name, as a flat layout takes them.
fn named(tensors: Vec<(&str, Tensor)>) -> HashMap<String, Tensor> {
    tensors.into_iter().map(|(name, t)| (name.to_string(), t)).collect()
}

impl Sharded {
    /// The elements of this rank's shard of the flat vector.
    fn shard_len(&self) -> usize {
        self.layout.padded_len() / self.dp.world_size()
    }

    /// `grads` (every parameter's) as one flat vector on `device`, each
    /// gradient let go once it is copied in.
    fn flat_grad(&self, mut grads: Gradients, device: &Device) -> Result<Tensor> {
        if let Some(name) = self.layout.names().find(|name| grads.get(name).is_none()) {
            bail!("no gradient reached `{name}`: the loss does not depend on it");
        }
        self.layout.concat(self.layout.names().map(|name| grads.remove(name)), DType::F32, device)
    }

    /// Elements `range` of this rank's parameters as one flat vector, with
    /// AdamW's decoupled weight decay at `lr` applied, each parameter's own.
    fn decayed_params(&self, params: &ParamStore, range: Range<usize>, lr: f64, device: &Device) -> Result<Tensor> {
        let values = named(params.iter().map(|(n, var)| (n, var.as_tensor().clone())).collect());
        self.layout.part_scaled(&values, range, |name| 1.0 - lr * self.decay_of[name], device)
    }

    /// ZeRO-2: one micro-batch's gradient averaged over the replicas, of
    /// which this rank keeps and sums its shard; the whole is dropped.
    fn add_micro_batch(&mut self, grads: Gradients, device: &Device) -> Result<()> {
        let flat = self.flat_grad(grads, device)?;
        // The plain group: the clipping reduce-scatter is the step's, once.
        let shard = self.dp.inner().reduce_scatter(&flat, ReduceOp::Avg)?;
        let sum = self.grad_shard.as_mut().expect("ZeRO-2 keeps a gradient shard");
        sum.sum = Some(match sum.sum.take() {
            Some(so_far) => (so_far + shard)?,
            None => shard,
        });
        Ok(())
    }

    fn step(
        &mut self,
        params: &ParamStore,
        grads: Gradients,
        (lr, settle): (f64, impl FnOnce(f64) -> Verdict),
        device: &Device,
    ) -> Result<f64> {
        if let Some(sum) = self.grad_shard.as_mut() {
            let Some(grad_shard) = sum.sum.take() else {
                bail!("ZeRO-2's step found no gradient shard: run a micro-batch before the step");
            };
            return self.step_shard(params, grad_shard, (lr, settle), device);
        }
        let grad = self.flat_grad(grads, device)?;
        let decayed = self.decayed_params(params, 0..self.layout.padded_len(), lr, device)?;
        // Exercise 17 updates the moments within its step, and the norm is
        // known only after it: a step whose gradient is not finite puts the
        // moments (tensors are immutable: these are the old ones, not copies)
        // and the step count back and leaves the parameters, as every
        // strategy skips such a step. The norm is the same on every rank.
        let (moments_before, steps_before) = (self.optimizer.moments.clone(), self.optimizer.steps);
        let updated = self.optimizer.step(&self.dp, &decayed, &grad, lr)?;
        let grad_norm = self.clip.take_norm()?;
        // The clipping was applied in the step's reduce-scatter, by the same factor.
        match settle(grad_norm) {
            Verdict::Update { .. } => {
                for (name, value) in self.layout.unflatten(&updated)? {
                    params.get(&name)?.set(&value)?;
                }
            }
            Verdict::Skip => (self.optimizer.moments, self.optimizer.steps) = (moments_before, steps_before),
        }
        Ok(grad_norm)
    }

    /// ZeRO-2's update: the whole model's norm from this rank's averaged
    /// `grad_shard`, the shard clipped and stepped by exercise 17's
    /// `update_shard` (nothing changes when `settle` skips), and the
    /// parameters all-gathered back.
    fn step_shard(
        &mut self,
        params: &ParamStore,
        grad_shard: Tensor,
        (lr, settle): (f64, impl FnOnce(f64) -> Verdict),
        device: &Device,
    ) -> Result<f64> {
        let (grad_shard, grad_norm) = self.clip.clip(self.dp.inner(), grad_shard)?;
        if settle(grad_norm) == Verdict::Skip {
            return Ok(grad_norm);
        }
        let range = self.layout.shard_range(self.dp.rank(), self.dp.world_size());
        let decayed = self.decayed_params(params, range, lr, device)?;
        let new_shard = self.optimizer.update_shard(&decayed, &grad_shard, lr)?;
        for (name, value) in self.layout.unflatten(&self.dp.all_gather(&new_shard)?)? {
            params.get(&name)?.set(&value)?;
        }
        Ok(grad_norm)
    }

    fn moments(&self) -> Result<HashMap<String, Tensor>> {
        let mut named = HashMap::new();
        if let Some(moments) = &self.optimizer.moments {
            for (kind, shard) in [&moments.exp_avg, &moments.exp_avg_sq].into_iter().enumerate() {
                for (name, moment) in self.layout.unflatten(&self.dp.all_gather(shard)?)? {
                    named.insert(AdamW::moment_names(&name)[kind].clone(), moment);
                }
            }
        }
        Ok(named)
    }

    /// Keeps this rank's shard of each moment in `saved`.
    fn load(&mut self, steps: u64, saved: &HashMap<String, Tensor>, device: &Device) -> Result<()> {
        self.optimizer.moments = match steps {
            0 => None,
            _ => {
                let range = self.layout.shard_range(self.dp.rank(), self.dp.world_size());
                let shard_of = |kind| units::saved_moment_part(&self.layout, range.clone(), saved, kind, device);
                Some(Moments { exp_avg: shard_of(0)?, exp_avg_sq: shard_of(1)? })
            }
        };
        self.optimizer.steps = steps;
        Ok(())
    }
}
