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
use trainer::config::{bucket_cap_bytes, RunConfig};
use trainer::launching::{LaunchArgs, RankKind};
use trainer::model_dir::ModelDir;
use trainer::report;
use trainer::run::{open_dataset, peak_memory_mib, recorded_data_path, rows_to_split, train, RunOptions};
use trainer::strategy::Strategy;
use trainer::RankThreads;
use workbook::data::{DataConfig, DatasetKind, SAMPLE_PATH};
use workbook::distributed::{DistEnv, MeshShape};
use workbook::parallel::ddp::DEFAULT_BUCKET_BYTES;
use workbook::parallel::fsdp::{FsdpConfig, Precision, ShardingStrategy};
use workbook::parallel::pipeline::PipelineSchedule;
use workbook::parallel::DataAxis;
use workbook::words::count;
use workbook::GptConfig;

/// Train a GPT. Defaults come from configs/<model-size>.toml; flags override them.
#[derive(Parser)]
#[command(name = "train")]
struct Args {
    /// tiny, small, medium, or the path of a config file.
    #[arg(long, default_value = "tiny")]
    model_size: String,
    /// dummy (random tokens), tinystories or openwebtext.
    #[arg(long, default_value = "tinystories", value_parser = parsed::<DatasetKind>)]
    dataset: DatasetKind,
    /// The text file. Default: datasets/TinyStoriesV2-GPT4-train.txt (the bundled sample until that is
    /// downloaded) or datasets/owt_train.txt.
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
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
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
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..))]
    checkpoint_every: u64,
    /// How many of the newest checkpoints to keep.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..))]
    keep_checkpoints: u64,
    #[arg(long, default_value_t = 1337)]
    seed: u64,
    /// Recompute each block in backward instead of keeping its activations.
    /// Not with --tp (a split block is stepped forward and backward in one
    /// call, recomputed already), --own-ddp (your wrapper builds its own
    /// model) or FSDP with --pp (its units recompute already).
    #[arg(long)]
    activation_checkpointing: bool,
    /// `ddp` (whole replicas), `zero1` (whole replicas, AdamW's state sharded by your
    /// exercise 17), `zero2` (the gradients sharded too) or `fsdp` (sharded; see
    /// --sharding and --precision).
    #[arg(long, value_enum, default_value_t = StrategyName::Ddp)]
    strategy: StrategyName,
    /// With --strategy fsdp: full_shard (the default), shard_grad_op, no_shard or hybrid_shard.
    #[arg(long, value_parser = parsed::<ShardingStrategy>)]
    sharding: Option<ShardingStrategy>,
    /// With --sharding hybrid_shard: the ranks of one shard group, consecutive
    /// ranks replicated across groups (default: the ranks of one node).
    #[arg(long, value_name = "RANKS")]
    hybrid_group_size: Option<usize>,
    /// With --strategy fsdp: fp32 (the default), bf16 or fp16.
    #[arg(long, value_parser = parsed::<Precision>)]
    precision: Option<Precision>,
    /// With --precision bf16 or fp16: reduce-scatter and accumulate the
    /// gradients in fp32 (PyTorch: MixedPrecision(reduce_dtype=torch.float32)),
    /// at twice the 16-bit reduce's gradient traffic and memory.
    #[arg(long, requires = "precision")]
    reduce_in_fp32: bool,
    /// `ring` all-reduces with your exercise 16 instead of the backend's own ring.
    #[arg(long, value_parser = ["backend", "ring"], default_value = "backend")]
    allreduce: String,
    /// With --strategy ddp: average each matrix gradient as a rank-R PowerSGD
    /// estimate (your exercise 18) instead of whole.
    #[arg(long, value_name = "R", value_parser = clap::value_parser!(u64).range(1..))]
    powersgd_rank: Option<u64>,
    /// Cut the blocks into S pipeline stages, one per rank, stepped by your
    /// exercise 21 on GPipe's schedule or by your exercise 24 on 1F1B's
    /// (--pipeline-schedule); the micro-batches are --grad-accum's. With --tp
    /// T each stage's blocks are split across T ranks. With more ranks than
    /// S·T, the pipeline is replicated across them, data-parallel.
    #[arg(
        long = "pp",
        visible_alias = "pipeline-stages",
        value_name = "S",
        conflicts_with_all = ["precision", "prefetch", "offload", "powersgd_rank", "ddp_overlap"]
    )]
    pipeline_stages: Option<usize>,
    /// Split every block across T tensor-parallel ranks, Megatron style,
    /// run by your exercise 23 (the embedding and head stay whole on
    /// every rank); with --pp, each stage's blocks. With more ranks than T
    /// (or S·T), the group is replicated across them, data-parallel: DDP,
    /// ZeRO-1, or with --strategy fsdp each rank's shards of a block an FSDP
    /// unit across the replicas (FSDP × TP).
    #[arg(
        long = "tp",
        value_name = "T",
        conflicts_with_all = ["precision", "prefetch", "offload", "powersgd_rank", "ddp_overlap"]
    )]
    tensor_parallel: Option<usize>,
    /// With --tp: cut the norms and residuals of every block along the
    /// sequence, each tensor-parallel rank keeping its chunk of the tokens,
    /// run by your exercise 27 (Megatron's sequence parallelism); with
    /// --pp too, within each stage.
    #[arg(long, requires = "tensor_parallel")]
    sequence_parallel: bool,
    /// Data-parallel replicas: inferred as --nproc / (pp · tp); given, it is
    /// checked against that, so that a job laid out by hand fails before it starts.
    #[arg(long = "dp", value_name = "D")]
    data_parallel: Option<usize>,
    /// With --pp: `gpipe` (all forwards, then all backwards) or `1f1b` (one
    /// forward, one backward in turn after a warm-up).
    #[arg(long, value_name = "SCHEDULE", default_value = "gpipe", requires = "pipeline_stages")]
    pipeline_schedule: PipelineSchedule,
    /// With --strategy ddp: all-reduce gradient buckets during backward, with
    /// your exercise 19, instead of after it.
    #[arg(long, conflicts_with = "powersgd_rank")]
    ddp_overlap: bool,
    /// With --strategy ddp: your DataParallel of exercise 26 runs each
    /// micro-batch's forward and backward and averages the gradients, in
    /// buckets of --bucket-cap-mb (over your ring with --allreduce ring).
    #[arg(
        long,
        conflicts_with_all = ["pipeline_stages", "tensor_parallel", "powersgd_rank", "ddp_overlap", "activation_checkpointing"]
    )]
    own_ddp: bool,
    /// With --strategy fsdp: gather the next unit's parameters while the
    /// current one computes, in forward and backward (PyTorch's
    /// forward_prefetch and backward_prefetch=BACKWARD_PRE); two units are
    /// whole at once.
    #[arg(long)]
    prefetch: bool,
    /// With --strategy fsdp: keep AdamW's moments and the f32 master shards
    /// in a file in --checkpoint-dir, read back when the step or an
    /// all-gather needs them (PyTorch's CPUOffload, one level down: the disk).
    #[arg(long)]
    offload: bool,
    /// Where gradients are all-reduced in buckets (--strategy ddp, with or
    /// without --pp/--tp; --own-ddp; the embedding and head under
    /// --strategy fsdp --pp): the most megabytes one all-reduce carries
    /// (PyTorch's bucket_cap_mb) [default: 25].
    #[arg(long = "bucket-cap-mb", value_name = "MB", value_parser = bucket_cap_bytes)]
    bucket_bytes: Option<usize>,
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
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..))]
    log_every: u64,
    /// Hold out the last 1% of the data (never trained on) and print the
    /// loss and perplexity on it before the first step, every N steps and
    /// after the last; metrics.jsonl and loss.svg show it too.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
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
        // The shape and the vocabulary are the weights'; the rest stays the config's.
        let source = ModelDir::open(dir)?;
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
    if args.warmup_steps.is_none() && config.optimizer.warmup_steps >= config.max_steps {
        config.optimizer.warmup_steps = (config.max_steps / 10).max(1).min(config.max_steps - 1);
        if is_logger {
            report!(
                "note: warmup shortened to {} to fit --max-steps {}",
                count(config.optimizer.warmup_steps, "step"),
                config.max_steps
            );
        }
    }
    if args.lr.is_some() {
        config.optimizer.min_lr = config.optimizer.lr / 10.0;
    }
    // Flags that shape one strategy's step, and what each does there.
    let one_strategy_flags = [
        ("--powersgd-rank", args.powersgd_rank.is_some(), StrategyName::Ddp, "it compresses DDP's all-reduces"),
        ("--ddp-overlap", args.ddp_overlap, StrategyName::Ddp, "it all-reduces DDP's buckets during backward"),
        ("--own-ddp", args.own_ddp, StrategyName::Ddp, "your exercise 26 is a DDP"),
        ("--prefetch", args.prefetch, StrategyName::Fsdp, "it gathers the next FSDP unit early"),
        ("--offload", args.offload, StrategyName::Fsdp, "it moves FSDP units' optimizer state to a file"),
    ];
    for (flag, given, only, what) in one_strategy_flags {
        if given && args.strategy != only {
            anyhow::bail!("{flag} applies to --strategy {only} only ({what}), not to --strategy {}", args.strategy);
        }
    }
    // ZeRO-1's gradient goes in one reduce-scatter, plain FSDP's unit by unit: no buckets.
    let on_a_mesh = args.pipeline_stages.is_some() || args.tensor_parallel.is_some();
    let no_buckets = match args.strategy {
        StrategyName::Zero1 => Some("exercise 17 reduce-scatters each rank's gradient whole"),
        StrategyName::Zero2 => Some("each micro-batch's gradient is reduce-scattered whole"),
        StrategyName::Fsdp if !on_a_mesh => Some("each FSDP unit reduce-scatters its own gradient"),
        _ => None,
    };
    if let (Some(why), Some(_)) = (no_buckets, args.bucket_bytes) {
        anyhow::bail!("--bucket-cap-mb sizes DDP's all-reduces; --strategy {} has none ({why})", args.strategy);
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
    let strategy = match (args.pipeline_stages, args.tensor_parallel) {
        (None, None) if args.own_ddp => Strategy::YOUR_DDP,
        (None, None) => {
            let node_size = launched.as_ref().map_or(args.launch.nproc_per_node, |env| env.local_world_size);
            strategy(
                args.strategy,
                args.sharding,
                args.precision,
                args.reduce_in_fp32,
                args.hybrid_group_size,
                node_size,
            )?
        }
        (stages, tp) => {
            let cut = MeshCut {
                stages: stages.unwrap_or(1),
                tp: tp.unwrap_or(1),
                schedule: args.pipeline_schedule,
                sequence_parallel: args.sequence_parallel,
                sharding: args.sharding,
                hybrid_group_size: args.hybrid_group_size,
                activation_checkpointing: args.activation_checkpointing,
            };
            mesh(cut, args.strategy, &config, world_size)?
        }
    };
    if let Some(dp) = args.data_parallel {
        let shape = strategy.mesh(world_size)?;
        MeshShape::new(world_size, Some(dp), Some(shape.pp), Some(shape.tp))
            .map_err(|e| anyhow::anyhow!("--dp {dp}: {e}"))?;
    }
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
        activation_checkpointing: args.activation_checkpointing,
        strategy,
        own_ring: args.allreduce == "ring",
        powersgd_rank: args.powersgd_rank.map(|r| r as usize),
        ddp_overlap: args.ddp_overlap,
        prefetch: args.prefetch,
        offload: args.offload,
        bucket_bytes: args.bucket_bytes.unwrap_or(DEFAULT_BUCKET_BYTES),
        unverified_nccl: args.unverified_nccl,
        trace: args.trace,
        log_every: args.log_every as usize,
        eval_every: args.eval_every.map(|n| n as usize),
        timeout: args.launch.config().timeout(),
    };
    trainer::needs::check_finished(&options)?;
    if is_logger || starts_ranks {
        trainer::needs::body_notes().iter().for_each(|note| report!("{note}"));
    }
    if starts_ranks {
        // Tokenise once here, not in every rank at the same time.
        for world_size in args.launch.world_sizes() {
            options.config.validate(options.strategy.mesh(world_size)?.dp, args.launch.nproc_per_node)?;
        }
        // Rank 0, which writes the checkpoints, runs on node 0: its launcher
        // takes the directory (other nodes may share its filesystem).
        let _lock = match args.launch.node_rank {
            0 => Some(checkpoints::take(&options.out_dir, options.resume.is_some(), options.overwrite)?),
            _ => None,
        };
        open_dataset(&options.data)?;
        let code = args.launch.relaunch_self()?;
        std::process::exit(code);
    }
    let ranks_here = launched.as_ref().map_or(args.launch.nproc_per_node, |env| env.local_world_size);
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
        report!("{} update(s) skipped for non-finite gradients", summary.skipped_updates);
    }
    if let Some(mib) = peak_memory_mib() {
        let host = if summary.gpu_memory_mib.is_some() { " on the host" } else { "" };
        report!("peak memory{host}: {mib:.0} MiB");
    }
    if let Some((used, total)) = summary.gpu_memory_mib {
        report!("GPU memory in use at the end: {used:.0} of {total:.0} MiB (every process's on this GPU)");
    }
    report!("checkpoints, metrics.jsonl, the TensorBoard events and loss.svg are in {}", options.out_dir.display());
    Ok(())
}

