//! Phase 4's whole-phase checks, run once exercises 16-27 pass: training
//! steps built from your own pieces, every rank a process of its own (the
//! process backend over TCP, see `process_ranks.rs`), reach the parameters
//! one process reaches with the runtime's AdamW.
//!
//! - Data parallel: each rank's gradients averaged by your buckets
//!   (exercise 19) over your ring all-reduce (exercise 16), the update taken
//!   by your sharded AdamW (exercise 17); and your own data-parallel type
//!   (exercise 26) over your ring, every rank starting from parameters of
//!   its own, the runtime's AdamW stepping the parameters it trains.
//! - Pipeline parallel: your GPipe step (exercise 21) and your 1F1B step
//!   (exercise 24) on two stages, each stage updating its own parameters;
//!   and the GPipe pipeline replicated on a mesh of 2 × 2 processes, each
//!   replica on its half of the batch, each stage's gradients averaged with
//!   the other replica's same stage.
//! - Fully sharded: the blocks as FSDP units stepped by your exercise 22,
//!   each rank updating only its shards.
//! - Tensor parallel: the workbook's tensor-parallel trainer on a mesh of
//!   2 replicas × 2 ranks, every block split across a replica's ranks and
//!   run by your exercise 23, each rank updating only its shards.
//!
//! In the last two the model's root (embedding, final norm, head) stays
//! whole on every rank, as the FSDP trainer keeps its root unit.

use std::collections::{BTreeMap, HashMap};

use candle_core::{bail, Device, Module, Result, Tensor, Var};
use rstest::rstest;
use workbook::autograd::{vjp, Gradients};
use workbook::distributed::{DeviceMesh, MeshShape, OwnRing, ProcessGroup, ReduceOp, WithOverride};
use workbook::model::{layer_of, Outer, ParamStore};
use workbook::parallel::ddp::average_in_buckets;
use workbook::parallel::fsdp::FlatLayout;
use workbook::parallel::fsdp_unit::BlockUnit;
use workbook::parallel::pipeline::{PipelineSchedule, PipelineStage};
use workbook::parallel::tensor::{BlockStep, TensorParallelBlock};
use workbook::parallel::zero::ShardedAdamW;
use workbook::parallel::{DataAxis, MeshPlan, MeshTrainer};
use workbook::phase1_model::next_token_loss;
use workbook::phase4_under_the_hood::{fsdp_backward, fsdp_forward, overlapped_all_reduce, DataParallel};
use workbook::train::{AdamW, AdamWConfig, ParamGroup, Train};
use workbook::{init_params, Gpt};

use crate::all_reduce_log::{AllReduceLog, Event};
use crate::fsdp_runs::{
    as_values, global_batches, max_relative_difference, model_config, rows_of, single_process, train_config,
    GLOBAL_BATCH, SEQ_LEN,
};
use crate::process_ranks::on_processes;

const STEPS: usize = 3;
const LR: f64 = 1e-2;
/// Clipping that bites on this model, where a run clips as the trainer does.
const CLIP: f64 = 0.5;
const WEIGHT_DECAY: f64 = 0.1;
/// Small enough that the model's gradients fill several buckets.
const BUCKET_BYTES: usize = 16 * 1024;

type Values = BTreeMap<String, Vec<f32>>;

fn values(params: &ParamStore) -> Values {
    as_values(params.iter().map(|(name, var)| (name, var.as_tensor())))
}

/// The mean over `micro_batches` of the loss's gradients, through the whole model.
fn mean_gradients(params: &ParamStore, micro_batches: &[Tensor]) -> Result<Gradients> {
    let model = Gpt::new(&model_config(), params)?;
    let mut grads = Gradients::default();
    for tokens in micro_batches {
        grads.accumulate(&Gradients::from_store(params, &model.forward(tokens, Some(tokens))?.backward()?)?)?;
    }
    grads.scale(1.0 / micro_batches.len() as f64)?;
    Ok(grads)
}

