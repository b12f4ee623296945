//! `bench`: training throughput of the workbook on a config, single process and DDP.
//!
//! Prints one JSON line per setup: `{"setup": "...", "nproc": N, "threads": T, "tokens_per_s": ...,
//! "model_tflops_per_s": ..., "mfu": ..., "sent_bytes_per_step": ..., "peak_memory_mib": ...}`,
//! where T counts the kernel threads of all ranks together, and the bytes one rank sent per step
//! and its peak resident memory are the largest over the ranks (the memory is absent where ranks
//! share a process or the OS does not report it). The model's FLOP/s count a token as
//! `GptConfig::training_flops_per_token` does; the MFU divides them by `--peak-tflops` per rank,
//! and is absent without it.
//! `cargo xtask bench` runs it beside the PyTorch baseline and writes the comparison.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use clap::Parser;
use serde::{Deserialize, Serialize};
use trainer::compute::{Backend, ComputeArgs, DeviceKind};
use trainer::config::RunConfig;
use trainer::launching::RankKind;
use trainer::layout_flags::LayoutFlags;
use trainer::metrics::{read_log, METRICS_FILE};
use trainer::run::{peak_memory_mib, rows_to_split, train, RunOptions};
use trainer::strategy::{Layout, Strategy};
use trainer::RankThreads;
use workbook::data::{DataConfig, DatasetKind};
use workbook::distributed::{relaunch_self, DistEnv, LaunchConfig, DEFAULT_TIMEOUT};
use workbook::parallel::ddp::DEFAULT_BUCKET_BYTES;
use workbook::parallel::DataAxis;

/// Where the ranks of a multi-process bench write their metrics, for the
/// process that started them to read.
const BENCH_DIR: &str = "WORKBOOK_BENCH_DIR";

#[derive(Parser)]
#[command(name = "bench")]
struct Args {
    #[arg(long, default_value = "tiny")]
    model_size: String,
    /// Timed optimizer steps, after the warm-up ones.
    #[arg(long, default_value_t = 20)]
    steps: usize,
    #[arg(long, default_value_t = 5)]
    warmup: usize,
    /// Sequence length (default: the config's).
    #[arg(long)]
    seq_len: Option<usize>,
    /// Sequences per step over all ranks (default: the config's).
    #[arg(long)]
    batch_size: Option<usize>,
    /// Micro-batches per step (default: the config's).
    #[arg(long)]
    grad_accum: Option<usize>,
    /// Data-parallel ranks. The kernel thread pool is sized once per process,
    /// so `cargo xtask bench` runs one setup per process.
    #[arg(long, default_value_t = 1)]
    nproc: usize,
    /// Ranks as processes (through the launcher) or as threads of this one.
    #[arg(long, value_enum, default_value_t = RankKind::Processes)]
    ranks: RankKind,
    /// The threads each rank uses, as `train --threads` (default: the cores / --nproc).
    #[arg(long)]
    threads: Option<usize>,
    /// How the ranks share the work, as `train` takes it: --strategy, --pp, --tp and the rest.
    #[command(flatten)]
    layout: LayoutFlags,
    /// One device's peak TFLOP/s in the precision the run computes in (the
    /// datasheet's: an H100 SXM's is about 67 in f32 without TF32, 989 in
    /// dense bf16), for the model FLOPs utilisation (MFU) of the run.
    #[arg(long, value_name = "TFLOPS", value_parser = positive_tflops)]
    peak_tflops: Option<f64>,
    /// --device and --backend.
    #[command(flatten)]
    compute: ComputeArgs,
}

/// What one rank used, written by each rank for the process that reports.
#[derive(Serialize, Deserialize)]
struct RankUsage {
    /// How the rank used its threads.
    threads: RankThreads,
    sent_bytes_per_step: f64,
    /// This process's peak resident memory; `None` where ranks are threads of one process.
    peak_memory_mib: Option<f64>,
}

/// The allocator `train` runs with, so that the bench measures what it runs.
#[global_allocator]
static ALLOCATOR: workbook::memory::CountingAllocator = workbook::memory::CountingAllocator;

fn main() -> ExitCode {
    let args = Args::try_parse().unwrap_or_else(|error| trainer::flag_conflicts::exit_saying_why(error));
    trainer::main_with(|| run(args))
}