/// `--strategy`: how the replicas share the work; with `--pp` or `--tp`, the
/// mesh's data-parallel axis.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum StrategyName {
    /// Whole replicas, gradients all-reduced.
    Ddp,
    /// Whole replicas, AdamW's state sharded by your exercise 17; with --pp
    /// or --tp, sharded across the replicas of the mesh.
    Zero1,
    /// As zero1, and each micro-batch's gradient reduce-scattered as soon as
    /// its backward ends, each rank keeping its shard only; with --tp, not --pp.
    Zero2,
    /// Sharded units (see --sharding and --precision).
    Fsdp,
}

impl std::fmt::Display for StrategyName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = clap::ValueEnum::to_possible_value(self).expect("no value is skipped");
        f.write_str(name.get_name())
    }
}

/// A flag's value parsed by the type's own `FromStr`, whose error says what it takes.
fn parsed<T: std::str::FromStr>(text: &str) -> Result<T, String>
where
    T::Err: std::fmt::Display,
{
    text.parse().map_err(|e: T::Err| e.to_string())
}

/// The strategy `--strategy` names, with its FSDP options; `node_size` ranks share a machine.
fn strategy(
    name: StrategyName,
    sharding: Option<ShardingStrategy>,
    precision: Option<Precision>,
    reduce_in_fp32: bool,
    hybrid_group_size: Option<usize>,
    node_size: usize,
) -> anyhow::Result<Strategy> {
    match name {
        StrategyName::Ddp | StrategyName::Zero1 | StrategyName::Zero2 => {
            let given = [
                ("--sharding", sharding.is_some()),
                ("--precision", precision.is_some()),
                ("--reduce-in-fp32", reduce_in_fp32),
                ("--hybrid-group-size", hybrid_group_size.is_some()),
            ];
            if let Some((flag, _)) = given.iter().find(|(_, given)| *given) {
                anyhow::bail!("{flag} applies to --strategy fsdp only; {name} keeps whole f32 replicas");
            }
            Ok(match name {
                StrategyName::Ddp => Strategy::Ddp,
                StrategyName::Zero1 => Strategy::ZERO1,
                _ => Strategy::ZERO2,
            })
        }
        StrategyName::Fsdp => {
            let sharding = sharding.unwrap_or(ShardingStrategy::FullShard);
            let hybrid = sharding == ShardingStrategy::HybridShard;
            if hybrid_group_size.is_some() && !hybrid {
                anyhow::bail!("--hybrid-group-size applies to --sharding hybrid_shard only");
            }
            // A node's ranks by default: the launcher numbers them consecutively.
            let hybrid_group_size = hybrid.then_some(hybrid_group_size.unwrap_or(node_size));
            let precision = precision.unwrap_or(Precision::Fp32);
            if reduce_in_fp32 && precision == Precision::Fp32 {
                anyhow::bail!(
                    "--precision fp32 reduces the gradients in fp32 already: --reduce-in-fp32 goes with bf16 or fp16"
                );
            }
            Ok(Strategy::Fsdp(FsdpConfig { sharding, precision, hybrid_group_size, reduce_in_f32: reduce_in_fp32 }))
        }
    }
}