/// AdamW with every parameter decayed, as the sharded AdamW of exercise 17 does.
fn adamw(params: &ParamStore) -> Result<AdamW> {
    let names = params.iter().map(|(name, _)| name.to_string()).collect();
    AdamW::new(vec![ParamGroup { names, weight_decay: WEIGHT_DECAY }], AdamWConfig::default())
}

/// One process: the whole global batch, the runtime's AdamW.
fn one_process() -> ParamStore {
    let params = init_params(&model_config(), 7, &Device::Cpu).unwrap();
    let mut optimizer = adamw(&params).unwrap();
    for step in 0..STEPS {
        let grads = mean_gradients(&params, &global_batches(step)).unwrap();
        optimizer.step(&params, &grads, LR).unwrap();
    }
    params
}

/// One data-parallel rank: its rows, your buckets over your ring, your sharded AdamW.
fn data_parallel_rank(pg: Box<dyn ProcessGroup>) -> Result<Values> {
    let pg = OwnRing::around(pg);
    let params = init_params(&model_config(), 7, &Device::Cpu)?;
    let mut optimizer = ShardedAdamW::new(AdamWConfig::default(), WEIGHT_DECAY);
    // One buffer in name order; the sharded AdamW pads it for the ranks itself.
    let names: Vec<String> = params.iter().map(|(name, _)| name.to_string()).collect();
    let layout = FlatLayout::new(&model_config(), &names, 1)?;
    for step in 0..STEPS {
        let mine: Vec<Tensor> = global_batches(step).iter().map(|b| rows_of(b, pg.rank(), pg.world_size())).collect();
        let grads = mean_gradients(&params, &mine)?;
        // Backward yields the last layers' gradients first.
        let mut backward_order: Vec<(String, Tensor)> = grads.iter().map(|(n, g)| (n.to_string(), g.clone())).collect();
        backward_order.reverse();
        let averaged: HashMap<String, Tensor> =
            overlapped_all_reduce(&pg, backward_order.into_iter(), BUCKET_BYTES)?.into_iter().collect();
        let current: HashMap<String, Tensor> =
            params.iter().map(|(name, var)| (name.to_string(), var.as_tensor().clone())).collect();
        let flat = |tensors| layout.flatten(tensors, &Device::Cpu);
        let updated = optimizer.step(&pg, &flat(&current)?, &flat(&averaged)?, LR)?;
        for (name, tensor) in layout.unflatten(&updated)? {
            params.get(&name)?.set(&tensor)?;
        }
    }
    Ok(values(&params))
}

/// One data-parallel rank of your own DDP over your ring: its rows of each
/// global batch as a micro-batch, the runtime's AdamW on the averaged
/// gradients. Every rank draws parameters of its own: the wrapper's start
/// makes them rank 0's.
fn your_ddp_rank(pg: Box<dyn ProcessGroup>) -> Result<Values> {
    let (rank, world) = (pg.rank(), pg.world_size());
    let params = init_params(&model_config(), 7 + rank as u64, &Device::Cpu)?;
    let mut ddp = DataParallel::new(&model_config(), params.clone(), Box::new(OwnRing::around(pg)), BUCKET_BYTES)?;
    let mut optimizer = adamw(&params)?;
    for step in 0..STEPS {
        let mine: Vec<Tensor> = global_batches(step).iter().map(|b| rows_of(b, rank, world)).collect();
        for (i, micro_batch) in mine.iter().enumerate() {
            ddp.forward_backward(micro_batch, i + 1 == mine.len())?;
        }
        let mut grads = ddp.take_gradients()?;
        grads.scale(1.0 / mine.len() as f64)?;
        optimizer.step(&params, &grads, LR)?;
    }
    Ok(values(&params))
}

/// One pipeline stage: your step on `schedule` over the whole batch, AdamW on the stage's parameters.
fn pipeline_stage(pg: Box<dyn ProcessGroup>, schedule: PipelineSchedule) -> Result<Values> {
    let params = init_params(&model_config(), 7, &Device::Cpu)?;
    let stage = PipelineStage::new(&model_config(), &params, pg.rank(), pg.world_size())?;
    let mut optimizer = adamw(stage.params())?;
    for step in 0..STEPS {
        let grads = schedule.step(pg.as_ref(), &stage, &global_batches(step))?.grads;
        optimizer.step(stage.params(), &grads, LR)?;
    }
    Ok(values(stage.params()))
}

