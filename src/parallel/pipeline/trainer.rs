//! The pipeline trainer (`train --pp S`): one stage per rank of a pipeline,
//! each step the learner's GPipe (exercise 21) or 1F1B (exercise 24)
//! schedule over the step's micro-batches, each stage updating only its own
//! parameters; with more ranks than stages, data-parallel replicas of the
//! pipeline on a [`DeviceMesh`] of shape (dp, pp, 1).
//!
//! The stages of one pipeline see the same batch; each replica its own share
//! of it. Every collective runs on the group it concerns: activations and
//! their gradients travel between the stages of a pipeline (the mesh's `pp`
//! group); after the schedule, each stage averages its gradients with the
//! same stage of the other replicas (the `dp` group), in DDP's buckets; the
//! gradient norm for clipping is the square root of the stages' sums of
//! squares added up over the pipeline (they hold disjoint parameters); the
//! loss, which only the last stage computes, is broadcast from it. A
//! checkpoint is sent to the first stage of the first replica (rank 0), which
//! writes it whole, in the format every trainer reads, so a pipelined run
//! resumes under DDP or FSDP, or on another mesh, and the other way round.
//!
//! With a tp axis (a mesh of shape (dp, pp, tp)) every stage's blocks are
//! split across its tp group ([`PipelineStage::split`], exercise 23): the
//! norm adds the shards' squares over tp, a checkpoint gathers each shard
//! along its cut before the stage sends it on, and loading cuts them again.
//! Activations travel between the same tp rank of neighbouring stages, whole.

use std::collections::HashMap;
use std::path::Path;

use candle_core::{bail, DType, Device, Result, Tensor};

use super::{stage_holding, PipelineSchedule, PipelineStage};
use crate::autograd::clip_factor;
use crate::distributed::{all_reduce_scalar, DeviceMesh, ProcessGroup, ReduceOp};
use crate::model::{param_specs, GptConfig, ParamStore};
use crate::parallel::ddp::average_in_buckets;
use crate::parallel::tensor::{moments_part, part_of, ShardCuts};
use crate::phase2_training::param_groups;
use crate::train::{
    AdamW, Checkpoint, DataPosition, ParamGroup, StepCounters, StepStats, Train, TrainConfig, TrainerState,
};

pub struct PipelineTrainer {
    model_config: GptConfig,
    stage: PipelineStage,
    schedule: PipelineSchedule,
    /// AdamW over this stage's parameters, grouped as exercise 8 groups them.
    optimizer: AdamW,
    config: TrainConfig,
    mesh: DeviceMesh,
    /// Where this stage's shards were cut across the tp group (none without one).
    cuts: ShardCuts,
    /// The most gradient bytes one of the replicas' all-reduces carries.
    bucket_bytes: usize,
    /// Where this stage computes: the scalars and buffers it exchanges live there too.
    device: Device,
    step: usize,
}

impl PipelineTrainer {
    /// This rank's stage of the model `params` holds: stage `mesh.pp().rank()`
    /// of `mesh.pp().world_size()`, its blocks split across `mesh.tp()` when
    /// that has more than one rank, stepped on `schedule`, its gradients
    /// averaged over the `mesh.dp()` replicas in all-reduces of at most
    /// `bucket_bytes`. The rest of `params` can be dropped.
    pub fn new(
        model_config: &GptConfig,
        params: &ParamStore,
        config: TrainConfig,
        mesh: DeviceMesh,
        schedule: PipelineSchedule,
        bucket_bytes: usize,
    ) -> Result<Self> {
        let pg = mesh.pp();
        if config.activation_checkpointing {
            bail!(
                "the pipeline keeps each micro-batch's activations from its forward to its backward; activation \
                 checkpointing is not combined with it here: drop --activation-checkpointing"
            );
        }
        if schedule == PipelineSchedule::OneFOneB && !pg.properties().buffered_sends {
            bail!(
                "the 1F1B schedule (exercise 24) sends an activation on and then waits for a gradient back, and \
                 this backend's send waits for its receive (NCCL), so neighbouring stages would wait for each \
                 other forever: use --pipeline-schedule gpipe, or --backend tcp"
            );
        }
        let stage = match mesh.shape().tp {
            1 => PipelineStage::new(model_config, params, pg.rank(), pg.world_size())?,
            _ => PipelineStage::split(model_config, params, pg.rank(), pg.world_size(), mesh.tp_shared())?,
        };
        let cuts = ShardCuts::of(model_config, stage.params());
        let groups = param_groups(stage.params(), config.optimizer.weight_decay);
        ParamGroup::decay_by_name(&groups, stage.params())?;
        let optimizer = AdamW::new(groups, config.optimizer.adamw)?;
        let device = params.device()?;
        let model_config = model_config.clone();
        Ok(Self { model_config, stage, schedule, optimizer, config, mesh, cuts, bucket_bytes, device, step: 0 })
    }

