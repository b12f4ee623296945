//! The mesh trainer (`train --pp S`, `--tp T`, both, or either with
//! `--sequence-parallel`; `--strategy zero1` with any of them or none;
//! `--strategy zero2` with `--tp` or alone;
//! `--strategy fsdp` with any of them or none; `--own-ddp`): the model transformed over a
//! [`DeviceMesh`] of shape (dp, pp, tp). Pipeline parallelism cuts it into S stages, one per
//! rank of a `pp` group, stepped on the learner's GPipe (exercise 21) or
//! 1F1B (exercise 24) schedule over the step's micro-batches; tensor
//! parallelism splits every stage's blocks across its `tp` group, run by
//! exercise 23 (or 27, the tokens outside the split matrices cut along the
//! sequence) as ordinary modules, once per micro-batch; the ranks beyond one pipeline of split stages are data-parallel
//! replicas of it, which share each step as the [`DataAxis`] says: DDP's
//! averaged gradients, ZeRO-1's sharded optimizer (exercise 17), ZeRO-2's
//! sharded gradients (each micro-batch's reduce-scattered at once), FSDP's
//! units (exercise 22: each block of a stage sharded across the replicas,
//! and the stage's embedding, final norm and head as one more unit, its
//! root, as exercise 14's wrap policy and exercise 12's plan lay them out;
//! see `units.rs`), or the learner's own DDP (exercise 26). With one stage there is nothing to
//! schedule: each micro-batch runs forward and back in turn through the
//! whole model.
//!
//! The stages of one pipeline see the same batch; each replica its own share
//! of it. Every collective runs on the group it concerns: activations and
//! their gradients travel between the same tp rank of neighbouring stages
//! (the `pp` group), whole; the blocks' all-reduces run on the `tp` group;
//! after the schedule, each rank reduces its gradients with the same place
//! in the other replicas (the `dp` group; see `data_axis.rs`). The gradient norm
//! for clipping adds each rank's sum of squares, the replicated parameters
//! once and the shards' over the `tp` group, then over the pipeline (its
//! stages hold disjoint parameters); the loss, which only the last stage
//! computes, is broadcast from it.
//!
//! A checkpoint holds whole tensors: each stage of the first replica gathers
//! its shards along the dimension they were cut on (under ZeRO-1 its moments
//! from the other replicas first; under FSDP a unit at a time) and sends its
//! parameters and moments to rank 0 a tensor at a time, which writes each as it arrives, in the format every trainer
//! reads, so a run resumes under DDP or FSDP, or on another mesh, and the
//! other way round; loading cuts each rank's part out again (`checkpoint.rs`).

mod checkpoint;
mod data_axis;
mod report;
mod units;

use std::path::Path;

use candle_core::{bail, DType, Device, Result, Tensor};

pub use data_axis::DataAxis;

use self::data_axis::Update;
use crate::autograd::Gradients;
use crate::distributed::{Axis, CommStats, DeviceMesh, ProcessGroup, SharedGroup};
use crate::model::{GptConfig, ParamStore};
use crate::parallel::fsdp::{
    check_units, LocalState, LossScaler, MemoryLedger, MixedPrecisionPolicy, OffloadFile, Precision, ShardedUnit,
    ShardingPlan, ShardingStrategy, StepLedger,
};
use crate::parallel::pipeline::{FsdpPlan, HeldUnits, PipelineSchedule, PipelineStage, PipelineStep};
use crate::parallel::tensor::{BlockStep, ShardCuts};
use crate::phase2_training::param_groups;
use crate::phase3_fsdp::{mixed_precision_policy, sharding_plan, wrap_policy};
use crate::train::{DataPosition, ParamGroup, StepCounters, StepStats, Train, TrainConfig};

/// How a mesh trainer runs along each axis, besides the mesh's shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MeshPlan {
    /// The pipeline's schedule, when the mesh has more than one stage.
    pub schedule: PipelineSchedule,
    /// Which exercise steps the split blocks, when the mesh has a tp axis.
    pub block_step: BlockStep,
    /// What the replicas share each step.
    pub data_axis: DataAxis,
    /// Under DDP, the most gradient bytes one all-reduce carries.
    pub bucket_bytes: usize,
}

