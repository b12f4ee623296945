//! The tensor-parallel trainer (`train --tp T`): every block split across
//! the T ranks of a tensor-parallel group, Megatron style, and stepped by
//! the learner's exercise 23; the model's root (embedding, final norm and
//! head) whole on every rank. With more ranks than T, the group is
//! replicated data-parallel on a [`DeviceMesh`] of shape (dp, 1, tp).
//!
//! Exercise 23 takes a block's forward and its backward in one call (the
//! output's gradient is one of its inputs), so a step runs each block twice
//! per micro-batch, as activation checkpointing recomputes a block: on the
//! way up with a zero gradient, for its output, and on the way down with the
//! gradient the blocks above sent back. The first call's backward is spent
//! on zeros: the blocks cost about twice what they cost in a plain step.
//!
//! Every collective runs on the group it concerns: the blocks' all-reduces
//! on the `tp` group; each rank's gradients averaged with the ranks holding
//! the same shards in the other replicas (the `dp` group), in DDP's buckets;
//! the gradient norm adds the replicated parameters once and the shards'
//! sums of squares over the `tp` group. A checkpoint holds whole tensors:
//! the shards are gathered along the dimension they were cut on, so a
//! tensor-parallel run resumes on one process or on another mesh.

use std::collections::HashMap;
use std::path::Path;

use candle_core::{bail, Device, Module, Result, Tensor, Var};

use super::{
    backward_through, forward_through, gather_sequence, moments_part, part_of, BlockStep, ShardCuts,
    TensorParallelBlock,
};
use crate::autograd::{clip_factor, vjp, Gradients};
use crate::distributed::{DeviceMesh, ProcessGroup};
use crate::model::{layer_of, GptConfig, Outer, ParamStore};
use crate::parallel::ddp::average_in_buckets;
use crate::phase1_model::next_token_loss;
use crate::phase2_training::param_groups;
use crate::train::{
    AdamW, Checkpoint, DataPosition, ParamGroup, StepCounters, StepStats, Train, TrainConfig, TrainerState,
};

pub struct TensorParallelTrainer {
    model_config: GptConfig,
    outer: Outer,
    blocks: Vec<TensorParallelBlock>,
    /// The root's parameters, whole and the same on every rank.
    root: ParamStore,
    /// The root's parameters and this rank's shards, under the whole model's names.
    params: ParamStore,
    cuts: ShardCuts,
    /// Exercise 23, or 27 under sequence parallelism.
    block_step: BlockStep,
    optimizer: AdamW,
    config: TrainConfig,
    mesh: DeviceMesh,
    /// The most gradient bytes one of the replicas' all-reduces carries.
    bucket_bytes: usize,
    device: Device,
    step: usize,
}

impl TensorParallelTrainer {
    /// This rank's part of the model `params` holds (the root, and its
    /// shard of every block across `mesh.tp()`), its gradients averaged
    /// over the `mesh.dp()` replicas in all-reduces of at most `bucket_bytes`.
    pub fn new(
        model_config: &GptConfig,
        params: &ParamStore,
        config: TrainConfig,
        mesh: DeviceMesh,
        bucket_bytes: usize,
    ) -> Result<Self> {
        if mesh.shape().pp != 1 {
            bail!("the tensor-parallel trainer runs no pipeline: it takes a mesh with pp 1, not {}", mesh.shape());
        }
        if config.activation_checkpointing {
            bail!(
                "the tensor-parallel step already runs each block twice (exercise 23 takes a block's forward and \
                 backward in one call): drop --activation-checkpointing"
            );
        }
        let (rank, ranks) = (mesh.tp().rank(), mesh.tp().world_size());
        let blocks = (0..model_config.num_layers)
            .map(|layer| TensorParallelBlock::shard(model_config, params, layer, rank, ranks))
            .collect::<Result<Vec<_>>>()?;
        let root = params.subset(|name| layer_of(name).is_none());
        let outer = Outer::new(model_config, &root)?;
        let held = std::iter::once(&root).chain(blocks.iter().map(TensorParallelBlock::params));
        let held = ParamStore::union(held)?;
        let cuts = ShardCuts::of(model_config, &held);
        let groups = param_groups(&held, config.optimizer.weight_decay);
        ParamGroup::decay_by_name(&groups, &held)?;
        let optimizer = AdamW::new(groups, config.optimizer.adamw)?;
        let device = params.device()?;
        Ok(Self {
            model_config: model_config.clone(),
            outer,
            blocks,
            root,
            params: held,
            cuts,
            block_step: BlockStep::default(),
            optimizer,
            config,
            mesh,
            bucket_bytes,
            device,
            step: 0,
        })
    }