fn run(args: Args) -> Result<()> {
    args.compute.set_matmul_precision()?;
    let mut config = RunConfig::load(&args.model_size)?;
    config.max_steps = args.warmup + args.steps;
    config.optimizer.warmup_steps = 1;
    if let Some(t) = args.seq_len {
        config.seq_len = t;
    }
    if let Some(b) = args.batch_size {
        config.batch_size = b;
    }
    if let Some(k) = args.grad_accum {
        config.grad_accum_steps = k;
    }
    // Checked before any rank starts, as `train` checks it.
    let layout = args.layout.choose(&config, args.nproc, args.nproc)?;
    let launched = DistEnv::from_env()?;
    let out_dir = std::env::var_os(BENCH_DIR)
        .map(PathBuf::from)
        .unwrap_or_else(|| std::env::temp_dir().join(format!("workbook-bench-{}", std::process::id())));
    if launched.is_none() && args.nproc > 1 && args.ranks == RankKind::Processes {
        let _ = std::fs::remove_dir_all(&out_dir);
        std::env::set_var(BENCH_DIR, &out_dir); // before any thread starts; the ranks inherit it
        let job = LaunchConfig { nproc_per_node: args.nproc, ..LaunchConfig::default() };
        if relaunch_self(&job)? != 0 {
            bail!("the bench's ranks failed");
        }
        return report(&args, &config, &out_dir, &layout);
    }
    let _ = std::fs::remove_dir_all(&out_dir);
    let data = DataConfig {
        kind: DatasetKind::Dummy,
        path: None,
        tokenizer: config.tokenizer,
        seq_len: config.seq_len,
        seed: 0,
    };
    let mut options = RunOptions {
        config: config.clone(),
        data,
        nproc: args.nproc,
        device: args.compute.device,
        autocast_bf16: args.compute.autocast_bf16,
        batch_threads: 1, // chosen below
        backend: args.compute.backend(),
        seed: 0,
        out_dir: out_dir.clone(),
        checkpoint_every: usize::MAX,
        keep_checkpoints: 1,
        resume: None,
        overwrite: true,
        init_from: None,
        layout,
        unverified_nccl: false,
        trace: false,
        eval_every: None,
        log_every: usize::MAX,
        timeout: DEFAULT_TIMEOUT,
    };
    // Ranks started by the launcher all run on this machine; so do thread ranks.
    let threads = RankThreads::share(args.nproc, args.threads, rows_to_split(&options));
    threads.apply()?;
    options.batch_threads = threads.batch;
    let summary = train(&options)?;
    let shares_process = launched.is_none() && args.nproc > 1;
    let usage = RankUsage {
        threads,
        sent_bytes_per_step: summary.sent_bytes_per_step,
        peak_memory_mib: if shares_process { None } else { peak_memory_mib() },
    };
    let rank = launched.as_ref().map_or(0, |env| env.rank);
    std::fs::write(usage_path(&out_dir, rank), serde_json::to_string(&usage)?)?;
    match launched {
        Some(_) => Ok(()), // the process that started the ranks reports
        None => report(&args, &config, &out_dir, &options.layout),
    }
}

fn usage_path(out_dir: &Path, rank: usize) -> PathBuf {
    out_dir.join(format!("usage-rank{rank}.json"))
}