    /// The stage this rank runs.
    pub fn stage(&self) -> &PipelineStage {
        &self.stage
    }

    /// The parameters stage `index` holds, in model order, with their shapes.
    fn names_of_stage(&self, index: usize) -> Vec<(String, candle_core::Shape)> {
        param_specs(&self.model_config)
            .into_iter()
            .filter(|spec| stage_holding(&self.model_config, self.mesh.pp().world_size(), &spec.name) == index)
            .map(|spec| (spec.name, spec.shape))
            .collect()
    }
}

impl Train for PipelineTrainer {
    fn train_step(&mut self, micro_batches: &[Tensor]) -> Result<StepStats> {
        let pg = self.mesh.pp();
        let last = pg.world_size() - 1;
        let step = self.schedule.step(pg, &self.stage, micro_batches)?;
        let mut grads = step.grads;
        average_in_buckets(self.mesh.dp(), &mut grads, self.bucket_bytes)?;
        // The stages hold different parameters: their sums of squares add up.
        let sum_sq = self.cuts.sum_of_squares(&grads, self.mesh.tp(), &self.device)?;
        let grad_norm = all_reduce_scalar(pg, sum_sq, ReduceOp::Sum, &self.device)?.sqrt();
        let lr = self.config.schedule.lr(self.step);
        if grad_norm.is_finite() {
            if let Some(factor) = clip_factor(grad_norm, self.config.max_grad_norm) {
                grads.scale(factor)?;
            }
            self.optimizer.step(self.stage.params(), &grads, lr)?;
        } else {
            self.optimizer.skip_step(); // on every stage, not only the one that saw it
        }
        let loss = Tensor::new(&[step.loss.unwrap_or(0.0)], &self.device)?;
        let loss = pg.broadcast(&loss, last)?.to_vec1::<f32>()?[0] as f64;
        self.step += 1;
        Ok(StepStats { loss, grad_norm, lr, tokens: micro_batches.iter().map(Tensor::elem_count).sum() })
    }

    /// Every stage of the first replica gathers its shards whole across its
    /// tp group (when split) and sends its parameters and moments to the
    /// first stage, rank 0, which writes them as one whole checkpoint; the
    /// other replicas hold the same numbers.
    fn save_checkpoint(&self, dir: &Path, data: Option<DataPosition>) -> Result<()> {
        if self.mesh.coords().dp != 0 {
            return self.mesh.world().barrier();
        }
        let (pg, tp) = (self.mesh.pp(), self.mesh.tp());
        let has_moments = self.optimizer.steps() > 0;
        let state_tensors: HashMap<String, Tensor> = self.optimizer.state_tensors().into_iter().collect();
        // This stage's parameters in model order, each followed by its
        // moments, whole: what rank 0 receives from each stage, in order.
        let mut mine = Vec::new();
        for (name, _) in self.names_of_stage(pg.rank()) {
            let param = self.cuts.whole(tp, &name, self.stage.params().get(&name)?.as_tensor())?;
            let mut moments = Vec::new();
            if has_moments {
                for moment in AdamW::moment_names(&name) {
                    let whole = self.cuts.whole(tp, &name, &state_tensors[&moment])?;
                    moments.push((moment, whole));
                }
            }
            mine.push((name, param, moments));
        }
        if tp.rank() != 0 {
            return self.mesh.world().barrier();
        }
        if pg.rank() != 0 {
            for (_, param, moments) in &mine {
                pg.send(param, 0)?;
                for (_, moment) in moments {
                    pg.send(moment, 0)?;
                }
            }
            return self.mesh.world().barrier();
        }
        let (mut params, mut moments) = (HashMap::new(), HashMap::new());
        for (name, param, own_moments) in mine {
            params.insert(name, param);
            moments.extend(own_moments);
        }
        for stage in 1..pg.world_size() {
            for (name, shape) in self.names_of_stage(stage) {
                let like = Tensor::zeros(shape, DType::F32, &self.device)?;
                params.insert(name.clone(), pg.recv(&like, stage)?);
                if has_moments {
                    for moment in AdamW::moment_names(&name) {
                        moments.insert(moment, pg.recv(&like, stage)?);
                    }
                }
            }
        }
        let state = TrainerState::new(self.step, self.optimizer.steps(), self.model_config.clone(), self.config, data);
        Checkpoint { params, optimizer: moments, state }.write(dir)?;
        self.mesh.world().barrier()
    }

