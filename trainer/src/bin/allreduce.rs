//! `allreduce`: the bus bandwidth of the process backend's ring all-reduce,
//! in nccl-tests' definition, for payloads from 1 MB to 256 MB.
//!
//! algbw = payload / time, and busbw = algbw · 2(N−1)/N: the rate at which
//! each rank's link carries data in a ring, comparable across world sizes.
//! Prints one JSON line per size: `{"bytes": ..., "seconds": ..., "algbw_gbs": ..., "busbw_gbs": ...}`.
//!
//! `cargo run -p trainer --bin allreduce -- --nproc 2`

use std::process::ExitCode;
use std::time::Instant;

use anyhow::{bail, Result};
use candle_core::{Device, Tensor};
use clap::Parser;
use workbook::distributed::{init_from_env, relaunch_self, LaunchConfig, ProcessGroup, ReduceOp};

#[derive(Parser)]
#[command(name = "allreduce")]
struct Args {
    /// Ranks, each a process on this machine.
    #[arg(long, default_value_t = 2)]
    nproc: usize,
    /// Payload sizes in MB (10^6 bytes) of f32, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,4,16,64,256")]
    sizes_mb: Vec<usize>,
    /// Timed all-reduces per size, after one warm-up.
    #[arg(long, default_value_t = 5)]
    iters: usize,
}

fn main() -> ExitCode {
    trainer::main_with(|| run(Args::parse()))
}

fn run(args: Args) -> Result<()> {
    let Some(pg) = init_from_env()? else {
        let job = LaunchConfig { nproc_per_node: args.nproc, ..LaunchConfig::default() };
        if relaunch_self(&job)? != 0 {
            bail!("the all-reduce ranks failed");
        }
        return Ok(());
    };
    let n = pg.world_size() as f64;
    for &mb in &args.sizes_mb {
        let bytes = mb * 1_000_000;
        let t = Tensor::ones(bytes / 4, candle_core::DType::F32, &Device::Cpu)?;
        pg.all_reduce(&t, ReduceOp::Sum)?; // warm-up: buffers, connections
        pg.barrier()?;
        let start = Instant::now();
        for _ in 0..args.iters {
            pg.all_reduce(&t, ReduceOp::Sum)?;
        }
        let seconds = start.elapsed().as_secs_f64() / args.iters as f64;
        let algbw = bytes as f64 / seconds / 1e9;
        if pg.rank() == 0 {
            let line = serde_json::json!({
                "bytes": bytes, "seconds": seconds, "algbw_gbs": algbw, "busbw_gbs": algbw * 2.0 * (n - 1.0) / n,
            });
            println!("{line}");
        }
    }
    Ok(())
}