impl MeshPlan {
    /// One axis of whole-model replicas sharing each step as `data_axis`
    /// says (`--strategy fsdp`, `zero1` or `zero2` alone): no schedule or
    /// block split applies, and DDP's buckets are its default.
    pub fn replicas(data_axis: DataAxis) -> Self {
        Self {
            schedule: PipelineSchedule::GPipe,
            block_step: BlockStep::TensorParallel,
            data_axis,
            bucket_bytes: crate::parallel::ddp::DEFAULT_BUCKET_BYTES,
        }
    }
}

pub struct MeshTrainer {
    model_config: GptConfig,
    /// This rank's stage: the whole model when the pipeline has one.
    stage: PipelineStage,
    schedule: PipelineSchedule,
    /// Which exercise steps the split blocks, under tensor parallelism.
    block_step: BlockStep,
    /// AdamW over this stage's parameters, grouped as exercise 8 groups
    /// them, whole or sharded across the replicas.
    update: Update,
    data_axis: DataAxis,
    config: TrainConfig,
    mesh: DeviceMesh,
    /// Where this stage's shards were cut across the tp group (none without one).
    cuts: ShardCuts,
    /// Where this stage computes: the scalars and buffers it exchanges live there too.
    device: Device,
    counters: StepCounters,
    /// Dynamic loss scaling, when the FSDP units' policy asks for it (fp16).
    scaler: Option<LossScaler>,
    /// What the last step sent along each axis with more than one rank.
    last_step_sent: Vec<(Axis, CommStats)>,
    /// What the last step's collectives along dp (and the groups split out
    /// of it) carried, whatever its size: a group of one still counts them.
    last_step_dp: CommStats,
}

impl MeshTrainer {
    /// This rank's stage of the model `params` holds: stage `mesh.pp().rank()`
    /// of `mesh.pp().world_size()`, its blocks split across `mesh.tp()` when
    /// that has more than one rank (stepped as `block_step` says), the stages
    /// stepped on `plan.schedule`; the `mesh.dp()` replicas share each step as
    /// `plan.data_axis` says. The rest of `params` can be dropped.
    pub fn new(
        model_config: &GptConfig,
        params: &ParamStore,
        config: TrainConfig,
        mesh: DeviceMesh,
        plan: MeshPlan,
    ) -> Result<Self> {
        Self::build(model_config, params, config, mesh, plan, None)
    }

    /// [`new`](Self::new) with FSDP units sharded by `zero`, any ZeRO
    /// stage's plan (stage 1's included, which has no FSDP strategy of its
    /// own), in place of the one exercise 12 gives `plan.data_axis`'s
    /// sharding: how the ledger's table measures every stage on one runtime.
    pub fn with_units_plan(
        model_config: &GptConfig,
        params: &ParamStore,
        config: TrainConfig,
        mesh: DeviceMesh,
        plan: MeshPlan,
        zero: ShardingPlan,
    ) -> Result<Self> {
        if !matches!(plan.data_axis, DataAxis::ShardBlocks { .. }) {
            bail!("a units' plan goes with FSDP units (DataAxis::ShardBlocks), not {:?}", plan.data_axis);
        }
        Self::build(model_config, params, config, mesh, plan, Some(zero))
    }

