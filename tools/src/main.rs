//! The workbook's tools for CI, its authors and its benchmarks: the check
//! of the exercise set (`verify`), the lists written from its metadata
//! (`update`), the guide's figures, the bundled stories, the memory
//! estimate, the machine report, the checks against transformers and the
//! benchmarks. Each is reached through `cargo xtask <command>`, which hands
//! it to this program, so that the learner's runner (xtask/) holds only what
//! a learner runs.

mod bench;
mod bench_allreduce;
mod bench_fsdp;
mod bench_loop;
mod bench_phase4;
mod code_width;
mod doctor;
mod estimate;
mod figures;
mod interop;
mod matrix;
mod planted;
mod python;
mod quoted;
mod registry;
mod stories;
mod verify;

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use xtask::render;
use xtask::workspace::Workspace;

/// The workbook's tools for CI and its authors: checks, figures, stories, estimates, benchmarks.
#[derive(Parser)]
#[command(name = "cargo xtask", bin_name = "cargo xtask", arg_required_else_help = true)]
struct Cli {
    #[command(subcommand)]
    command: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Say what this machine has (cores, CUDA devices, GPU libraries) and where each kind of check runs.
    Doctor,
    /// Check the exercise set itself: metadata, solutions pass, stubs fail, guide builds (for CI).
    Verify {
        /// Only plant the natural mistakes (solutions/natural.toml) and count how often each is named.
        #[arg(long)]
        natural: bool,
        /// Only plant the mistakes of exercise N (repeatable): the quick check while writing them.
        #[arg(long = "exercise", value_name = "N")]
        exercises: Vec<u32>,
    },
    /// Write the lists that follow from exercises/info.toml: src/exercises.rs, the graded
    /// tests' module list and the guide's SUMMARY.md (for whoever adds an exercise).
    Update,
    /// Draw the guide's figures (guide/src/figures/) and write the numbers its chapters quote
    /// (guide/src/numbers/) from the runs recorded in guide/figure-data/ and benchmarks/results.md.
    Figures {
        /// Record those runs again first, with the reference trainer (a few minutes).
        #[arg(long)]
        record: bool,
    },
    /// Write datasets/tinystories_sample.txt again from its generator (after changing the grammar).
    SampleStories,
    /// Estimate training memory per GPU by component, for a model, precision, strategy and GPU count.
    Estimate(EstimateArgs),
    /// Check checkpoints against Hugging Face transformers both ways: export (AutoModelForCausalLM and
    /// AutoTokenizer load a checkpoint directory) and import (infer runs a Llama transformers saved).
    /// Needs a Python with torch and transformers (WORKBOOK_PYTHON).
    Interop,
    /// Train every data-parallel axis (ddp, zero1, zero2, fsdp, hsdp) on every mesh of tp 1-2 × pp 1-2
    /// as processes, compare each with one process, and write benchmarks/matrix.md (about a minute).
    Matrix {
        /// Optimizer steps per run.
        #[arg(long, default_value_t = 10)]
        steps: usize,
    },
    /// Measure the reference trainer's tokens/s beside PyTorch's (or, with `fsdp`, each ZeRO
    /// stage's memory and traffic per rank beside the formulas; with `phase4`, what each Phase 4
    /// exercise buys inside the trainer; with `mesh`, the parallelisms composed on four processes;
    /// with `allreduce`, the ring's bus bandwidth beside gloo's; with `loop`, the first verdict
    /// on a fresh clone and the edit → verdict loop) and write benchmarks/results.md.
    Bench {
        /// `throughput` (the default), `fsdp`, `phase4`, `mesh`, `allreduce` or `loop`.
        #[arg(value_enum, default_value = "throughput")]
        what: BenchKind,
        /// A config in configs/: tiny, small or medium.
        #[arg(long, default_value = "tiny")]
        model_size: String,
        /// Timed optimizer steps per setup.
        #[arg(long, default_value_t = 40)]
        steps: usize,
        /// Timed steps per setup at GPT-2 124M's shape (seconds each; 0 skips that shape).
        #[arg(long, default_value_t = 8)]
        large_steps: usize,
        /// Rounds of every setup, interleaved; the table reports medians.
        #[arg(long, default_value_t = 3)]
        rounds: usize,
    },
}

/// What `cargo xtask bench` measures.
#[derive(Clone, Copy, clap::ValueEnum)]
enum BenchKind {
    Throughput,
    Fsdp,
    Phase4,
    Mesh,
    Allreduce,
    Loop,
}

