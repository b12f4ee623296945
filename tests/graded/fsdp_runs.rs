//! Shared by the Phase 3 tests: a small model, its data, and the same
//! training run done by one process (the reference) and by FSDP ranks.
//!
//! The reference is Phase 2's single-process `Trainer`, itself checked against
//! PyTorch (exercise 10's fixture): FSDP must reach the parameters it reaches.

use std::collections::{BTreeMap, HashMap};

use candle_core::{DType, Device, Tensor};
use workbook::distributed::{spawn, DeviceMesh, ProcessGroup};
use workbook::parallel::ddp::Ddp;
use workbook::parallel::fsdp::{Precision, ShardingStrategy, StepLedger};
use workbook::parallel::pipeline::HeldUnits;
use workbook::parallel::{DataAxis, MeshPlan, MeshTrainer};
use workbook::train::{
    AdamWConfig, CosineSchedule, LrSchedule, OptimizerConfig, StepStats, Train, TrainConfig, Trainer,
};
use workbook::{init_params, GptConfig, InitRng};

use crate::support::{l2_norm, ok};

/// Rows of each micro-batch: divides across 1, 2 and 4 ranks.
pub const GLOBAL_BATCH: usize = 4;
pub const SEQ_LEN: usize = 16;

pub fn model_config() -> GptConfig {
    GptConfig {
        vocab_size: 64,
        hidden_size: 32,
        num_layers: 2,
        num_heads: 4,
        num_kv_heads: None,
        intermediate_size: 64,
        max_seq_len: SEQ_LEN,
        rope_theta: 10_000.0,
        norm_eps: 1e-5,
        bias: false,
        tie_word_embeddings: false,
    }
}

/// Two micro-batches per step, clipping that bites, weight decay on.
pub fn train_config(max_grad_norm: f64) -> TrainConfig {
    TrainConfig {
        grad_accum_steps: 2,
        max_grad_norm,
        schedule: LrSchedule::Cosine(CosineSchedule { max_lr: 1e-2, min_lr: 1e-3, warmup_steps: 1, max_steps: 10 }),
        optimizer: OptimizerConfig { weight_decay: 0.1, adamw: AdamWConfig::default() },
        activation_checkpointing: false,
    }
}

/// The global micro-batches of step `step`: (GLOBAL_BATCH, SEQ_LEN) token ids.
pub fn global_batches(step: usize) -> Vec<Tensor> {
    let mut rng = InitRng::from_seed(1000 + step as u64);
    (0..2)
        .map(|_| {
            let noise = rng.normal(&(GLOBAL_BATCH, SEQ_LEN).into(), 1.0, &Device::Cpu).unwrap();
            // Token ids from normal noise: deterministic and spread over the vocabulary.
            let ids = ((noise.abs().unwrap() * 20.0).unwrap().floor().unwrap()).clamp(0.0, 63.0).unwrap();
            ids.to_dtype(DType::U32).unwrap()
        })
        .collect()
}

/// Rank `rank`'s rows of a global micro-batch.
pub fn rows_of(batch: &Tensor, rank: usize, world_size: usize) -> Tensor {
    let rows = GLOBAL_BATCH / world_size;
    batch.narrow(0, rank * rows, rows).unwrap()
}

/// One process's trainer after `steps` steps on the global batches.
pub fn single_process_trainer(steps: usize, max_grad_norm: f64) -> Trainer {
    single_process_run(steps, max_grad_norm).0
}

/// One process's gradient norm (before clipping) at each of `steps` steps
/// (the multi-GPU checks compare theirs with it).
#[cfg(feature = "nccl")]
pub fn single_process_norms(steps: usize, max_grad_norm: f64) -> Vec<f64> {
    single_process_run(steps, max_grad_norm).1
}

