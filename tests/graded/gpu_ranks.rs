//! The multi-rank checks on GPUs (a build with `--features nccl`, on a
//! machine with two or more NVIDIA GPUs; `cargo xtask check-phase 2|3` runs
//! them when `doctor` finds them): one process per GPU, collectives over
//! NCCL, each rank running your exercises. Training must reach what one CPU
//! process reaches, to the tolerance the GPU checks use: NCCL and cuBLAS sum
//! in their own order, so bit-exactness is not asked.

use std::collections::{BTreeMap, HashMap};

use candle_core::{Device, Tensor};
use workbook::parallel::fsdp::{FsdpConfig, Precision, ShardingStrategy};

use crate::fsdp_runs::{
    as_values, ddp_rank, fsdp_rank, max_relative_difference, single_process, train_config, GLOBAL_BATCH,
};
use crate::process_ranks::on_gpu_processes;

const STEPS: usize = 3;
/// Clipping that bites on this model (its gradient norm is above 1).
const CLIP: f64 = 0.5;
/// Relative L2 difference of any parameter after the steps, GPU ranks against
/// one CPU process: the single-GPU checks' bound on an update.
const BOUND: f64 = 1e-3;

/// Ranks for these checks: one per GPU, as many as divide the global batch (2 or 4).
fn world_size() -> usize {
    use candle_core::cuda_backend::cudarc::driver::CudaContext;
    let gpus = CudaContext::device_count().unwrap_or_else(|e| panic!("asking the CUDA driver for its GPUs: {e:?}"));
    let gpus = gpus.max(0) as usize;
    assert!(gpus >= 2, "these checks need two GPUs or more, and this machine has {gpus}");
    let world = if gpus >= 4 { 4 } else { 2 };
    assert_eq!(GLOBAL_BATCH % world, 0);
    world
}

/// Values sent back by a rank, as CPU tensors to compare.
fn as_tensors(values: &BTreeMap<String, Vec<f32>>) -> HashMap<String, Tensor> {
    let tensor = |v: &Vec<f32>| Tensor::from_slice(v, v.len(), &Device::Cpu).unwrap();
    values.iter().map(|(name, v)| (name.clone(), tensor(v))).collect()
}

/// Each rank's parameters against one CPU process's after the same steps.
fn check_every_rank(per_rank: &[BTreeMap<String, Vec<f32>>], what: &str) {
    let want = single_process(STEPS, CLIP);
    for (rank, values) in per_rank.iter().enumerate() {
        let (worst, name) = max_relative_difference(&as_tensors(values), &want);
        assert!(
            worst <= BOUND,
            "{what}, rank {rank} of {}: `{name}` differs from one CPU process by {worst:.2e} relative after {STEPS} \
             steps (allowed {BOUND:.0e})",
            per_rank.len()
        );
    }
}

#[test]
fn phase_2_ddp_over_nccl_reaches_what_one_process_reaches() {
    let world = world_size();
    let per_rank = on_gpu_processes(world, |pg| {
        let device = pg.device();
        Ok(as_values(&ddp_rank(Box::new(pg), train_config(CLIP), STEPS, &device)?))
    });
    check_every_rank(&per_rank, &format!("DDP on {world} GPUs over NCCL"));
}

#[test]
fn phase_3_full_shard_over_nccl_reaches_what_one_process_reaches() {
    let world = world_size();
    let fsdp = FsdpConfig { sharding: ShardingStrategy::FullShard, precision: Precision::Fp32 };
    let per_rank = on_gpu_processes(world, |pg| {
        let device = pg.device();
        Ok(as_values(&fsdp_rank(Box::new(pg), fsdp, train_config(CLIP), STEPS, &device).0))
    });
    check_every_rank(&per_rank, &format!("FSDP full_shard on {world} GPUs over NCCL"));
}