/// `cargo xtask estimate`'s options; the model is given by its size or its shape.
#[derive(clap::Args)]
struct EstimateArgs {
    /// Parameters, e.g. 7e9 (default: counted exactly from the shape below, the workbook's Llama-style GPT).
    #[arg(long, value_parser = positive)]
    params: Option<f64>,
    #[arg(long, default_value_t = 32, value_parser = at_least_one)]
    layers: usize,
    #[arg(long, default_value_t = 4096, value_parser = at_least_one)]
    hidden: usize,
    /// The SwiGLU MLP's width (default: Llama's, 8·hidden/3 rounded up to a multiple of 256;
    /// the tiny config uses 352).
    #[arg(long, value_parser = at_least_one)]
    intermediate: Option<usize>,
    #[arg(long, default_value_t = 32, value_parser = at_least_one)]
    heads: usize,
    #[arg(long, default_value_t = 32000, value_parser = at_least_one)]
    vocab: usize,
    #[arg(long, default_value_t = 2048, value_parser = at_least_one)]
    seq_len: usize,
    /// Sequences per GPU per micro-batch.
    #[arg(long, default_value_t = 1, value_parser = at_least_one)]
    micro_batch: usize,
    #[arg(long, value_enum, default_value = "bf16")]
    precision: estimate::Precision,
    #[arg(long, value_enum, default_value = "adamw")]
    optimizer: estimate::Optimizer,
    /// ddp, zero1, zero2 or zero3 (FSDP's no_shard, shard_grad_op, full_shard also work).
    #[arg(long, value_enum, default_value = "ddp")]
    strategy: estimate::Strategy,
    #[arg(long, default_value_t = 1, value_parser = at_least_one)]
    gpus: usize,
    /// Tensor-parallel ranks each block is split across (Megatron style; the embedding and head stay whole).
    #[arg(long, default_value_t = 1, value_parser = at_least_one)]
    tp: usize,
    /// Pipeline stages (1F1B); --gpus / (tp · pp) ranks are data-parallel, and ZeRO shards across them.
    #[arg(long, default_value_t = 1, value_parser = at_least_one)]
    pp: usize,
    #[arg(long)]
    activation_checkpointing: bool,
    /// The GPU's memory in GB: say whether the run fits (exit 1 if not).
    #[arg(long, value_parser = positive)]
    gpu_memory: Option<f64>,
}

/// A size or a count: 0 of anything makes no model and no job.
fn at_least_one(text: &str) -> Result<usize, String> {
    match text.trim().parse::<usize>() {
        Ok(0) => Err("must be at least 1".to_string()),
        Ok(n) => Ok(n),
        Err(_) => Err(format!("`{text}` is not a whole number")),
    }
}

/// A positive, finite amount (parameters, gigabytes).
fn positive(text: &str) -> Result<f64, String> {
    match text.trim().parse::<f64>() {
        Ok(x) if x.is_finite() && x > 0.0 => Ok(x),
        _ => Err(format!("`{text}` is not a positive number")),
    }
}

impl EstimateArgs {
    fn intermediate(&self) -> usize {
        self.intermediate.unwrap_or_else(|| estimate::llama_intermediate(self.hidden))
    }

    fn setup(&self) -> estimate::Setup {
        let counted = || estimate::model_params(self.layers, self.hidden, self.intermediate(), self.vocab);
        estimate::Setup {
            params: self.params.unwrap_or_else(counted),
            layers: self.layers,
            hidden: self.hidden,
            intermediate: self.intermediate(),
            heads: self.heads,
            vocab: self.vocab,
            seq_len: self.seq_len,
            micro_batch: self.micro_batch,
            precision: self.precision,
            optimizer: self.optimizer,
            strategy: self.strategy,
            gpus: self.gpus,
            tp: self.tp,
            pp: self.pp,
            activation_checkpointing: self.activation_checkpointing,
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(error) => {
            eprintln!("{} {error:#}", render::red("error:"));
            ExitCode::FAILURE
        }
    }
}

/// Runs one task; `Ok(false)` means it ran but something did not pass.
fn run(cli: Cli) -> anyhow::Result<bool> {
    let ws = Workspace::open(false)?;
    match cli.command {
        Task::Doctor => doctor::doctor(),
        Task::Verify { natural: false, exercises } if exercises.is_empty() => verify::verify(&ws),
        Task::Verify { natural: false, exercises } => verify::planted_only(&ws, &exercises),
        Task::Verify { natural: true, exercises } => verify::natural(&ws, &exercises),
        Task::Update => registry::update(&ws).map(|()| true),
        Task::Figures { record } => figures::figures(&ws, record),
        Task::SampleStories => stories::write_sample(&ws.root).map(|()| true),
        Task::Interop => interop::interop(&ws),
        Task::Matrix { steps } => matrix::matrix(&ws, steps),
        Task::Estimate(args) => estimate::report(&args.setup(), args.gpu_memory),
        Task::Bench { what: BenchKind::Throughput, model_size, steps, large_steps, rounds } => {
            bench::bench(&ws, &model_size, steps, large_steps, rounds)
        }
        Task::Bench { what: BenchKind::Fsdp, .. } => bench_fsdp::bench_fsdp(&ws),
        Task::Bench { what: BenchKind::Allreduce, rounds, .. } => bench_allreduce::bench_allreduce(&ws, rounds),
        Task::Bench { what: BenchKind::Loop, rounds, .. } => bench_loop::bench_loop(&ws, rounds),
        Task::Bench { what: BenchKind::Mesh, model_size, steps, rounds, .. } => {
            bench_phase4::bench_mesh(&ws, &model_size, steps, rounds)
        }
        Task::Bench { what: BenchKind::Phase4, model_size, steps, large_steps, rounds } => {
            bench_phase4::bench_phase4(&ws, &model_size, steps, large_steps, rounds)
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::Cli;

    /// NaN, infinite or zero sizes would print nonsense: they are refused by name.
    #[test]
    fn estimate_refuses_sizes_that_make_no_model() {
        for (flag, bad, says) in [
            ("--params", "NaN", "`NaN` is not a positive number"),
            ("--params", "inf", "`inf` is not a positive number"),
            ("--gpu-memory", "0", "`0` is not a positive number"),
            ("--hidden", "0", "must be at least 1"),
            ("--gpus", "0", "must be at least 1"),
            ("--seq-len", "0", "must be at least 1"),
        ] {
            let error = Cli::try_parse_from(["tools", "estimate", flag, bad]).err().expect("refused");
            assert!(error.to_string().contains(says), "{flag} {bad}: {error}");
        }
        assert!(Cli::try_parse_from(["tools", "estimate", "--params", "7e9", "--gpus", "8"]).is_ok());
    }
}