/// One stage of one replica of a pipeline on a (dp 2, pp 2) mesh: your
/// GPipe step over the replica's rows, the gradients averaged over the
/// stage's data-parallel group, AdamW on the stage's parameters.
fn replicated_pipeline_stage(pg: Box<dyn ProcessGroup>) -> Result<Values> {
    let mesh = DeviceMesh::new(pg, MeshShape { dp: 2, pp: 2, tp: 1 })?;
    let params = init_params(&model_config(), 7, &Device::Cpu)?;
    let (pp, replica) = (mesh.pp(), mesh.coords().dp);
    let stage = PipelineStage::new(&model_config(), &params, pp.rank(), pp.world_size())?;
    let mut optimizer = adamw(stage.params())?;
    for step in 0..STEPS {
        let rows: Vec<Tensor> = global_batches(step).iter().map(|b| rows_of(b, replica, 2)).collect();
        let mut grads = PipelineSchedule::GPipe.step(pp, &stage, &rows)?.grads;
        average_in_buckets(mesh.dp(), &mut grads, BUCKET_BYTES)?;
        optimizer.step(stage.params(), &grads, LR)?;
    }
    Ok(values(stage.params()))
}

/// The model's root, whole on every rank: the parameters outside the blocks.
struct Root {
    params: ParamStore,
    outer: Outer,
}

impl Root {
    fn of(whole: &ParamStore) -> Result<Self> {
        let params = ParamStore::from_tensors(
            whole.iter().filter(|(name, _)| layer_of(name).is_none()).map(|(n, v)| (n, v.as_tensor().clone())),
        )?;
        let outer = Outer::new(&model_config(), &params)?;
        Ok(Self { params, outer })
    }

    /// The blocks' input for `tokens`, with its graph back to the embedding.
    fn embed(&self, tokens: &Tensor) -> Result<Tensor> {
        self.outer.embed_tokens.forward(tokens)
    }

    /// Back-propagates the loss from the blocks' output `top`: the gradients
    /// of the final norm and the head, and ∂L/∂top.
    fn head_backward(&self, top: &Tensor, tokens: &Tensor) -> Result<(Gradients, Tensor)> {
        let top = Var::from_tensor(&top.detach())?;
        let logits = self.outer.lm_head.forward(&self.outer.norm.forward(top.as_tensor())?)?;
        let grads = next_token_loss(&logits, tokens)?.backward()?;
        let Some(grad_top) = grads.get(top.as_tensor()).cloned() else { bail!("the loss did not read the blocks") };
        Ok((Gradients::from_store(&self.params, &grads)?, grad_top))
    }

    /// The embedding's gradient from ∂L/∂x, `x` being what [`Root::embed`] gave.
    fn embedding_backward(&self, embedded: &Tensor, grad_x: &Tensor) -> Result<Gradients> {
        Gradients::from_store(&self.params, &vjp(embedded, grad_x)?)
    }
}

/// The name under which the optimizer keeps unit `layer`'s shard.
fn shard_name(layer: usize) -> String {
    format!("unit{layer}.shard")
}

