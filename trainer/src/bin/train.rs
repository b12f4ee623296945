//! `train`: train a GPT on text, on one process or on N ranks under DDP or FSDP.
//!
//! `cargo run --release -p trainer --bin train -- --model-size tiny --max-steps 300`
//!
//! With `--nproc N` (or `--nnodes`), it starts itself again as the job's ranks,
//! one process each, through the launcher; each rank then trains as one
//! member of the job.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use trainer::checkpoints;
use trainer::compute::ComputeArgs;
use trainer::config::workbook_root;
use trainer::config::{at_least_one, parsed, RunConfig};
use trainer::launching::{LaunchArgs, RankKind};
use trainer::layout_flags::LayoutFlags;
use trainer::model_dir::ModelDir;
use trainer::report;
use trainer::run::{open_dataset, peak_memory_mib, recorded_data_path, rows_to_split, train, RunOptions};
use trainer::RankThreads;
use workbook::data::{DataConfig, DatasetKind, SAMPLE_PATH};
use workbook::distributed::DistEnv;
use workbook::words::count;

/// Train a GPT. Defaults come from configs/<model-size>.toml; flags override them.
#[derive(Parser)]
#[command(name = "train", version, allow_negative_numbers = true)]
struct Args {
    /// tiny, small, medium, or the path of a config file.
    #[arg(long, default_value = "tiny")]
    model_size: String,
    /// dummy (random tokens), tinystories or openwebtext.
    #[arg(long, default_value = "tinystories", value_parser = parsed::<DatasetKind>)]
    dataset: DatasetKind,
    /// The text file. Default: datasets/TinyStoriesV2-GPT4-train.txt (the bundled sample until that is
    /// downloaded) or datasets/owt_train.txt. It is tokenised once into <file>.<tokenizer>.tokens
    /// beside it, which later runs read instead.
    #[arg(long)]
    data_path: Option<PathBuf>,
    /// bytes or gpt2 (default: the config's).
    #[arg(long)]
    tokenizer: Option<String>,
    #[arg(long)]
    max_steps: Option<usize>,
    /// Sequences per micro-batch, over all ranks together.
    #[arg(long)]
    batch_size: Option<usize>,
    #[arg(long)]
    seq_len: Option<usize>,
    /// Micro-batches per optimizer step.
    #[arg(long)]
    grad_accum: Option<usize>,
    /// Peak learning rate.
    #[arg(long)]
    lr: Option<f64>,
    #[arg(long)]
    warmup_steps: Option<usize>,
    /// Ranks and where they run: --nproc N on this machine; --nnodes,
    /// --node-rank, --master-addr and --master-port across machines.
    #[command(flatten)]
    launch: LaunchArgs,
    /// Run the ranks as processes (the default) or as threads of this one.
    #[arg(long, value_enum, default_value_t = RankKind::Processes)]
    ranks: RankKind,
    /// The threads each rank uses (default: this machine's cores / the
    /// ranks on it). Under DDP on the CPU each micro-batch's rows are split
    /// across them, one part per thread; elsewhere they run the tensor
    /// operations. `RAYON_NUM_THREADS`, when set, fixes the latter.
    #[arg(long, value_parser = at_least_one)]
    threads: Option<u64>,
    /// --device and --backend.
    #[command(flatten)]
    compute: ComputeArgs,
    /// Continue from the newest checkpoint in --checkpoint-dir, or from the one given.
    #[arg(long, num_args = 0..=1)]
    resume: Option<Option<PathBuf>>,
    /// Start from the weights of a checkpoint or a Hugging Face Llama
    /// directory (its model shape replaces the config's; the optimizer starts fresh).
    #[arg(long, conflicts_with = "resume")]
    init_from: Option<PathBuf>,
    /// Where checkpoints, metrics.jsonl and loss.svg go.
    #[arg(long, default_value = "checkpoints")]
    checkpoint_dir: PathBuf,
    /// Delete an earlier run's checkpoints in --checkpoint-dir instead of refusing to start.
    #[arg(long, conflicts_with = "resume")]
    overwrite: bool,
    /// Save a checkpoint every this many steps (and after the last).
    #[arg(long, default_value_t = 100, value_parser = at_least_one)]
    checkpoint_every: u64,
    /// How many of the newest checkpoints to keep.
    #[arg(long, default_value_t = 3, value_parser = at_least_one)]
    keep_checkpoints: u64,
    #[arg(long, default_value_t = 1337)]
    seed: u64,
    /// How the ranks share the work: --strategy, --pp, --tp and the flags that go with them.
    #[command(flatten)]
    layout: LayoutFlags,
    /// Run over NCCL what has never run there with two GPUs or more:
    /// subgroups (--pp, --tp, --sharding hybrid_shard) and send_recv (your
    /// exercise 16's ring).
    #[arg(long)]
    unverified_nccl: bool,
    /// Record what every rank did when into <checkpoint-dir>/trace.json, a
    /// Chrome trace (open it in https://ui.perfetto.dev).
    #[arg(long)]
    trace: bool,
    /// Without a terminal, print a line every this many steps.
    #[arg(long, default_value_t = 10, value_parser = at_least_one)]
    log_every: u64,
    /// Hold out the last 1% of the data (never trained on) and print the
    /// loss and perplexity on it before the first step, every N steps and
    /// after the last; metrics.jsonl and loss.svg show it too.
    #[arg(long, value_name = "N", value_parser = at_least_one)]
    eval_every: Option<u64>,
}