/// Prints the setup's tokens/s, from the metrics rank 0 wrote, and the
/// busiest rank's traffic and memory, as one JSON line.
fn report(args: &Args, config: &RunConfig, out_dir: &Path, layout: &Layout) -> Result<()> {
    let records = read_log(&out_dir.join(METRICS_FILE))?;
    // Thread ranks share one process, which wrote rank 0's usage only.
    let ranks = if args.ranks == RankKind::Processes { args.nproc } else { 1 };
    let usages = (0..ranks)
        .map(|rank| {
            let path = usage_path(out_dir, rank);
            let text =
                std::fs::read_to_string(&path).with_context(|| format!("rank {rank} left no {}", path.display()))?;
            Ok(serde_json::from_str::<RankUsage>(&text)?)
        })
        .collect::<Result<Vec<_>>>()?;
    let _ = std::fs::remove_dir_all(out_dir);
    let sent_bytes_per_step = usages.iter().map(|u| u.sent_bytes_per_step).fold(0.0, f64::max);
    let peak_memory_mib = usages.iter().map(|u| u.peak_memory_mib).try_fold(0.0, |most, m| Some(f64::max(most, m?)));
    let (Some(start), Some(end)) = (records.get(args.warmup.saturating_sub(1)), records.last()) else {
        bail!("the run logged {} steps, too few to time", records.len());
    };
    let tokens = (end.step - start.step) * config.batch_size * config.grad_accum_steps * config.seq_len;
    let tokens_per_s = tokens as f64 / (end.elapsed_s - start.elapsed_s);
    let nproc = args.nproc;
    let parts = usages[0].threads.batch;
    let mut setup = match (nproc, args.ranks) {
        (1, _) if parts > 1 => format!("workbook, single process, batch split across {parts} threads"),
        (1, _) => "workbook, single process".to_string(),
        (_, RankKind::Processes) => format!("workbook, {} on {nproc} processes", parallelism(layout.strategy, nproc)),
        (_, RankKind::Threads) => format!("workbook, {} on {nproc} thread ranks", parallelism(layout.strategy, nproc)),
    };
    if args.compute.device == DeviceKind::Cuda {
        setup.push_str(match (nproc, args.compute.backend()) {
            (1, _) => ", on a GPU",
            (_, Backend::Nccl) => ", GPUs over NCCL",
            (_, Backend::Tcp) => ", GPUs over TCP",
        });
        if args.compute.tf32 {
            setup.push_str(", TF32");
        }
        if args.compute.autocast_bf16 {
            setup.push_str(", bf16 autocast");
        }
    }
    if layout.own_ring {
        setup.push_str(", your ring all-reduce");
    }
    if let Some(rank) = layout.powersgd_rank {
        setup.push_str(&format!(", PowerSGD rank {rank}"));
    }
    if layout.ddp_overlap {
        setup.push_str(", buckets overlapped with backward");
    }
    if layout.bucket_bytes != DEFAULT_BUCKET_BYTES {
        setup.push_str(&format!(", {} MB buckets", layout.bucket_bytes as f64 / (1024.0 * 1024.0)));
    }
    // Thread ranks share their process's threads evenly.
    let threads = nproc * usages[0].threads.total();
    let model_tflops_per_s = tokens_per_s * config.model.training_flops_per_token(config.seq_len) / 1e12;
    let mfu = args.peak_tflops.map(|peak| model_tflops_per_s / (nproc as f64 * peak));
    println!(
        "{}",
        serde_json::json!({
            "setup": setup,
            "nproc": nproc,
            "threads": threads,
            "tokens_per_s": tokens_per_s,
            "model_tflops_per_s": model_tflops_per_s,
            "mfu": mfu,
            "sent_bytes_per_step": sent_bytes_per_step,
            "peak_memory_mib": peak_memory_mib,
            "final_loss": end.loss,
        })
    );
    Ok(())
}

/// The run's layout in words: its parallelisms and what the replicas share.
fn parallelism(strategy: Strategy, nproc: usize) -> String {
    let replicas = |per_replica: usize| match nproc / per_replica.max(1) {
        1 => String::new(),
        n => format!(" × {n} replicas"),
    };
    let Strategy::Mesh { stages, tp, schedule, data, .. } = strategy else { return "DDP".to_string() };
    if let (1, 1, DataAxis::ShardBlocks { sharding, precision, .. }) = (stages, tp, data) {
        return format!("FSDP ({sharding}, {precision})");
    }
    let sharing = match data {
        DataAxis::Replicate => "",
        DataAxis::ShardOptimizer => ", ZeRO-1",
        DataAxis::ShardGradients => ", ZeRO-2",
        DataAxis::YourDdp => ", your DDP",
        DataAxis::ShardBlocks { .. } => ", FSDP units",
    };
    let cut = match (stages, tp) {
        (1, 1) => "whole replicas".to_string(),
        (1, tp) => format!("tensor parallelism over {tp} ranks{}", replicas(tp)),
        (stages, 1) => format!("a {schedule} pipeline of {stages} stages{}", replicas(stages)),
        (stages, tp) => format!("a {schedule} pipeline of {stages} stages split {tp} ways{}", replicas(stages * tp)),
    };
    format!("{cut}{sharing}")
}

fn positive_tflops(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(peak) if peak.is_finite() && peak > 0.0 => Ok(peak),
        _ => Err(format!("`{text}` is not a peak: give the device's TFLOP/s as a positive number, e.g. 67")),
    }
}