/// One FSDP rank: its rows, the blocks as units stepped by your exercise 22,
/// the root's gradient averaged over the ranks, AdamW on the root and on this
/// rank's shards only.
fn fsdp_rank(pg: Box<dyn ProcessGroup>) -> Result<Values> {
    let (rank, world) = (pg.rank(), pg.world_size());
    let whole = init_params(&model_config(), 7, &Device::Cpu)?;
    let root = Root::of(&whole)?;
    let mut units = BlockUnit::shard_blocks(&model_config(), &whole, rank, world)?;
    drop(whole);
    let shards = units.iter().map(|u| Ok((shard_name(u.layer()), u.shard()?))).collect::<Result<Vec<_>>>()?;
    let shards = ParamStore::from_tensors(shards)?;
    let (mut root_optimizer, mut shard_optimizer) = (adamw(&root.params)?, adamw(&shards)?);
    for step in 0..STEPS {
        let batches = global_batches(step);
        let mut root_grads = Gradients::default();
        for batch in &batches {
            let tokens = rows_of(batch, rank, world);
            let embedded = root.embed(&tokens)?;
            let forward = fsdp_forward(pg.as_ref(), &mut units, &embedded)?;
            let (head, grad_top) = root.head_backward(&forward.output, &tokens)?;
            let grad_x = fsdp_backward(pg.as_ref(), &mut units, &forward.inputs, &grad_top)?;
            root_grads.accumulate(&head)?;
            root_grads.accumulate(&root.embedding_backward(&embedded, &grad_x)?)?;
        }
        let micro_batches = batches.len() as f64;
        let mut averaged = Gradients::default();
        for (name, grad) in root_grads.iter() {
            averaged.insert(name, (pg.all_reduce(grad, ReduceOp::Avg)? / micro_batches)?);
        }
        root_optimizer.step(&root.params, &averaged, LR)?;
        let mut shard_grads = Gradients::default();
        for unit in units.iter_mut() {
            let Some(grad) = unit.take_grad() else { bail!("unit {} has no gradient after backward", unit.layer()) };
            shard_grads.insert(&shard_name(unit.layer()), (grad / micro_batches)?);
        }
        shard_optimizer.step(&shards, &shard_grads, LR)?;
        for unit in units.iter_mut() {
            unit.set_shard(shards.get(&shard_name(unit.layer()))?.as_tensor())?;
        }
    }
    let mut held = values(&root.params);
    for unit in &units {
        let whole = pg.all_gather(&unit.shard()?)?;
        held.extend(as_values(unit.layout().unflatten(&whole)?.iter().map(|(n, t)| (n.as_str(), t))));
    }
    Ok(held)
}

/// One rank of a (dp 2, tp 2) mesh: the workbook's mesh trainer, whose
/// blocks your exercise 23 runs (its MLP your exercise 20's), or 27, on its
/// replica's rows of each micro-batch.
fn tensor_parallel_rank(pg: Box<dyn ProcessGroup>, block_step: BlockStep) -> Result<Values> {
    let mesh = DeviceMesh::new(pg, MeshShape { dp: 2, pp: 1, tp: 2 })?;
    let replica = mesh.coords().dp;
    let params = init_params(&model_config(), 7, &Device::Cpu)?;
    let (config, schedule) = (train_config(CLIP), PipelineSchedule::GPipe);
    let plan = MeshPlan { schedule, block_step, data_axis: DataAxis::Replicate, bucket_bytes: BUCKET_BYTES };
    let mut trainer = MeshTrainer::new(&model_config(), &params, config, mesh, plan)?;
    for step in 0..STEPS {
        let rows: Vec<Tensor> = global_batches(step).iter().map(|b| rows_of(b, replica, 2)).collect();
        trainer.train_step(&rows)?;
    }
    Ok(values(trainer.stage().params()))
}

/// One rank of a (dp 2, pp 2, tp 2) mesh: the workbook's mesh trainer,
/// your 1F1B schedule (exercise 24) over stages whose blocks your exercise 23
/// runs, or 27, on its replica's rows of each micro-batch.
fn three_dimensional_rank(pg: Box<dyn ProcessGroup>, block_step: BlockStep) -> Result<Values> {
    let mesh = DeviceMesh::new(pg, MeshShape { dp: 2, pp: 2, tp: 2 })?;
    let replica = mesh.coords().dp;
    let params = init_params(&model_config(), 7, &Device::Cpu)?;
    let (config, schedule) = (train_config(CLIP), PipelineSchedule::OneFOneB);
    let plan = MeshPlan { schedule, block_step, data_axis: DataAxis::Replicate, bucket_bytes: BUCKET_BYTES };
    let mut trainer = MeshTrainer::new(&model_config(), &params, config, mesh, plan)?;
    for step in 0..STEPS {
        let rows: Vec<Tensor> = global_batches(step).iter().map(|b| rows_of(b, replica, 2)).collect();
        trainer.train_step(&rows)?;
    }
    Ok(values(trainer.stage().params()))
}

