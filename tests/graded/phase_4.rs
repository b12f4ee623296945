//! Phase 4's whole-phase checks, run once exercises 16-21 pass: training
//! steps built from your own pieces, every rank a process of its own (the
//! process backend over TCP, see `process_ranks.rs`), reach the parameters
//! one process reaches with the runtime's AdamW.
//!
//! - Data parallel: each rank's gradients averaged by your buckets
//!   (exercise 19) over your ring all-reduce (exercise 16), the update taken
//!   by your sharded AdamW (exercise 17).
//! - Pipeline parallel: your GPipe step (exercise 21) on two stages, each
//!   stage updating its own parameters.

use std::collections::{BTreeMap, HashMap};

use candle_core::{Device, Result, Tensor};
use workbook::autograd::Gradients;
use workbook::distributed::{OwnRing, ProcessGroup};
use workbook::model::ParamStore;
use workbook::parallel::fsdp::FlatLayout;
use workbook::parallel::pipeline::PipelineStage;
use workbook::parallel::zero::ShardedAdamW;
use workbook::phase4_under_the_hood::{gpipe_step, overlapped_all_reduce};
use workbook::train::{AdamW, AdamWConfig, ParamGroup};
use workbook::{init_params, Gpt};

use crate::fsdp_runs::{as_values, global_batches, max_relative_difference, model_config, rows_of};
use crate::process_ranks::on_processes;

const STEPS: usize = 3;
const LR: f64 = 1e-2;
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
fn one_process() -> Values {
    let params = init_params(&model_config(), 7, &Device::Cpu).unwrap();
    let mut optimizer = adamw(&params).unwrap();
    for step in 0..STEPS {
        let grads = mean_gradients(&params, &global_batches(step)).unwrap();
        optimizer.step(&params, &grads, LR).unwrap();
    }
    values(&params)
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

/// One pipeline stage: your GPipe step on the whole batch, AdamW on the stage's parameters.
fn pipeline_stage(pg: Box<dyn ProcessGroup>) -> Result<Values> {
    let params = init_params(&model_config(), 7, &Device::Cpu)?;
    let stage = PipelineStage::new(&model_config(), &params, pg.rank(), pg.world_size())?;
    let mut optimizer = adamw(stage.params())?;
    for step in 0..STEPS {
        let grads = gpipe_step(pg.as_ref(), &stage, &global_batches(step))?.grads;
        optimizer.step(stage.params(), &grads, LR)?;
    }
    Ok(values(stage.params()))
}

fn expect_as_one_process(per_rank: &[Values], what: &str) {
    let want: HashMap<String, Tensor> =
        one_process().into_iter().map(|(name, v)| (name, Tensor::new(v, &Device::Cpu).unwrap())).collect();
    for (rank, got) in per_rank.iter().enumerate() {
        let got: HashMap<String, Tensor> =
            got.iter().map(|(name, v)| (name.clone(), Tensor::new(v.as_slice(), &Device::Cpu).unwrap())).collect();
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
fn your_pipeline_of_two_processes_trains_as_one_process() {
    let per_stage = on_processes(2, |pg| pipeline_stage(Box::new(pg)));
    let mut held: Vec<&String> = per_stage.iter().flat_map(|v| v.keys()).collect();
    held.sort();
    assert_eq!(held.len(), one_process().len(), "the two stages together should hold every parameter once: {held:?}");
    expect_as_one_process(&per_stage, "the pipeline of exercise 21");
}