    fn build(
        model_config: &GptConfig,
        params: &ParamStore,
        config: TrainConfig,
        mesh: DeviceMesh,
        plan: MeshPlan,
        units_plan: Option<ShardingPlan>,
    ) -> Result<Self> {
        if config.grad_accum_steps == 0 {
            bail!("grad_accum_steps must be at least 1");
        }
        let MeshPlan { schedule, block_step, data_axis, bucket_bytes } = plan;
        let pg = mesh.pp();
        if block_step == BlockStep::SequenceParallel && mesh.shape().tp == 1 {
            bail!("sequence parallelism cuts the tokens across a tensor-parallel group: it needs a tp axis");
        }
        let (index, stages) = (pg.rank(), pg.world_size());
        let split = (mesh.shape().tp > 1).then(|| (mesh.tp_shared(), block_step));
        let mut scaler = None;
        let stage = match (split, data_axis) {
            (split, DataAxis::ShardBlocks { sharding, shard_group, precision, reduce_in_f32 }) => {
                let groups = param_groups(params, config.optimizer.weight_decay);
                let decay = ParamGroup::decay_by_name(&groups, params)?;
                let weight_decay_of = |name: &str| decay.get(name).copied().unwrap_or(0.0);
                // The learner's plan (exercise 12) and units (exercise 14).
                let plan = match units_plan {
                    Some(plan) => plan.validate().map(|()| plan)?,
                    None => fsdp_plan(sharding, shard_group)?,
                };
                let policy = fsdp_policy(precision, reduce_in_f32);
                scaler = policy.loss_scaling.then(LossScaler::default);
                let units = wrap_policy(model_config);
                check_units(model_config, &units)?;
                // Exercise 12's plan says whether the shards are replicated.
                let groups = shard_groups(&mesh, shard_group.filter(|_| plan.replicate_across_nodes))?;
                let fsdp = FsdpPlan { plan: &plan, policy: &policy, units: &units, weight_decay_of: &weight_decay_of };
                PipelineStage::sharded(model_config, params, (index, stages), groups, split, fsdp)?
            }
            (None, _) => PipelineStage::new(model_config, params, index, stages)?,
            (Some((tp, step)), _) => PipelineStage::split(model_config, params, index, stages, tp, step)?,
        };
        let stage = if config.activation_checkpointing { stage.with_activation_checkpointing()? } else { stage };
        let cuts = cuts_of(model_config, &stage);
        let update = Update::new(data_axis, (model_config, stage.params()), &config, &mesh, &cuts, bucket_bytes)?;
        let device = params.device()?;
        let model_config = model_config.clone();
        Ok(Self {
            model_config,
            stage,
            schedule,
            block_step,
            update,
            data_axis,
            config,
            mesh,
            cuts,
            device,
            counters: StepCounters::default(),
            scaler,
            last_step_sent: vec![],
            last_step_dp: CommStats::default(),
        })
    }

    /// Gathers each FSDP unit one unit early while one computes, in forward
    /// and in backward (PyTorch: `forward_prefetch` and
    /// `backward_prefetch=BACKWARD_PRE`); the numbers do not change, and two
    /// units are whole at once. Refused where the data axis holds no units
    /// (`--strategy fsdp`).
    pub fn with_prefetch(mut self) -> Result<Self> {
        self.stage = self.stage.with_prefetch()?;
        Ok(self)
    }

    /// Keeps AdamW's moments and the f32 master shards of this rank's FSDP
    /// units in a new file in `dir` between uses: the moments are read back
    /// by the step alone, a shard by its all-gather and the step (PyTorch:
    /// `CPUOffload`, here one level further down). The numbers do not
    /// change. Refused where the data axis holds no units (`--strategy fsdp`).
    pub fn with_offload(self, dir: &Path) -> Result<Self> {
        let Some(mut held) = self.stage.sharded_units() else {
            bail!(
                "offloading moves FSDP units' state to a file; this mesh's data axis holds no units (--strategy fsdp)"
            )
        };
        let file = OffloadFile::create(dir, self.mesh.world().rank())?;
        for unit in held.units.iter_mut() {
            unit.offload_to(&file)?;
        }
        drop(held);
        Ok(self)
    }

    /// Averages the replicas' matrix gradients as rank-`approx_rank`
    /// PowerSGD estimates (exercise 18), as
    /// [`Ddp::with_powersgd`](crate::parallel::ddp::Ddp::with_powersgd) does
    /// for a plain DDP run; refused where the data axis is not DDP.
    pub fn with_powersgd(mut self, approx_rank: usize) -> Result<Self> {
        self.update = self.update.with_powersgd(approx_rank)?;
        Ok(self)
    }

    /// The stage this rank runs.
    pub fn stage(&self) -> &PipelineStage {
        &self.stage
    }