    /// Every stage reads the whole checkpoint and keeps its own part.
    /// Cut as the stage's shards are, when its blocks are split.
    fn load_checkpoint(&mut self, dir: &Path) -> Result<Option<DataPosition>> {
        let checkpoint = Checkpoint::read(dir)?;
        checkpoint.ensure_fits(&self.model_config)?;
        let (layers, rank, ranks) = (self.stage.layers(), self.mesh.tp().rank(), self.mesh.tp().world_size());
        let whole = ParamStore::from_tensors(checkpoint.params.clone())?;
        let part = part_of(&self.model_config, &whole, layers.clone(), rank, ranks)?;
        for (name, var) in self.stage.params().iter() {
            let Some(saved) = part.get(name) else {
                bail!("the checkpoint in {} has no parameter `{name}`", dir.display());
            };
            var.set(&saved.to_dtype(var.dtype())?.to_device(var.device())?)?;
        }
        // With a moment missing, AdamW's own check names it.
        let moments = moments_part(&self.model_config, &checkpoint.optimizer, layers, rank, ranks)?
            .unwrap_or_else(|| checkpoint.optimizer.clone());
        self.optimizer.load_state(checkpoint.state.optimizer_steps, &moments, self.stage.params())?;
        self.step = checkpoint.state.step;
        Ok(checkpoint.state.data)
    }

    /// The stages in turn, each forward once: the last stage's loss goes to all.
    fn eval_loss(&mut self, tokens: &Tensor) -> Result<f64> {
        let pg = self.mesh.pp();
        let (rank, last) = (pg.rank(), pg.world_size() - 1);
        let input = match self.stage.is_first() {
            true => tokens.clone(),
            false => pg.recv(&self.stage.activation_like(tokens)?, rank - 1)?,
        };
        let output = self.stage.forward(&input, tokens)?;
        self.stage.discard(&output);
        let loss = match self.stage.is_last() {
            true => output.to_dtype(DType::F32)?.reshape(1)?,
            false => {
                pg.send(&output, rank + 1)?;
                Tensor::zeros(1, DType::F32, &self.device)?
            }
        };
        Ok(pg.broadcast(&loss, last)?.to_vec1::<f32>()?[0] as f64)
    }
    fn counters(&self) -> StepCounters {
        StepCounters::of(self.step, &self.optimizer)
    }

    fn process_group(&self) -> &dyn ProcessGroup {
        self.mesh.world()
    }

    fn mesh(&self) -> Option<&DeviceMesh> {
        Some(&self.mesh)
    }

    fn layout(&self) -> String {
        let (stages, replicas, tp) = (self.mesh.shape().pp, self.mesh.shape().dp, self.mesh.shape().tp);
        let pipeline = match tp {
            1 => format!("a {} pipeline of {stages} stages, one per rank", self.schedule),
            _ => {
                format!("a {} pipeline of {stages} stages, each split across {tp} tensor-parallel ranks", self.schedule)
            }
        };
        match replicas {
            1 => pipeline,
            _ => format!("{pipeline}, in {replicas} data-parallel replicas"),
        }
    }

    fn report(&self) -> Option<String> {
        None
    }
}
