//! `bench`: training throughput of the workbook on a config, single process and DDP.
//!
//! Prints one JSON line per setup: `{"setup": "...", "nproc": N, "threads": T, "tokens_per_s": ...}`,
//! where T counts the kernel threads of all ranks together.
//! `cargo xtask bench` runs it beside the PyTorch baseline and writes the comparison.

use std::process::ExitCode;

use anyhow::{bail, Result};
use clap::Parser;
use trainer::config::RunConfig;
use trainer::metrics::read_log;
use trainer::run::{train, workbook_root, RunOptions};
use trainer::strategy::Strategy;
use workbook::data::{DataConfig, DatasetKind};

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
    /// The rank counts to measure, comma-separated. The kernel thread pool is sized
    /// once per process, so measure one count per process (`cargo xtask bench` does).
    #[arg(long, value_delimiter = ',', default_value = "1,2")]
    nproc: Vec<usize>,
}

/// The allocator `train` runs with, so that the bench measures what it runs.
#[global_allocator]
static ALLOCATOR: workbook::memory::CountingAllocator = workbook::memory::CountingAllocator;

fn main() -> ExitCode {
    trainer::main_with(|| run(Args::parse()))
}

fn run(args: Args) -> Result<()> {
    let root = workbook_root();
    let mut config = RunConfig::load(&root, &args.model_size)?;
    config.max_steps = args.warmup + args.steps;
    config.optimizer.warmup_steps = 1;
    let user_set_threads = std::env::var_os("RAYON_NUM_THREADS").is_some();
    for nproc in args.nproc {
        trainer::set_kernel_threads(nproc, user_set_threads);
        let out_dir = std::env::temp_dir().join(format!("workbook-bench-{}-{nproc}", std::process::id()));
        let _ = std::fs::remove_dir_all(&out_dir);
        let data = DataConfig { kind: DatasetKind::Dummy, path: None, tokenizer: config.tokenizer, seq_len: config.seq_len, seed: 0 };
        let options = RunOptions {
            config: config.clone(),
            data,
            nproc,
            seed: 0,
            out_dir: out_dir.clone(),
            checkpoint_every: usize::MAX,
            keep_checkpoints: 1,
            resume: None,
            activation_checkpointing: false,
            strategy: Strategy::Ddp,
            log_every: usize::MAX,
            timeout: workbook::distributed::DEFAULT_TIMEOUT,
        };
        train(&options)?;
        let records = read_log(&out_dir.join("metrics.jsonl"))?;
        let _ = std::fs::remove_dir_all(&out_dir);
        let (Some(start), Some(end)) = (records.get(args.warmup.saturating_sub(1)), records.last()) else {
            bail!("the run logged {} steps, too few to time", records.len());
        };
        let tokens = (end.step - start.step) * config.batch_size * config.grad_accum_steps * config.seq_len;
        let tokens_per_s = tokens as f64 / (end.elapsed_s - start.elapsed_s);
        let setup = if nproc == 1 { "workbook, single process".to_string() } else { format!("workbook, DDP on {nproc} CPU ranks") };
        let threads = nproc * trainer::kernel_threads();
        println!("{}", serde_json::json!({ "setup": setup, "nproc": nproc, "threads": threads, "tokens_per_s": tokens_per_s }));
    }
    Ok(())
}