/// What `--pp`, `--tp`, `--pipeline-schedule` and `--sequence-parallel` ask for.
struct MeshCut {
    stages: usize,
    tp: usize,
    schedule: PipelineSchedule,
    sequence_parallel: bool,
    /// Under --strategy fsdp: how the replicas shard each stage's blocks.
    sharding: Option<ShardingStrategy>,
    hybrid_group_size: Option<usize>,
    activation_checkpointing: bool,
}

/// The mesh `cut` lays `world_size` ranks out on, checked against the model.
fn mesh(cut: MeshCut, strategy: StrategyName, config: &RunConfig, world_size: usize) -> anyhow::Result<Strategy> {
    let MeshCut { stages, tp, schedule, sequence_parallel, sharding, hybrid_group_size, activation_checkpointing } =
        cut;
    let flags = match (stages, tp) {
        (1, _) => format!("--tp {tp}"),
        (_, 1) => format!("--pp {stages}"),
        _ => format!("--pp {stages} --tp {tp}"),
    };
    if strategy != StrategyName::Fsdp {
        let given = [("--sharding", sharding.is_some()), ("--hybrid-group-size", hybrid_group_size.is_some())];
        if let Some((flag, _)) = given.iter().find(|(_, given)| *given) {
            anyhow::bail!("{flag} applies to --strategy fsdp only; {strategy} keeps whole f32 replicas");
        }
    }
    let data = match strategy {
        StrategyName::Ddp => DataAxis::Replicate,
        StrategyName::Zero1 => DataAxis::ShardOptimizer,
        StrategyName::Zero2 if stages > 1 => anyhow::bail!(
            "--strategy zero2 with {flags}: ZeRO-2 reduce-scatters each micro-batch's gradient as soon as its \
             backward ends, and a pipeline's schedule holds a stage's gradients over all its micro-batches \
             (DeepSpeed's pipeline engine refuses the same pair); use --strategy zero1 with --pp"
        ),
        StrategyName::Zero2 => DataAxis::ShardGradients,
        StrategyName::Fsdp => fsdp_on_a_pipeline(&flags, sharding, hybrid_group_size)?,
    };
    if activation_checkpointing && matches!(data, DataAxis::ShardBlocks { .. }) {
        anyhow::bail!(
            "--activation-checkpointing with --strategy fsdp {flags}: each FSDP unit is recomputed in backward \
             already (exercise 22 replays it from its input); drop --activation-checkpointing"
        );
    }
    if tp > 1 {
        check_tensor_split(tp, &config.model)?;
    }
    if sequence_parallel && !config.seq_len.is_multiple_of(tp) {
        anyhow::bail!(
            "--sequence-parallel cuts each sequence of {} tokens into {tp} chunks, one per tensor-parallel rank: \
             use a --seq-len that {tp} divides",
            config.seq_len
        );
    }
    let strategy = Strategy::Mesh { stages, tp, schedule, sequence_parallel, data };
    strategy.mesh(world_size).map_err(|e| anyhow::anyhow!("{flags}: {e}"))?;
    Ok(strategy)
}