/// One rank of a tp 2 mesh taking one step: every collective it made.
fn traced_tensor_parallel_rank(pg: Box<dyn ProcessGroup>, block_step: BlockStep) -> Result<Vec<(String, usize)>> {
    let log = AllReduceLog::new(|| 0);
    let mesh = DeviceMesh::new(Box::new(WithOverride::new(pg, log.clone())), MeshShape { dp: 1, pp: 1, tp: 2 })?;
    let params = init_params(&model_config(), 7, &Device::Cpu)?;
    let (config, schedule) = (train_config(CLIP), PipelineSchedule::GPipe);
    let plan = MeshPlan { schedule, block_step, data_axis: DataAxis::Replicate, bucket_bytes: BUCKET_BYTES };
    let mut trainer = MeshTrainer::new(&model_config(), &params, config, mesh, plan)?;
    trainer.train_step(&global_batches(0))?;
    let named = |event| match event {
        Event::Started { elements, .. } => Some(("all_reduce".to_string(), elements)),
        Event::Called { collective, elements, .. } => Some((collective, elements)),
        Event::Waited { .. } => None,
    };
    Ok(log.events().into_iter().filter_map(named).collect())
}

/// With f and g recorded in the graph, a split block runs once per
/// micro-batch: Megatron's four all-reduces of a (B, T, C) activation per
/// block, two forward and two backward; under sequence parallelism four
/// all-gathers and four reduce-scatters per block, and one all-gather each
/// way where the stage's whole activations enter and leave the chunks. Both
/// ranks make the same collectives in the same order (candle's backward
/// walks the same graph on each).
#[rstest]
fn a_split_block_runs_once_per_micro_batch_with_megatrons_collectives(
    #[values(BlockStep::TensorParallel, BlockStep::SequenceParallel)] block_step: BlockStep,
) {
    let logs = on_processes(2, |pg| traced_tensor_parallel_rank(Box::new(pg), block_step));
    let (blocks, micro_batches) = (model_config().num_layers, global_batches(0).len());
    let activation = GLOBAL_BATCH * SEQ_LEN * model_config().hidden_size;
    let count = |kind: &str, elements: usize| logs[0].iter().filter(|(k, n)| k == kind && *n == elements).count();
    let per_block = 4 * blocks * micro_batches;
    let got = match block_step {
        BlockStep::TensorParallel => [count("all_reduce", activation), 0, 0],
        BlockStep::SequenceParallel => {
            let chunk = activation / 2;
            [count("all_reduce", activation), count("all_gather", chunk), count("reduce_scatter", activation)]
        }
    };
    let want = match block_step {
        BlockStep::TensorParallel => [per_block, 0, 0],
        BlockStep::SequenceParallel => [0, per_block + 2 * micro_batches, per_block],
    };
    assert_eq!(
        got,
        want,
        "exercise {}'s blocks on tp 2, {blocks} blocks, {micro_batches} micro-batches: [all-reduces, all-gathers, \
         reduce-scatters] of activations",
        block_step.exercise()
    );
    assert_eq!(logs[0], logs[1], "the two ranks' collectives differ in kind, size or order");
}

/// What rank `rank` of `world` holds of `whole` when every block is split
/// as exercise 23's blocks are.
fn tensor_parallel_shares(whole: &ParamStore, rank: usize, world: usize) -> Values {
    let mut held = values(&Root::of(whole).unwrap().params);
    for layer in 0..model_config().num_layers {
        held.extend(values(TensorParallelBlock::shard(&model_config(), whole, layer, rank, world).unwrap().params()));
    }
    held
}

/// Checks every rank's parameters against one process's.
fn expect_as_one_process(per_rank: &[Values], what: &str) {
    let one = values(&one_process());
    expect_shares_of_one_process(per_rank, what, |_| one.clone());
}

