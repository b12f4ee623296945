//! The multi-rank checks on GPUs (a build with `--features nccl`, on a
//! machine with two or more NVIDIA GPUs; `cargo xtask check-phase 2|3` runs
//! them when `doctor` finds them): one process per GPU, collectives over
//! NCCL, each rank running your exercises. Training must reach what one CPU
//! process reaches, to the tolerance the GPU checks use: NCCL and cuBLAS sum
//! in their own order, so bit-exactness is not asked. Adam's update hides
//! the gradients' scale, so the gradient norms are compared too, and NCCL's
//! collectives against their definitions. On fewer than two GPUs the checks
//! are skipped, with the reason printed, never failed.

use std::collections::{BTreeMap, HashMap};

use candle_core::{DType, Device, Tensor};
use workbook::distributed::{allow_unverified_nccl, ProcessGroup, ReduceOp};
use workbook::parallel::fsdp::{Precision, ShardingStrategy};
use workbook::parallel::DataAxis;

use crate::fsdp_runs::{
    as_values, ddp_rank_with_norms, fsdp, fsdp_rank, max_relative_difference, single_process, single_process_norms,
    train_config, GLOBAL_BATCH,
};
use crate::process_ranks::on_gpu_processes;
use crate::processes::input;

const STEPS: usize = 3;
/// Clipping that bites on this model (its gradient norm is above 1).
const CLIP: f64 = 0.5;
/// Relative L2 difference of any parameter after the steps, GPU ranks against
/// one CPU process: the single-GPU checks' bound on an update.
const BOUND: f64 = 1e-3;

/// Ranks for these checks: one per GPU CUDA shows, as many as divide the
/// global batch (2 or 4); `None`, with the reason printed, on fewer than two.
fn world_size() -> Option<usize> {
    use candle_core::cuda_backend::cudarc::driver::CudaContext;
    let gpus = CudaContext::device_count().unwrap_or_else(|e| panic!("asking the CUDA driver for its GPUs: {e:?}"));
    let gpus = gpus.max(0) as usize;
    if gpus < 2 {
        eprintln!("skipped: these checks need two GPUs or more, and CUDA shows {gpus} (see CUDA_VISIBLE_DEVICES)");
        return None;
    }
    let world = if gpus >= 4 { 4 } else { 2 };
    assert_eq!(GLOBAL_BATCH % world, 0);
    Some(world)
}

/// Named tensors as a rank sends them back: plain numbers.
type Values = BTreeMap<String, Vec<f32>>;

/// Values sent back by a rank, as CPU tensors to compare.
fn as_tensors(values: &Values) -> HashMap<String, Tensor> {
    let tensor = |v: &Vec<f32>| Tensor::from_slice(v, v.len(), &Device::Cpu).unwrap();
    values.iter().map(|(name, v)| (name.clone(), tensor(v))).collect()
}

/// Each rank's parameters against one CPU process's after the same steps.
fn check_every_rank(per_rank: &[Values], what: &str) {
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
    let Some(world) = world_size() else { return };
    let per_rank: Vec<(Values, Vec<f64>)> = on_gpu_processes(world, |pg| {
        let device = pg.device();
        let (params, norms) = ddp_rank_with_norms(Box::new(pg), train_config(CLIP), STEPS, &device)?;
        Ok((as_values(&params), norms))
    });
    let want = single_process_norms(STEPS, CLIP);
    for (rank, (_, norms)) in per_rank.iter().enumerate() {
        for (step, (got, want)) in norms.iter().zip(&want).enumerate() {
            assert!(
                (got - want).abs() <= 1e-3 * want,
                "DDP on {world} GPUs, rank {rank}: the gradient norm of step {step} is {got:.6}, one process's \
                 {want:.6} ({:.3} times it; {world} times is what summing the ranks' gradients instead of \
                 averaging them gives)",
                got / want
            );
        }
    }
    let params: Vec<_> = per_rank.into_iter().map(|(params, _)| params).collect();
    check_every_rank(&params, &format!("DDP on {world} GPUs over NCCL"));
}

/// Each collective over NCCL against its definition, computed on the CPU
/// from every rank's input (NCCL adds in its own order: a tolerance).
#[test]
fn phase_2_nccl_collectives_match_their_definitions() {
    let Some(world) = world_size() else { return };
    const LEN: usize = 12; // divides by 2 and 4, for the reduce-scatter
    let per_rank: Vec<Values> = on_gpu_processes(world, |pg| {
        let device = pg.device();
        let mine = input(pg.rank(), LEN, DType::F32).to_device(&device)?;
        let results = [
            ("all_reduce(sum)", pg.all_reduce(&mine, ReduceOp::Sum)?),
            ("all_reduce(avg)", pg.all_reduce(&mine, ReduceOp::Avg)?),
            ("all_gather", pg.all_gather(&mine)?),
            ("reduce_scatter(sum)", pg.reduce_scatter(&mine, ReduceOp::Sum)?),
            ("broadcast from the last rank", pg.broadcast(&mine, world - 1)?),
        ];
        Ok(as_values(results.iter().map(|(name, t)| (*name, t))))
    });
    let inputs: Vec<Vec<f32>> = (0..world).map(|r| input(r, LEN, DType::F32).to_vec1().unwrap()).collect();
    let sum: Vec<f32> = (0..LEN).map(|i| inputs.iter().map(|x| x[i]).sum()).collect();
    let chunk = LEN / world;
    for (rank, got) in per_rank.iter().enumerate() {
        let want: [(&str, Vec<f32>); 5] = [
            ("all_reduce(sum)", sum.clone()),
            ("all_reduce(avg)", sum.iter().map(|s| s / world as f32).collect()),
            ("all_gather", inputs.concat()),
            ("reduce_scatter(sum)", sum[rank * chunk..(rank + 1) * chunk].to_vec()),
            ("broadcast from the last rank", inputs[world - 1].clone()),
        ];
        expect_definitions(got, &want, rank, world);
    }
}