/// What the replicas of a pipeline's stages shard under --strategy fsdp:
/// each block, across all of them (FULL_SHARD) or across groups of
/// `--hybrid-group-size` (HYBRID_SHARD).
fn fsdp_on_a_pipeline(
    flags: &str,
    sharding: Option<ShardingStrategy>,
    hybrid_group_size: Option<usize>,
) -> anyhow::Result<DataAxis> {
    match (sharding.unwrap_or(ShardingStrategy::FullShard), hybrid_group_size) {
        (ShardingStrategy::FullShard, None) => Ok(DataAxis::ShardBlocks { shard_group: None }),
        (ShardingStrategy::FullShard, Some(_)) => {
            anyhow::bail!("--hybrid-group-size applies to --sharding hybrid_shard only")
        }
        (ShardingStrategy::HybridShard, Some(size)) => Ok(DataAxis::ShardBlocks { shard_group: Some(size) }),
        (ShardingStrategy::HybridShard, None) => anyhow::bail!(
            "--sharding hybrid_shard with {flags} needs --hybrid-group-size: how many replicas of a stage share \
             one set of shards"
        ),
        (other, _) => anyhow::bail!(
            "{flags} with --strategy fsdp shards each stage's blocks as full_shard or hybrid_shard; --sharding \
             {other} is built for FSDP without --pp or --tp only"
        ),
    }
}

/// Refuses a `model` whose blocks do not split evenly across `ranks` tensor-parallel ranks.
fn check_tensor_split(ranks: usize, model: &GptConfig) -> anyhow::Result<()> {
    let cut =
        [("heads", model.num_heads), ("key/value heads", model.kv_heads()), ("MLP units", model.intermediate_size)];
    if let Some((what, count)) = cut.iter().find(|(_, count)| !count.is_multiple_of(ranks)) {
        anyhow::bail!(
            "--tp {ranks}: the model's {count} {what} do not split evenly across {ranks} ranks: use a --tp that divides {count}"
        );
    }
    if model.bias {
        anyhow::bail!("--tp takes a model without biases: a row-parallel layer's bias would be added once per rank");
    }
    Ok(())
}

fn override_with<T>(slot: &mut T, value: Option<T>) {
    if let Some(v) = value {
        *slot = v;
    }
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