/// Checks every rank's parameters against `want(rank)`, what that rank
/// should hold of one process's.
fn expect_shares_of_one_process(per_rank: &[Values], what: &str, want: impl Fn(usize) -> Values) {
    for (rank, got) in per_rank.iter().enumerate() {
        let as_tensors = |values: &Values| -> HashMap<String, Tensor> {
            values.iter().map(|(name, v)| (name.clone(), Tensor::new(v.as_slice(), &Device::Cpu).unwrap())).collect()
        };
        let want = as_tensors(&want(rank));
        let got = as_tensors(got);
        let want: HashMap<String, Tensor> = got.keys().map(|name| (name.clone(), want[name].clone())).collect();
        let (worst, name) = max_relative_difference(&got, &want);
        assert!(
            worst <= 1e-5,
            "{what}, rank {rank} after {STEPS} steps: `{name}` differs from one process's by {worst:.2e} relative \
             (allowed 1e-5)"
        );
    }
}

#[test]
fn your_buckets_ring_and_sharded_adamw_train_on_two_processes_as_one_process() {
    let per_rank = on_processes(2, |pg| data_parallel_rank(Box::new(pg)));
    expect_as_one_process(&per_rank, "data parallel from exercises 16, 17 and 19");
}

#[test]
fn your_own_ddp_over_your_ring_trains_on_two_processes_as_one_process() {
    let per_rank = on_processes(2, |pg| your_ddp_rank(Box::new(pg)));
    expect_as_one_process(&per_rank, "your DataParallel (exercise 26) over your ring (exercise 16)");
}

#[rstest]
fn your_pipeline_of_two_processes_trains_as_one_process(
    #[values(PipelineSchedule::GPipe, PipelineSchedule::OneFOneB)] schedule: PipelineSchedule,
) {
    let per_stage = on_processes(2, |pg| pipeline_stage(Box::new(pg), schedule));
    let mut held: Vec<&String> = per_stage.iter().flat_map(|v| v.keys()).collect();
    held.sort();
    assert_eq!(
        held.len(),
        one_process().iter().count(),
        "the two stages together should hold every parameter once: {held:?}"
    );
    expect_as_one_process(&per_stage, &format!("the {schedule} pipeline of exercise {}", schedule.exercise()));
}

#[test]
fn your_pipeline_replicated_on_a_mesh_of_four_processes_trains_as_one_process() {
    let per_rank = on_processes(4, |pg| replicated_pipeline_stage(Box::new(pg)));
    expect_as_one_process(&per_rank, "the GPipe pipeline of exercise 21 on a dp 2 × pp 2 mesh");
}

#[test]
fn your_fsdp_units_on_two_processes_train_as_one_process() {
    let per_rank = on_processes(2, |pg| fsdp_rank(Box::new(pg)));
    expect_as_one_process(&per_rank, "FSDP units stepped by exercise 22");
}

#[rstest]
fn your_tensor_parallel_blocks_on_a_mesh_of_four_processes_train_as_one_process(
    #[values(BlockStep::TensorParallel, BlockStep::SequenceParallel)] block_step: BlockStep,
) {
    let per_rank = on_processes(4, |pg| tensor_parallel_rank(Box::new(pg), block_step));
    let one = ParamStore::from_tensors(single_process(STEPS, CLIP)).unwrap();
    let what = format!("a dp 2 × tp 2 mesh, its blocks run by exercise {}", block_step.exercise());
    expect_shares_of_one_process(&per_rank, &what, |rank| tensor_parallel_shares(&one, rank % 2, 2));
}

#[rstest]
fn your_pipeline_of_tensor_parallel_stages_on_a_mesh_of_eight_processes_trains_as_one_process(
    #[values(BlockStep::TensorParallel, BlockStep::SequenceParallel)] block_step: BlockStep,
) {
    let per_rank = on_processes(8, |pg| three_dimensional_rank(Box::new(pg), block_step));
    let one = ParamStore::from_tensors(single_process(STEPS, CLIP)).unwrap();
    let what = format!(
        "the 1F1B pipeline of exercise 24 on a dp 2 × pp 2 × tp 2 mesh, its blocks run by exercise {}",
        block_step.exercise()
    );
    expect_shares_of_one_process(&per_rank, &what, |rank| tensor_parallel_shares(&one, rank % 2, 2));
}