    /// The root's parameters and this rank's shards, under the whole model's names.
    pub fn params(&self) -> &ParamStore {
        &self.params
    }

    /// Steps every block with exercise 27 instead of 23: outside the split
    /// matrices each rank keeps its chunk of the tokens, cut from the
    /// embedding's output and gathered again before the final norm.
    pub fn with_sequence_parallel(mut self) -> Self {
        self.block_step = BlockStep::SequenceParallel;
        self
    }

    /// The loss of one micro-batch of `tokens`, with the gradients of this
    /// rank's parameters for it added to `grads`.
    fn micro_batch(&self, tokens: &Tensor, grads: &mut Gradients) -> Result<f64> {
        let tp = self.mesh.tp();
        let embedded = self.outer.embed_tokens.forward(tokens)?;
        let (inputs, top) = self.through_blocks(&embedded)?;
        let top = Var::from_tensor(&top)?;
        let logits = self.outer.lm_head.forward(&self.outer.norm.forward(top.as_tensor())?)?;
        let loss = next_token_loss(&logits, tokens)?;
        let head = loss.backward()?;
        grads.accumulate(&Gradients::from_store(&self.root, &head)?)?;
        let Some(grad) = head.get(top.as_tensor()) else { bail!("the loss did not read the blocks") };
        let grad = self.own_tokens(grad)?;
        let grad = backward_through(tp, &self.blocks, self.block_step, &inputs, grad, |g| grads.accumulate(g))?;
        let grad = self.all_tokens(&grad)?;
        grads.accumulate(&Gradients::from_store(&self.root, &vjp(&embedded, &grad)?)?)?;
        Ok(loss.to_scalar::<f32>()? as f64)
    }

    /// `embedded` (B, T, C) through every block, split over the group: each
    /// block's input, and the last block's output, (B, T, C) on every rank.
    fn through_blocks(&self, embedded: &Tensor) -> Result<(Vec<Tensor>, Tensor)> {
        let x = self.own_tokens(&embedded.detach())?;
        let (inputs, top) = forward_through(self.mesh.tp(), &self.blocks, self.block_step, &x)?;
        Ok((inputs, self.all_tokens(&top)?))
    }

    /// This rank's chunk of the tokens of `t`, (B, T, C), under sequence
    /// parallelism; `t` itself otherwise.
    fn own_tokens(&self, t: &Tensor) -> Result<Tensor> {
        if self.block_step != BlockStep::SequenceParallel {
            return Ok(t.clone());
        }
        let (tp, seq_len) = (self.mesh.tp(), t.dim(1)?);
        let (rank, ranks) = (tp.rank(), tp.world_size());
        if !seq_len.is_multiple_of(ranks) {
            bail!(
                "--sequence-parallel cuts each sequence into {ranks} chunks, one per tensor-parallel rank, and \
                 {seq_len} tokens do not split into {ranks}: use a --seq-len that {ranks} divides"
            );
        }
        t.narrow(1, rank * seq_len / ranks, seq_len / ranks)
    }

    /// Every rank's chunk put together under sequence parallelism; `t` itself otherwise.
    fn all_tokens(&self, t: &Tensor) -> Result<Tensor> {
        match self.block_step {
            BlockStep::SequenceParallel => gather_sequence(self.mesh.tp(), t),
            BlockStep::TensorParallel => Ok(t.clone()),
        }
    }
}

