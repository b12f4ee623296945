//! `ledger`: what one FSDP rank holds and sends per step, for one setup.
//!
//! Trains a few steps of a config on `--nproc` CPU ranks under one ZeRO stage
//! and prints rank 0's ledger of the last step as one JSON line. `cargo xtask
//! bench fsdp` runs it for every stage and world size and sets each figure
//! beside the ZeRO paper's formula. Memory and traffic do not depend on the
//! batch, so each rank trains on one short sequence per step.

use std::process::ExitCode;
use std::time::Instant;

use anyhow::Result;
use candle_core::{DType, Device};
use clap::Parser;
use trainer::config::RunConfig;
use workbook::distributed::{spawn, Collective, DeviceMesh, ProcessGroup};
use workbook::parallel::fsdp::{Precision, ShardingPlan, ShardingStrategy};
use workbook::parallel::{DataAxis, MeshPlan, MeshTrainer};
use workbook::train::Train;
use workbook::{init_params, InitRng};

#[derive(Parser)]
#[command(name = "ledger")]
struct Args {
    #[arg(long, default_value = "tiny")]
    model_size: String,
    #[arg(long, default_value_t = 2)]
    nproc: usize,
    /// ZeRO stage: 0 (NO_SHARD), 1, 2 (SHARD_GRAD_OP) or 3 (FULL_SHARD).
    #[arg(long, default_value_t = 3)]
    stage: u8,
    #[arg(long, default_value = "fp32")]
    precision: String,
    #[arg(long, default_value_t = 2)]
    steps: usize,
    /// Tokens per sequence (each rank trains on one sequence per step).
    #[arg(long, default_value_t = 64)]
    seq_len: usize,
}

/// Counts each rank's heap bytes, so the FSDP ledger can measure activations.
#[global_allocator]
static ALLOCATOR: workbook::memory::CountingAllocator = workbook::memory::CountingAllocator;

fn main() -> ExitCode {
    trainer::main_with(|| run(Args::parse()))
}

fn run(args: Args) -> Result<()> {
    let config = RunConfig::load(&args.model_size)?;
    let precision: Precision = args.precision.parse()?;
    let plan = ShardingPlan::zero(args.stage.min(3));
    let model = config.model.clone();
    let seq_len = args.seq_len.min(model.max_seq_len);
    trainer::RankThreads::share(args.nproc, None, 1).apply()?;
    let mut ranks = spawn(args.nproc, |pg| {
        let params = init_params(&model, 0, &Device::Cpu)?;
        let num_params = params.num_params();
        let rank = pg.rank();
        // Every stage on FSDP's units: the plan decides what they shard.
        let sharding = ShardingStrategy::FullShard;
        let data_axis = DataAxis::ShardBlocks { sharding, shard_group: None, precision, reduce_in_f32: false };
        let mesh_plan = MeshPlan::replicas(data_axis);
        let mesh = DeviceMesh::data_parallel(Box::new(pg));
        let train_config = config.train_config(false);
        let mut trainer = MeshTrainer::with_units_plan(&model, &params, train_config, mesh, mesh_plan, plan)?;
        drop(params);
        let mut rng = InitRng::from_seed(rank as u64);
        let mut seconds = 0.0;
        for step in 0..args.steps {
            let noise = rng.normal(&(1, seq_len).into(), 1.0, &Device::Cpu)?;
            let tokens =
                (noise.abs()? * (model.vocab_size as f64 / 4.0))?.floor()?.clamp(0.0, (model.vocab_size - 1) as f64)?;
            let start = Instant::now();
            trainer.train_step(&[tokens.to_dtype(DType::U32)?])?;
            if step > 0 {
                seconds += start.elapsed().as_secs_f64();
            }
        }
        let padded: usize =
            trainer.units().iter().flat_map(|held| held.units.iter()).map(|u| u.layout.padded_len()).sum();
        let Some(ledger) = trainer.ledger() else { unreachable!("FSDP units keep a ledger") };
        Ok((ledger, num_params, padded, seconds))
    })?;
    let (ledger, params, padded, seconds) = ranks.swap_remove(0);
    let m = ledger.memory;
    let timed = args.steps.saturating_sub(1).max(1);
    println!(
        "{}",
        serde_json::json!({
            "model_size": args.model_size,
            "stage": plan.zero_stage(),
            "precision": precision.name(),
            "nproc": args.nproc,
            "params": params,
            "padded_params": padded,
            "param_bytes": m.params,
            "master_bytes": m.master_params,
            "grad_bytes": m.grads,
            "optimizer_bytes": m.optimizer_state,
            "model_state_bytes": m.model_states(),
            "gathered_peak_bytes": m.gathered_peak,
            "activation_bytes": m.activations_peak,
            "ring_volume_bytes": ledger.comm.ring_volume(),
            "all_gathers": ledger.comm.calls(Collective::AllGather),
            "reduce_scatters": ledger.comm.calls(Collective::ReduceScatter),
            "all_reduces": ledger.comm.calls(Collective::AllReduce),
            "tokens_per_s": (args.nproc * seq_len * timed) as f64 / seconds.max(1e-9),
        })
    );
    Ok(())
}