/// Fails unless each of `rank`'s named results holds what its definition
/// gives, to a tolerance for the order in which NCCL sums.
fn expect_definitions(got: &Values, want: &[(&str, Vec<f32>)], rank: usize, world: usize) {
    for (name, want) in want {
        let got = &got[*name];
        assert_eq!(got.len(), want.len(), "{name} on rank {rank} of {world}: wrong length");
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            assert!(
                (g - w).abs() <= 1e-5 * w.abs().max(1.0),
                "{name} over NCCL on rank {rank} of {world}: element {i} is {g}, its definition gives {w}"
            );
        }
    }
}

#[test]
fn phase_3_full_shard_over_nccl_reaches_what_one_process_reaches() {
    let Some(world) = world_size() else { return };
    let fsdp = fsdp(ShardingStrategy::FullShard, Precision::Fp32);
    let per_rank = on_gpu_processes(world, |pg| {
        let device = pg.device();
        Ok(as_values(&fsdp_rank(Box::new(pg), fsdp, train_config(CLIP), STEPS, &device).0))
    });
    check_every_rank(&per_rank, &format!("FSDP full_shard on {world} GPUs over NCCL"));
}

/// The NCCL paths that have never run with two GPUs or more, opted into
/// here: a split into two subgroups (even and odd ranks) and an all-reduce
/// in each, and send_recv's grouped exchange around a ring, on a tensor
/// that is not contiguous (its copy must outlive the group).
#[test]
fn never_run_nccl_paths_split_subgroups_and_send_recv_match_their_definitions() {
    let Some(world) = world_size() else { return };
    const LEN: usize = 8;
    let per_rank: Vec<Values> = on_gpu_processes(world, |pg| {
        allow_unverified_nccl(true);
        let (rank, device) = (pg.rank(), pg.device());
        let mine = input(rank, LEN, DType::F32).to_device(&device)?;
        let parity = pg.split(rank % 2)?;
        let in_parity = parity.all_reduce(&mine, ReduceOp::Sum)?;
        let strided = mine.reshape((2, LEN / 2))?.t()?; // not contiguous
        let from_left = pg.send_recv(&strided, (rank + 1) % world, &strided, (rank + world - 1) % world)?;
        Ok(as_values([("subgroup all_reduce", &in_parity), ("send_recv from the left", &from_left)]))
    });
    let inputs: Vec<Vec<f32>> = (0..world).map(|r| input(r, LEN, DType::F32).to_vec1().unwrap()).collect();
    let transposed = |x: &[f32]| -> Vec<f32> { (0..LEN).map(|i| x[(i % 2) * (LEN / 2) + i / 2]).collect() };
    for (rank, got) in per_rank.iter().enumerate() {
        let same_parity: Vec<&Vec<f32>> = inputs.iter().skip(rank % 2).step_by(2).collect();
        let want = [
            ("subgroup all_reduce", (0..LEN).map(|i| same_parity.iter().map(|x| x[i]).sum()).collect::<Vec<f32>>()),
            ("send_recv from the left", transposed(&inputs[(rank + world - 1) % world])),
        ];
        expect_definitions(got, &want, rank, world);
    }
}

/// HYBRID_SHARD: shard groups of two GPUs, replicated across them (on four
/// GPUs; on two, one shard group), through split's subgroups.
#[test]
fn phase_3_hybrid_shard_over_nccl_reaches_what_one_process_reaches() {
    let Some(world) = world_size() else { return };
    let fsdp = DataAxis::ShardBlocks {
        sharding: ShardingStrategy::HybridShard,
        shard_group: Some(2),
        precision: Precision::Fp32,
        reduce_in_f32: false,
    };
    let per_rank = on_gpu_processes(world, |pg| {
        allow_unverified_nccl(true);
        let device = pg.device();
        Ok(as_values(&fsdp_rank(Box::new(pg), fsdp, train_config(CLIP), STEPS, &device).0))
    });
    check_every_rank(&per_rank, &format!("FSDP hybrid_shard (groups of 2) on {world} GPUs over NCCL"));
}