    /// The stage's FSDP units, root first, and their groups, when the data
    /// axis holds units (`--strategy fsdp`).
    pub fn units(&self) -> Option<HeldUnits<'_>> {
        self.stage.sharded_units()
    }

    /// Replaces this rank's f32 state of unit `index`, in
    /// [`units`](Self::units)' order (see [`ShardedUnit::set_local_state`]).
    pub fn set_local_state(&mut self, index: usize, state: LocalState) -> Result<()> {
        let Some(mut held) = self.stage.sharded_units() else { bail!("this mesh's data axis holds no FSDP units") };
        let count = held.units.len();
        let Some(unit) = held.units.iter_mut().nth(index) else {
            bail!("there is no unit {index}: the stage has {count} units");
        };
        unit.set_local_state(state, held.shard)
    }

    /// Dynamic loss scaling, when the units' precision policy asks for it (fp16).
    pub fn loss_scaler(&mut self) -> Option<&mut LossScaler> {
        self.scaler.as_mut()
    }

    /// What this rank held and sent during the last step, as FSDP's ledger
    /// counts it: what it holds between steps and the units' peaks, and the
    /// collectives along dp; `None` for a whole replica, which shards nothing.
    pub fn ledger(&self) -> Option<StepLedger> {
        let memory = self.memory()?;
        let peaks = self.stage.peaks().unwrap_or_default();
        let memory =
            MemoryLedger { gathered_peak: peaks.gathered_peak, activations_peak: peaks.activations_peak, ..memory };
        Some(StepLedger { memory, comm: self.last_step_dp.clone() })
    }

    /// One step of this rank's stage over `micro_batches`: the schedule's,
    /// or with one stage each micro-batch forward and back in turn, its
    /// gradients handed to the data-parallel axis (ZeRO-2 reduces them at
    /// once; the others' are accumulated here).
    fn stage_step(&mut self, micro_batches: &[Tensor]) -> Result<PipelineStep> {
        let pg = self.mesh.pp();
        if pg.world_size() > 1 {
            // The schedule interleaves the micro-batches: an FSDP root stays gathered for all of them.
            self.stage.gather_root()?;
            let mut step = self.schedule.step(pg, &self.stage, micro_batches)?;
            self.stage.reshard_root(Some(&mut step.grads))?;
            return Ok(step);
        }
        if micro_batches.is_empty() {
            bail!("train_step needs at least one micro-batch");
        }
        // Each micro-batch's loss weighs 1/M in the step's.
        let weight = Tensor::new(1.0 / micro_batches.len() as f32, &self.device)?;
        let (mut grads, mut loss) = (Gradients::default(), 0.0);
        for tokens in micro_batches {
            // An FSDP root is gathered for one micro-batch at a time, as FSDP's
            // own trainer does: its gradient is reduce-scattered at once, not
            // summed whole over the step.
            self.stage.gather_root()?;
            let output = self.stage.forward(tokens, tokens)?;
            loss += output.to_dtype(DType::F32)?.to_scalar::<f32>()?;
            let mut micro_batch = self.stage.gradients(&self.stage.backward(&output, &weight)?)?;
            self.stage.reshard_root(Some(&mut micro_batch))?;
            if let Some(kept) = self.update.take_micro_batch(micro_batch, &self.device)? {
                grads.accumulate(&kept)?;
            }
        }
        Ok(PipelineStep { loss: Some(loss / micro_batches.len() as f32), grads })
    }

    /// The loss of `tokens` with no backward: the stages in turn, each
    /// forward once, the last stage's loss broadcast to all.
    fn stage_forward(&self, tokens: &Tensor) -> Result<f64> {
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

    /// What the dp group and the groups split out of it have sent.
    fn dp_stats(&self) -> CommStats {
        [self.mesh.dp().stats(), self.split_dp_stats()].into_iter().sum()
    }

    /// What the groups split out of the dp group have sent: under
    /// HYBRID_SHARD the units' shard and replica groups; nothing otherwise,
    /// where the units run on the dp group itself.
    fn split_dp_stats(&self) -> CommStats {
        let Some(held) = self.stage.sharded_units() else { return CommStats::default() };
        let Some(replicas) = held.replicas else { return CommStats::default() };
        [held.shard, replicas].into_iter().map(|group| group.stats()).sum()
    }

    /// What this rank holds between steps: its stage's parameters with
    /// their gradients (f32; a shard under ZeRO-2) and AdamW's moments of
    /// them (a shard under ZeRO-1 and 2), and its FSDP units' parts (see
    /// [`ShardedUnit::held_memory`]); `None` for a whole replica.
    fn memory(&self) -> Option<MemoryLedger> {
        let whole_replica = self.mesh.shape().pp == 1 && self.mesh.shape().tp == 1;
        if whole_replica && matches!(self.data_axis, DataAxis::Replicate | DataAxis::YourDdp) {
            return None;
        }
        let held: u64 = self.stage.params().iter().map(|(_, var)| var.elem_count() as u64).sum();
        let units = self
            .stage
            .sharded_units()
            .map_or_else(MemoryLedger::default, |held| held.units.iter().map(ShardedUnit::held_memory).sum());
        let f32_bytes = |elements: u64| 4 * elements;
        Some(MemoryLedger {
            params: f32_bytes(held) + units.params,
            grads: f32_bytes(self.update.grad_elements(held)) + units.grads,
            optimizer_state: f32_bytes(self.update.moment_elements(held)) + units.optimizer_state,
            ..units
        })
    }
}