/// One process's trainer after `steps` steps, and each step's gradient norm.
fn single_process_run(steps: usize, max_grad_norm: f64) -> (Trainer, Vec<f64>) {
    let params = init_params(&model_config(), 7, &Device::Cpu).unwrap();
    let mut trainer =
        ok(Trainer::new(&model_config(), params, train_config(max_grad_norm), Ddp::single()), "Trainer::new");
    let norms = (0..steps).map(|s| ok(trainer.train_step(&global_batches(s)), "Trainer::train_step").grad_norm);
    let norms = norms.collect();
    (trainer, norms)
}

/// Parameters after `steps` steps of one process on the global batches.
pub fn single_process(steps: usize, max_grad_norm: f64) -> HashMap<String, Tensor> {
    let trainer = single_process_trainer(steps, max_grad_norm);
    trainer.params.iter().map(|(n, v)| (n.to_string(), v.as_tensor().clone())).collect()
}

/// FSDP's units on every rank, sharded as `sharding` says, in `precision`:
/// `--strategy fsdp --sharding … --precision …`.
pub fn fsdp(sharding: ShardingStrategy, precision: Precision) -> DataAxis {
    DataAxis::ShardBlocks { sharding, shard_group: None, precision, reduce_in_f32: false }
}

/// A fresh FSDP trainer on `pg` (the replicas of one data-parallel axis,
/// sharing each step as `fsdp` says), from the same initial parameters as
/// [`single_process`].
pub fn fsdp_trainer(pg: Box<dyn ProcessGroup>, fsdp: DataAxis, config: TrainConfig) -> MeshTrainer {
    fsdp_trainer_on(pg, fsdp, config, &Device::Cpu)
}

/// [`fsdp_trainer`] with its parameters on `device`, the one `pg`'s tensors live on.
pub fn fsdp_trainer_on(pg: Box<dyn ProcessGroup>, fsdp: DataAxis, config: TrainConfig, device: &Device) -> MeshTrainer {
    let params = init_params(&model_config(), 7, device).unwrap();
    let mesh = DeviceMesh::data_parallel(pg);
    ok(MeshTrainer::new(&model_config(), &params, config, mesh, MeshPlan::replicas(fsdp)), "MeshTrainer::new")
}

/// The trainer's FSDP units, root first, with the group they are sharded over.
pub fn units(trainer: &MeshTrainer) -> HeldUnits<'_> {
    trainer.units().expect("an FSDP trainer holds units")
}

/// The trainer's ledger of its last step.
pub fn last_ledger(trainer: &MeshTrainer) -> StepLedger {
    trainer.ledger().expect("an FSDP trainer keeps a ledger")
}

/// One step of `trainer` on its rows of step `step`'s global batches.
pub fn fsdp_step(trainer: &mut MeshTrainer, step: usize) -> StepStats {
    let (rank, world) = (trainer.process_group().rank(), trainer.process_group().world_size());
    let device = units(trainer).units.iter().next().expect("a unit").device().clone();
    let mine: Vec<Tensor> =
        global_batches(step).iter().map(|b| rows_of(b, rank, world).to_device(&device).unwrap()).collect();
    ok(trainer.train_step(&mine), "MeshTrainer::train_step")
}

/// The whole parameters a trainer holds, put together from every rank's shard
/// (read directly from the units, so this does not depend on exercise 15).
pub fn gather_params(trainer: &MeshTrainer) -> HashMap<String, Tensor> {
    let held = units(trainer);
    let mut out = HashMap::new();
    for unit in held.units.iter() {
        let local = unit.local_state().unwrap().params;
        let whole = if unit.is_sharded() { held.shard.all_gather(&local).unwrap() } else { local };
        out.extend(unit.layout.unflatten(&whole).unwrap());
    }
    out
}

/// Rank 0's gathered parameters after `steps` FSDP steps on `world_size` CPU ranks,
/// with every rank's ledger of its last step.
pub fn fsdp_run(
    world_size: usize,
    strategy: ShardingStrategy,
    precision: Precision,
    config: TrainConfig,
    steps: usize,
) -> (HashMap<String, Tensor>, Vec<MeshTrainer>) {
    let fsdp = fsdp(strategy, precision);
    let mut results =
        ok(spawn(world_size, |pg| Ok(fsdp_rank(Box::new(pg), fsdp, config, steps, &Device::Cpu))), "the FSDP ranks");
    let params = results[0].0.clone();
    (params, results.drain(..).map(|(_, t)| t).collect())
}