impl Train for TensorParallelTrainer {
    fn train_step(&mut self, micro_batches: &[Tensor]) -> Result<StepStats> {
        let mut grads = Gradients::default();
        let mut loss = 0.0;
        for tokens in micro_batches {
            loss += self.micro_batch(tokens, &mut grads)?;
        }
        let scale = 1.0 / micro_batches.len() as f64;
        grads.scale(scale)?;
        average_in_buckets(self.mesh.dp(), &mut grads, self.bucket_bytes)?;
        let grad_norm = self.cuts.sum_of_squares(&grads, self.mesh.tp(), &self.device)?.sqrt();
        let lr = self.config.schedule.lr(self.step);
        if grad_norm.is_finite() {
            if let Some(factor) = clip_factor(grad_norm, self.config.max_grad_norm) {
                grads.scale(factor)?;
            }
            self.optimizer.step(&self.params, &grads, lr)?;
        } else {
            self.optimizer.skip_step(); // on every rank, not only the one that saw it
        }
        self.step += 1;
        let tokens = micro_batches.iter().map(Tensor::elem_count).sum();
        Ok(StepStats { loss: loss * scale, grad_norm, lr, tokens })
    }

    /// The first replica's group gathers every shard and its moments; rank 0
    /// writes them whole. The other replicas hold the same numbers.
    fn save_checkpoint(&self, dir: &Path, data: Option<DataPosition>) -> Result<()> {
        if self.mesh.coords().dp == 0 {
            let moments = self.optimizer.state_tensors();
            let has_moments = self.optimizer.steps() > 0;
            let (mut params, mut optimizer) = (HashMap::new(), HashMap::new());
            for (name, var) in self.params.iter() {
                params.insert(name.to_string(), self.cuts.whole(self.mesh.tp(), name, var.as_tensor())?);
                if has_moments {
                    for moment in AdamW::moment_names(name) {
                        optimizer.insert(moment.clone(), self.cuts.whole(self.mesh.tp(), name, &moments[&moment])?);
                    }
                }
            }
            if self.mesh.tp().rank() == 0 {
                let state =
                    TrainerState::new(self.step, self.optimizer.steps(), self.model_config.clone(), self.config, data);
                Checkpoint { params, optimizer, state }.write(dir)?;
            }
        }
        self.mesh.world().barrier()
    }

    /// Every rank reads the whole checkpoint and cuts its own part out of
    /// the parameters and of each moment, as the shards were cut.
    fn load_checkpoint(&mut self, dir: &Path) -> Result<Option<DataPosition>> {
        let checkpoint = Checkpoint::read(dir)?;
        checkpoint.ensure_fits(&self.model_config)?;
        let whole = ParamStore::from_tensors(checkpoint.params.clone())?;
        let (layers, rank, ranks) =
            (0..self.model_config.num_layers, self.mesh.tp().rank(), self.mesh.tp().world_size());
        let part = part_of(&self.model_config, &whole, layers.clone(), rank, ranks)?;
        for (name, var) in self.params.iter() {
            var.set(&part[name].to_dtype(var.dtype())?.to_device(var.device())?)?;
        }
        let steps = checkpoint.state.optimizer_steps;
        // With a moment missing, AdamW's own check names it.
        let moments = moments_part(&self.model_config, &checkpoint.optimizer, layers, rank, ranks)?
            .unwrap_or_else(|| checkpoint.optimizer.clone());
        self.optimizer.load_state(steps, &moments, &self.params)?;
        self.step = checkpoint.state.step;
        Ok(checkpoint.state.data)
    }

    fn eval_loss(&mut self, tokens: &Tensor) -> Result<f64> {
        let (_, top) = self.through_blocks(&self.outer.embed_tokens.forward(tokens)?)?;
        let logits = self.outer.lm_head.forward(&self.outer.norm.forward(&top)?)?;
        Ok(next_token_loss(&logits, tokens)?.to_scalar::<f32>()? as f64)
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
        let (ranks, replicas) = (self.mesh.shape().tp, self.mesh.shape().dp);
        let sequence = match self.block_step {
            BlockStep::SequenceParallel => " (norms and residuals cut along the sequence)",
            BlockStep::TensorParallel => "",
        };
        let split = format!("every block split across {ranks} tensor-parallel ranks{sequence}, the root whole on each");
        match replicas {
            1 => split,
            _ => format!("{split}, in {replicas} data-parallel replicas"),
        }
    }

    fn report(&self) -> Option<String> {
        None
    }
}