/// Counts each rank's heap bytes, so the FSDP ledger can measure activations.
#[global_allocator]
static ALLOCATOR: workbook::memory::CountingAllocator = workbook::memory::CountingAllocator;

fn main() -> ExitCode {
    let args = Args::try_parse().unwrap_or_else(|error| trainer::flag_conflicts::exit_saying_why(error));
    trainer::main_with(|| run(args))
}

fn run(args: Args) -> anyhow::Result<()> {
    args.compute.set_matmul_precision()?;
    let launched = DistEnv::from_env()?;
    let starts_ranks = args.launch.starts_processes(args.ranks)?;
    // One process speaks for the job: rank 0, not the launcher that starts it.
    let is_logger = !starts_ranks && launched.as_ref().is_none_or(|env| env.rank == 0);
    let mut config = RunConfig::load(&args.model_size)?;
    let chosen_tokenizer = args.tokenizer.as_deref().map(str::parse).transpose()?;
    if let Some(dir) = &args.init_from {
        // The shape and the vocabulary are the weights'; the rest stays the
        // config's. Each rank reads its weights later, only those it holds.
        let source = ModelDir::open_where(dir, |_| false)?;
        if is_logger {
            report!(
                "initialising from {}: its weights; the optimizer and the step count start afresh",
                source.dir.display()
            );
        }
        config.model = source.config.clone();
        config.tokenizer = source.tokenizer(chosen_tokenizer)?;
    } else if let Some(tokenizer) = chosen_tokenizer {
        config.set_tokenizer(tokenizer);
    }
    override_with(&mut config.max_steps, args.max_steps);
    override_with(&mut config.batch_size, args.batch_size);
    override_with(&mut config.seq_len, args.seq_len);
    override_with(&mut config.grad_accum_steps, args.grad_accum);
    override_with(&mut config.optimizer.lr, args.lr);
    override_with(&mut config.optimizer.warmup_steps, args.warmup_steps);
    if config.max_steps == 0 {
        anyhow::bail!("--max-steps must be at least 1");
    }
    // Said once the run is known to start, not above an error about something else.
    let mut warmup_note = None;
    if args.warmup_steps.is_none() && config.optimizer.warmup_steps >= config.max_steps {
        config.optimizer.warmup_steps = (config.max_steps / 10).max(1).min(config.max_steps - 1);
        warmup_note = Some(format!(
            "note: warmup shortened to {} to fit --max-steps {}",
            count(config.optimizer.warmup_steps, "step"),
            config.max_steps
        ));
    }
    if args.lr.is_some() {
        config.optimizer.min_lr = config.optimizer.lr / 10.0;
    }
    let kind = args.dataset;
    if kind == DatasetKind::Dummy && args.data_path.is_some() {
        anyhow::bail!("--data-path is not read with --dataset dummy (random tokens); drop one of the two");
    }
    let data_path = match (args.data_path, kind.default_path()) {
        (Some(path), _) => Some(recorded_data_path(&path, workbook_root().ok().as_deref())),
        (None, None) => None,
        (None, Some(default)) => {
            let root = workbook_root()?;
            // Until the real TinyStories is downloaded, train on the bundled sample.
            let sample = kind == DatasetKind::TinyStories && !root.join(default).exists();
            Some(PathBuf::from(if sample { SAMPLE_PATH } else { default }))
        }
    };
    let data =
        DataConfig { kind, path: data_path, tokenizer: config.tokenizer, seq_len: config.seq_len, seed: args.seed };
    // From its second round on, an elastic job continues from its newest checkpoint.
    let continuing = launched.as_ref().and_then(|env| env.elastic_round).is_some_and(|round| round > 0);
    let newest = checkpoints::steps(&args.checkpoint_dir)?.last().copied();
    if let Some(step) = newest.filter(|&step| continuing && step >= config.max_steps) {
        // A rank failed after the last save: the job is done, not to be trained again.
        if is_logger {
            report!("the job reached step {step} before this restart: nothing is left to train");
        }
        return Ok(());
    }
    let resume = match continuing && newest.is_some() {
        true => Some(args.checkpoint_dir.clone()),
        false => args.resume.map(|p| p.unwrap_or_else(|| args.checkpoint_dir.clone())),
    };
    let world_size = launched.as_ref().map_or(args.launch.world_size(), |env| env.world_size);
    let node_size = launched.as_ref().map_or(args.launch.nproc_per_node, |env| env.local_world_size);
    let layout = args.layout.choose(&config, world_size, node_size)?;
    let mut options = RunOptions {
        config,
        data,
        nproc: world_size,
        device: args.compute.device,
        autocast_bf16: args.compute.autocast_bf16,
        batch_threads: 1, // chosen below, once the ranks are started
        backend: args.compute.backend(),
        seed: args.seed,
        out_dir: args.checkpoint_dir,
        checkpoint_every: args.checkpoint_every as usize,
        keep_checkpoints: args.keep_checkpoints as usize,
        resume,
        overwrite: args.overwrite,
        init_from: args.init_from,
        layout,
        unverified_nccl: args.unverified_nccl,
        trace: args.trace,
        log_every: args.log_every as usize,
        eval_every: args.eval_every.map(|n| n as usize),
        timeout: args.launch.config().timeout(),
    };
    trainer::needs::check_finished(&options)?;
    let ranks_here = launched.as_ref().map_or(args.launch.nproc_per_node, |env| env.local_world_size);
    // A launcher checks every size an elastic job may take; a rank, its own.
    let sizes: Vec<usize> = match starts_ranks {
        true => args.launch.world_sizes().collect(),
        false => vec![world_size],
    };
    for size in sizes {
        options.config.validate(options.layout.strategy.mesh(size)?.dp, ranks_here)?;
    }
    if let Some(note) = warmup_note.filter(|_| is_logger) {
        report!("{note}");
    }
    if is_logger || starts_ranks {
        trainer::needs::body_notes(&options).iter().for_each(|note| report!("{note}"));
    }
    if starts_ranks {
        // Rank 0, which writes the checkpoints, runs on node 0: its launcher
        // takes the directory (other nodes may share its filesystem).
        let lock = match args.launch.node_rank {
            0 => Some(checkpoints::take(&options.out_dir, options.resume.is_some(), options.overwrite)?),
            _ => None,
        };
        // Tokenise once here, not in every rank at the same time.
        open_dataset(&options.data)?;
        let code = args.launch.relaunch_self()?;
        // Node 0's launcher holds the directory rank 0 writes.
        if code == workbook::distributed::INTERRUPTED && args.launch.node_rank == 0 {
            if options.out_dir.join(trainer::metrics::METRICS_FILE).is_file() {
                trainer::metrics::draw_loss_curve(&options.out_dir)?;
            }
            report!("{}", interrupted_at(&options.out_dir)?);
        }
        drop(lock); // exit runs no destructor: a failed job's empty directory goes here
        std::process::exit(code);
    }
    let threads = RankThreads::share(ranks_here, args.threads.map(|n| n as usize), rows_to_split(&options));
    threads.apply()?;
    options.batch_threads = threads.batch;
    let summary = train(&options)?;
    if !is_logger {
        return Ok(());
    }
    if let (Some(first), Some(last)) = (summary.first, summary.last) {
        report!(
            "trained {} in {:.0} s: loss {:.3} at step {} -> {:.3} at step {}; {:.0} tokens/s",
            count(last.step - first.step + 1, "step"),
            summary.seconds,
            first.loss,
            first.step,
            last.loss,
            last.step,
            last.tokens_per_s
        );
    }
    if let Some((before, after)) = summary.eval_loss {
        report!("held-out loss {before:.3} -> {after:.3} (perplexity {:.2} -> {:.2})", before.exp(), after.exp());
    }
    if summary.skipped_updates > 0 {
        report!("{} skipped for non-finite gradients", count(summary.skipped_updates as usize, "update"));
    }
    if summary.trailing_skips > 1 {
        report!(
            "the last {} were all skipped: the weights have not changed since step {}, and a run whose every \
             gradient is NaN has diverged; resume from a checkpoint kept from before it, if there is one, or \
             start again, at a lower --lr (the guide's chapter on training stability)",
            count(summary.trailing_skips, "step"),
            summary.steps - summary.trailing_skips
        );
    }
    if let Some(mib) = peak_memory_mib() {
        let host = if summary.gpu_memory_mib.is_some() { " on the host" } else { "" };
        report!("peak memory{host}: {mib:.0} MiB");
    }
    if let Some((used, total)) = summary.gpu_memory_mib {
        report!("GPU memory in use at the end: {used:.0} of {total:.0} MiB (every process's on this GPU)");
    }
    report!("checkpoints, metrics.jsonl, the TensorBoard events and loss.svg are in {}", options.out_dir.display());
    if summary.interrupted {
        report!("{}", interrupted_at(&options.out_dir)?);
        std::process::exit(workbook::distributed::INTERRUPTED);
    }
    Ok(())
}

fn override_with<T>(slot: &mut T, value: Option<T>) {
    if let Some(v) = value {
        *slot = v;
    }
}

/// What to say when the job was interrupted: where it can go on from.
fn interrupted_at(out_dir: &std::path::Path) -> anyhow::Result<String> {
    Ok(match checkpoints::steps(out_dir)?.last() {
        Some(&step) => format!(
            "interrupted: the newest checkpoint is {}; --resume continues from it",
            checkpoints::step_dir(out_dir, step).display()
        ),
        None => format!("interrupted before the first checkpoint: nothing in {} to resume", out_dir.display()),
    })
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    /// A refusal without a reason leaves the learner guessing.
    #[test]
    fn every_pair_of_flags_clap_refuses_has_a_reason() {
        let command = Args::command();
        let flag = |arg: &clap::Arg| format!("--{}", arg.get_long().unwrap_or(arg.get_id().as_str()));
        for arg in command.get_arguments() {
            for other in command.get_arg_conflicts_with(arg) {
                assert!(
                    trainer::flag_conflicts::reason(&flag(arg), &flag(other)).is_some(),
                    "{} and {} conflict without a reason in trainer/src/flag_conflicts.rs",
                    flag(arg),
                    flag(other)
                );
            }
        }
    }
}