/// One FSDP rank's part of [`fsdp_run`], on `device`: the whole parameters
/// after `steps` steps, and its trainer.
pub fn fsdp_rank(
    pg: Box<dyn ProcessGroup>,
    fsdp: DataAxis,
    config: TrainConfig,
    steps: usize,
    device: &Device,
) -> (HashMap<String, Tensor>, MeshTrainer) {
    let mut trainer = fsdp_trainer_on(pg, fsdp, config, device);
    for s in 0..steps {
        fsdp_step(&mut trainer, s);
    }
    (gather_params(&trainer), trainer)
}

/// The largest relative L2 difference of any parameter between two runs.
pub fn max_relative_difference(got: &HashMap<String, Tensor>, want: &HashMap<String, Tensor>) -> (f64, String) {
    let mut worst = (0.0, String::new());
    for (name, w) in want {
        let g = got.get(name).unwrap_or_else(|| panic!("no parameter `{name}`"));
        let diff = (g.to_dtype(DType::F32).unwrap() - w.to_dtype(DType::F32).unwrap()).unwrap();
        let rel = l2_norm(&diff) / l2_norm(w).max(1e-12);
        if rel > worst.0 {
            worst = (rel, name.clone());
        }
    }
    worst
}

/// Rank 0's parameters after `steps` steps of Phase 2's DDP trainer on `world_size` CPU ranks.
pub fn ddp_run(world_size: usize, config: TrainConfig, steps: usize) -> HashMap<String, Tensor> {
    let mut results = ok(spawn(world_size, |pg| ddp_rank(Box::new(pg), config, steps, &Device::Cpu)), "the DDP ranks");
    results.swap_remove(0)
}

/// One DDP rank's part of [`ddp_run`], on `device`: its parameters after `steps` steps.
pub fn ddp_rank(
    pg: Box<dyn ProcessGroup>,
    config: TrainConfig,
    steps: usize,
    device: &Device,
) -> candle_core::Result<HashMap<String, Tensor>> {
    ddp_rank_with_norms(pg, config, steps, device).map(|(params, _)| params)
}

/// [`ddp_rank`], with the gradient norm (before clipping) of each step: the
/// norm of the averaged gradients, which Adam's scale-free update hides.
pub fn ddp_rank_with_norms(
    pg: Box<dyn ProcessGroup>,
    config: TrainConfig,
    steps: usize,
    device: &Device,
) -> candle_core::Result<(HashMap<String, Tensor>, Vec<f64>)> {
    let world_size = pg.world_size();
    let params = init_params(&model_config(), 7, device)?;
    let mut trainer = Trainer::new(&model_config(), params, config, Ddp::new(pg))?;
    let mut norms = vec![];
    for s in 0..steps {
        let global = global_batches(s);
        let mine = global.iter().map(|b| rows_of(b, trainer.ddp.rank(), world_size).to_device(device));
        let mine = mine.collect::<candle_core::Result<Vec<Tensor>>>()?;
        norms.push(trainer.train_step(&mine)?.grad_norm);
    }
    Ok((trainer.params.iter().map(|(n, v)| (n.to_string(), v.as_tensor().clone())).collect(), norms))
}

/// Named tensors (parameters, gradients) as plain numbers, to compare or to
/// send from a rank's process to the test.
pub fn as_values<'a, N: AsRef<str>>(named: impl IntoIterator<Item = (N, &'a Tensor)>) -> BTreeMap<String, Vec<f32>> {
    let values = |t: &Tensor| t.flatten_all().and_then(|t| t.to_dtype(DType::F32)).and_then(|t| t.to_vec1());
    named.into_iter().map(|(name, t)| (name.as_ref().to_string(), values(t).unwrap())).collect()
}