/// Where each of `stage`'s parameters was cut across its tp group: those it
/// holds as variables, and those its FSDP units hold.
fn cuts_of(config: &GptConfig, stage: &PipelineStage) -> ShardCuts {
    let mut shapes: Vec<(String, Vec<usize>)> =
        stage.params().iter().map(|(name, var)| (name.to_string(), var.dims().to_vec())).collect();
    if let Some(held) = stage.sharded_units() {
        for unit in held.units.iter() {
            let layout = unit.layout();
            shapes.extend(
                layout.names().zip(layout.shapes()).map(|(name, shape)| (name.to_string(), shape.dims().to_vec())),
            );
        }
    }
    ShardCuts::of_shapes(config, shapes.iter().map(|(name, dims)| (name.as_str(), dims.as_slice())))
}

/// Exercise 12's plan of `sharding`; `shard_group` gives HYBRID_SHARD's
/// groups and goes with it only.
fn fsdp_plan(sharding: ShardingStrategy, shard_group: Option<usize>) -> Result<ShardingPlan> {
    if (sharding == ShardingStrategy::HybridShard) != shard_group.is_some() {
        bail!(
            "a shard group size goes with HYBRID_SHARD, and HYBRID_SHARD needs one; got {sharding} and {shard_group:?}"
        );
    }
    let plan = sharding_plan(sharding);
    plan.validate()?;
    Ok(plan)
}

/// The dtypes FSDP's units on a mesh use: exercise 13's policy for
/// `precision`, reducing in f32 too where `reduce_in_f32`.
fn fsdp_policy(precision: Precision, reduce_in_f32: bool) -> MixedPrecisionPolicy {
    let policy = mixed_precision_policy(precision);
    if reduce_in_f32 {
        policy.reducing_in_f32()
    } else {
        policy
    }
}

/// The groups a stage's FSDP units live on: the shard group and, under
/// HYBRID_SHARD (groups of `shard_group` consecutive replicas), the group of
/// ranks holding the same shards in the other groups.
fn shard_groups(mesh: &DeviceMesh, shard_group: Option<usize>) -> Result<(SharedGroup, Option<SharedGroup>)> {
    let Some(size) = shard_group else { return Ok((mesh.dp_shared(), None)) };
    let (rank, replicas) = (mesh.dp().rank(), mesh.dp().world_size());
    if size == 0 || !replicas.is_multiple_of(size) {
        bail!("the {replicas} data-parallel replicas do not split into shard groups of {size}: use a size that divides {replicas}");
    }
    // Every rank splits in the same order: first its shard group, then its replica group.
    let shard = SharedGroup::new(mesh.dp().split(rank / size)?);
    let across = SharedGroup::new(mesh.dp().split(rank % size)?);
    Ok((shard, Some(across)))
}

impl Train for MeshTrainer {
    fn train_step(&mut self, micro_batches: &[Tensor]) -> Result<StepStats> {
        let dp_before = self.dp_stats();
        let sent_before = report::sent_by_axis(&self.mesh, &dp_before);
        self.stage.reset_peaks();
        let last = self.mesh.pp().world_size() - 1;
        if let Some(scaler) = &self.scaler {
            self.stage.set_loss_scale(scaler.scale);
        }
        let step = match self.update.run_micro_batches(micro_batches)? {
            Some(step) => step,
            None => self.stage_step(micro_batches)?,
        };
        let lr = self.config.schedule.lr(self.counters.step);
        let loss_scale = self.scaler.map_or(1.0, |scaler| scaler.scale);
        let settle = |grad_norm| self.counters.settle(grad_norm, self.config.max_grad_norm, self.scaler.as_mut());
        let parts = (&self.mesh, &self.cuts);
        let grad_norm = self.update.step(parts, &self.stage, step.grads, (lr, loss_scale, settle), &self.device)?;
        let loss = Tensor::new(&[step.loss.unwrap_or(0.0)], &self.device)?;
        let loss = self.mesh.pp().broadcast(&loss, last)?.to_vec1::<f32>()?[0] as f64;
        let dp_after = self.dp_stats();
        let sent_after = report::sent_by_axis(&self.mesh, &dp_after);
        self.last_step_sent =
            sent_after.into_iter().zip(&sent_before).map(|((axis, now), (_, then))| (axis, now.since(then))).collect();
        self.last_step_dp = dp_after.since(&dp_before);
        if self.stage.sharded_units().is_some() {
            // Gathered units come and go each step: their pages go back.
            crate::memory::release_freed_memory();
        }
        Ok(StepStats { loss, grad_norm, lr, tokens: micro_batches.iter().map(Tensor::elem_count).sum() })
    }

    /// Every stage of the first replica hands on its parameters and
    /// moments whole, rank 0 writes them (see `checkpoint.rs`).
    fn save_checkpoint(&self, dir: &Path, data: Option<DataPosition>) -> Result<()> {
        self.write_checkpoint(dir, data)
    }

    /// Each rank reads its stage's part back (see `checkpoint.rs`).
    fn load_checkpoint(&mut self, dir: &Path) -> Result<Option<DataPosition>> {
        self.read_checkpoint(dir)
    }

    /// The stages in turn, each forward once: the last stage's loss goes to
    /// all. Under FSDP each stage's root is gathered for it.
    fn eval_loss(&mut self, tokens: &Tensor) -> Result<f64> {
        self.stage.gather_root()?;
        let loss = self.stage_forward(tokens);
        self.stage.reshard_root(None)?;
        loss
    }
    fn counters(&self) -> StepCounters {
        self.counters
    }

    fn process_group(&self) -> &dyn ProcessGroup {
        self.mesh.world()
    }

    fn mesh(&self) -> Option<&DeviceMesh> {
        Some(&self.mesh)
    }

    fn comm_stats(&self) -> CommStats {
        [self.mesh.stats(), self.split_dp_stats()].into_iter().sum()
    }

    fn layout(&self) -> String {
        let (stages, replicas, tp) = (self.mesh.shape().pp, self.mesh.shape().dp, self.mesh.shape().tp);
        let model = match stages {
            1 => "the whole model on every rank".to_string(),
            _ => format!("a {} pipeline of {stages} stages", self.schedule),
        };
        let sequence = match self.block_step {
            BlockStep::SequenceParallel => " (norms and residuals cut along the sequence)",
            BlockStep::TensorParallel => "",
        };
        let split = match (tp, stages) {
            (1, 1) => String::new(),
            (1, _) => ", one per rank".to_string(),
            (_, 1) => {
                format!(", every block split across {tp} tensor-parallel ranks{sequence}, the root whole on each")
            }
            _ => format!(", each stage's blocks split across {tp} tensor-parallel ranks{sequence}"),
        };
        let replicas = match (replicas, self.data_axis) {
            (1, _) => String::new(),
            (_, DataAxis::Replicate) => format!(", in {replicas} data-parallel replicas"),
            (_, DataAxis::ShardOptimizer) => {
                format!(", in {replicas} data-parallel replicas, AdamW's state sharded across them (ZeRO-1)")
            }
            (_, DataAxis::ShardGradients) => format!(
                ", in {replicas} data-parallel replicas, AdamW's state and the gradients sharded across them (ZeRO-2)"
            ),
            (_, DataAxis::YourDdp) => format!(", in {replicas} data-parallel replicas under exercise 26's DDP"),
            (_, DataAxis::ShardBlocks { shard_group: Some(size), precision, .. }) => format!(
                ", in {replicas} data-parallel replicas, each block and the root an FSDP unit sharded across groups \
                 of {size} of them (HYBRID_SHARD), {precision}"
            ),
            (_, DataAxis::ShardBlocks { sharding, precision, .. }) => format!(
                ", in {replicas} data-parallel replicas, each block and the root an FSDP unit across them \
                 ({sharding}), {precision}"
            ),
        };
        format!("{model}{split}{replicas}")
    }

    fn model_states_bytes(&self) -> Option<u64> {
        self.memory().map(|memory| memory.model_states())
    }

    fn report(&self) -> Option<String> {
        let report = report::MeshReport {
            shape: self.mesh.shape().to_string(),
            memory: self.memory(),
            peaks: self.stage.peaks(),
            last_step: self.last_step_sent.clone(),
        };
        Some(report.to_string())
    }
}
