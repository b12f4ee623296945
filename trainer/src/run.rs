//! One training run: open the data, start the ranks, step, log, checkpoint.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use candle_core::{Device, Tensor};
use indicatif::{ProgressBar, ProgressStyle};
use workbook::data::{DataConfig, Dataset, DistributedSampler};
use workbook::distributed::{
    all_reduce_scalar, catch_interrupts, interrupted, spawn_with_timeout, while_busy, Again, DeviceMesh, DistEnv,
    OwnRing, ProcessGroup, ReduceOp, SingleProcess,
};
use workbook::model::{init_params_where, param_specs};
use workbook::parallel::ddp::Ddp;
use workbook::parallel::pipeline::stage_holding;
use workbook::parallel::tensor::BlockStep;
use workbook::parallel::{MeshPlan, MeshTrainer};
use workbook::timeline;
use workbook::train::{faults, Checkpoint, DataPosition, StepStats, Train, Trainer};
use workbook::words::count;
use workbook::ParamStore;

use crate::banner;
use crate::checkpoints;
use crate::compute::{self, Backend, DeviceKind};
use crate::config::{workbook_root, RunConfig};
use crate::eval::{evaluate, HeldOut};
use crate::metrics::{self, MetricsLog, StepRecord, METRICS_FILE};
use crate::model_dir::ModelDir;
use crate::report;
use crate::strategy::{Layout, Strategy};

/// Everything a run needs besides its config file.
#[derive(Debug, Clone)]
pub struct RunOptions {
    pub config: RunConfig,
    pub data: DataConfig,
    pub nproc: usize,
    /// The CPU, or one GPU per rank.
    pub device: DeviceKind,
    /// The model's projections and head multiply in bf16 (`--autocast-bf16`).
    pub autocast_bf16: bool,
    /// Split each micro-batch's rows across up to this many threads of each
    /// rank, where the run can ([`rows_to_split`]); see [`crate::RankThreads`].
    pub batch_threads: usize,
    /// What carries the collectives when ranks are processes.
    pub backend: Backend,
    pub seed: u64,
    /// Where checkpoints, `metrics.jsonl` and `loss.svg` go.
    pub out_dir: PathBuf,
    pub checkpoint_every: usize,
    pub keep_checkpoints: usize,
    /// A checkpoint (or a directory of them, newest taken) to continue from.
    pub resume: Option<PathBuf>,
    /// Delete an earlier run's checkpoints in `out_dir` instead of refusing to start.
    pub overwrite: bool,
    /// Start from these weights (a checkpoint or a Hugging Face Llama
    /// directory) instead of a fresh initialisation; `config.model` must be theirs.
    pub init_from: Option<PathBuf>,
    /// How the ranks share the work.
    pub layout: Layout,
    /// Record a timeline of every rank's steps and communication into
    /// `out_dir/trace.json` (a Chrome trace, see `workbook::timeline`).
    pub trace: bool,
    /// Print a line every this many steps when no progress bar is shown.
    pub log_every: usize,
    /// Hold out the end of the data and measure the loss on it every this
    /// many steps (and before the first and after the last).
    pub eval_every: Option<usize>,
    /// Run over NCCL what has never run there with two GPUs or more: a
    /// mesh's subgroups (pipelines, tensor parallelism) and exercise 16's ring.
    pub unverified_nccl: bool,
    /// The longest a rank waits for another in a collective, when ranks are threads
    /// (processes read theirs from `WORKBOOK_TIMEOUT_S`, set by the launcher).
    pub timeout: Duration,
}

/// What a finished run reports.
#[derive(Debug, Clone)]
pub struct Summary {
    pub first: Option<StepRecord>,
    pub last: Option<StepRecord>,
    pub steps: usize,
    pub skipped_updates: u64,
    /// How many of the last steps in a row were skipped.
    pub trailing_skips: usize,
    /// Whether a Ctrl-C stopped the run before `--max-steps`.
    pub interrupted: bool,
    pub seconds: f64,
    pub num_params: usize,
    /// The tensor bytes this rank sent to other ranks per optimizer step, on
    /// average over the steps this run trained (the loss it logs left out).
    pub sent_bytes_per_step: f64,
    /// MiB in use on this rank's GPU at the end, and the GPU's total.
    pub gpu_memory_mib: Option<(f64, f64)>,
    /// The held-out loss before this run's first step and after its last
    /// (with `eval_every`).
    pub eval_loss: Option<(f64, f64)>,
}

/// Trains as `options` says: as one rank of a job when this process was
/// started as one (by the launcher: `RANK` and the rest are set), otherwise
/// on one process or on `nproc` ranks that are threads of this one.
pub fn train(options: &RunOptions) -> Result<Summary> {
    let launched = DistEnv::from_env()?;
    if let Some(env) = &launched {
        if env.world_size != options.nproc {
            bail!(
                "this rank was started in a job of {} ranks (WORLD_SIZE), but the run asks for {}",
                env.world_size,
                options.nproc
            );
        }
    }
    // Thread ranks all share this machine; a launched rank learns how many do from its launcher.
    let ranks_here = launched.as_ref().map_or(options.nproc, |env| env.local_world_size);
    options.config.validate(options.layout.strategy.mesh(options.nproc)?.dp, ranks_here)?;
    options.backend.check(options.device)?;
    if options.backend == Backend::Nccl && launched.is_none() && options.nproc > 1 {
        bail!("NCCL's ranks are processes, one per GPU: drop --ranks threads, or use --backend tcp");
    }
    // A rank started by a launcher finds the directory already taken by it.
    let _lock = match launched {
        None => Some(checkpoints::take(&options.out_dir, options.resume.is_some(), options.overwrite)?),
        Some(_) => None,
    };
    std::fs::create_dir_all(&options.out_dir)
        .with_context(|| format!("cannot create {}", options.out_dir.display()))?;
    let dataset = open_dataset(&options.data)?;
    if dataset.num_windows() < options.config.batch_size {
        bail!(
            "the data makes {} windows of {} tokens, fewer than one batch of {}: every batch would repeat \
             windows; use more text, a smaller --batch-size or a shorter --seq-len",
            dataset.num_windows(),
            dataset.seq_len(),
            options.config.batch_size
        );
    }
    if let Some(env) = launched {
        let device = compute::rank_device(options.device, env.local_rank, options.backend)?;
        let pg = compute::join(&env, options.backend, &device)?;
        return run_rank(options, &dataset, pg, &device);
    }
    if options.nproc == 1 {
        let device = compute::rank_device(options.device, 0, options.backend)?;
        return run_rank(options, &dataset, Box::new(SingleProcess::new()), &device);
    }
    let mut summaries = spawn_with_timeout(options.nproc, options.timeout, |pg| {
        let run = || {
            let device = compute::rank_device(options.device, pg.rank(), options.backend)?;
            run_rank(options, &dataset, Box::new(pg), &device)
        };
        run().map_err(|e| candle_core::Error::Msg(format!("{e:#}")))
    })?;
    Ok(summaries.swap_remove(0))
}

/// Opens (and on first use tokenises) the run's data. A launcher calls it
/// before starting the ranks, so that they find the token file ready.
pub fn open_dataset(config: &DataConfig) -> Result<Dataset> {
    let config = resolved(config)?;
    let bar = ProgressBar::new(0).with_style(
        ProgressStyle::with_template("tokenising {bar:30} {bytes}/{total_bytes} ({eta})").expect("valid template"),
    );
    let mut report = |p: workbook::data::Progress| {
        bar.set_length(p.bytes_total);
        bar.set_position(p.bytes_done);
    };
    let dataset = Dataset::open(&config, Some(&mut report))?;
    bar.finish_and_clear();
    Ok(dataset)
}

/// One rank's run on `device`: its trainer, by strategy, driven by [`drive`].
fn run_rank(options: &RunOptions, dataset: &Dataset, pg: Box<dyn ProcessGroup>, device: &Device) -> Result<Summary> {
    // What NCCL has never run with two GPUs is refused where it is called.
    workbook::distributed::allow_unverified_nccl(options.unverified_nccl);
    let pg: Box<dyn ProcessGroup> = if options.layout.own_ring { Box::new(OwnRing::around(pg)) } else { pg };
    workbook::model::set_autocast_bf16(options.autocast_bf16);
    let model_config = options.config.model.clone();
    let num_params = param_specs(&model_config).iter().map(|spec| spec.shape.elem_count()).sum();
    let train_config = options.config.train_config(options.layout.activation_checkpointing);
    if options.layout.strategy.shards() {
        // Memory is the point of sharding: freed blocks go back to the OS.
        workbook::memory::return_large_blocks();
    }
    match options.layout.strategy {
        Strategy::Ddp => {
            let ddp = match options.layout.powersgd_rank {
                Some(rank) => Ddp::new(pg).with_powersgd(rank),
                None => Ddp::new(pg),
            };
            let ddp = ddp.with_bucket_bytes(options.layout.bucket_bytes);
            let ddp = if options.layout.ddp_overlap { ddp.with_overlap() } else { ddp };
            let trainer = Trainer::new(&model_config, model_params(options, device, |_| true)?, train_config, ddp)?;
            let trainer = trainer.split_batches_across(options.batch_parts())?;
            drive(options, dataset, trainer, device, num_params)
        }
        Strategy::Mesh { schedule, sequence_parallel, data, .. } => {
            // One data-parallel axis needs no layout (nor subgroups).
            let mesh = match options.layout.strategy.cuts_the_model() {
                true => DeviceMesh::new(pg, options.layout.strategy.mesh(options.nproc)?)?,
                false => DeviceMesh::data_parallel(pg),
            };
            let block_step = if sequence_parallel { BlockStep::SequenceParallel } else { BlockStep::TensorParallel };
            let plan = MeshPlan { schedule, block_step, data_axis: data, bucket_bytes: options.layout.bucket_bytes };
            // A rank builds only its stage's parameters, and keeps only its own part of those.
            let (stages, stage) = (mesh.shape().pp, mesh.coords().pp);
            let params = model_params(options, device, |name| stage_holding(&model_config, stages, name) == stage)?;
            let trainer = MeshTrainer::new(&model_config, &params, train_config, mesh, plan)?;
            drop(params);
            let trainer = if options.layout.prefetch { trainer.with_prefetch()? } else { trainer };
            let trainer = if options.layout.offload { trainer.with_offload(&options.out_dir)? } else { trainer };
            let trainer = match options.layout.powersgd_rank {
                Some(rank) => trainer.with_powersgd(rank)?,
                None => trainer,
            };
            drive(options, dataset, trainer, device, num_params)
        }
    }
}

/// The model's parameters that `keep` names, on `device`: from `--init-from`,
/// or drawn from the run's seed (the same numbers on every device and
/// whatever is kept).
fn model_params(options: &RunOptions, device: &Device, keep: impl Fn(&str) -> bool) -> Result<ParamStore> {
    Ok(match &options.init_from {
        Some(dir) => {
            let kept = ModelDir::open_where(dir, keep)?.params.into_iter();
            ParamStore::from_tensors(
                kept.map(|(name, t)| Ok((name, t.to_device(device)?))).collect::<Result<Vec<_>>>()?,
            )?
        }
        None => init_params_where(&options.config.model, options.seed, device, keep)
            .map_err(|e| anyhow!("initialising the model: {e}"))?,
    })
}

impl RunOptions {
    /// The parts each rank's micro-batches are split into: `batch_threads`,
    /// where the run can split them at all ([`rows_to_split`]).
    pub fn batch_parts(&self) -> usize {
        self.batch_threads.min(rows_to_split(self))
    }
}

/// How many parts each rank's micro-batches can be split into across its
/// threads: its rows under plain DDP on the CPU, else 1 (the other
/// strategies run their batches whole; overlapped DDP takes backward a block
/// at a time; a GPU's threads would only queue on its one compute stream).
pub fn rows_to_split(options: &RunOptions) -> usize {
    let splits =
        options.layout.strategy == Strategy::Ddp && !options.layout.ddp_overlap && options.device == DeviceKind::Cpu;
    if splits {
        options.config.batch_size / options.nproc.max(1)
    } else {
        1
    }
}

/// The loop one rank runs on `device`; rank 0 also logs and writes checkpoints.
fn drive(
    options: &RunOptions,
    dataset: &Dataset,
    mut trainer: impl Train,
    device: &Device,
    num_params: usize,
) -> Result<Summary> {
    let (rank, world) = (trainer.process_group().rank(), trainer.process_group().world_size());
    let is_logger = rank == 0;
    // A lone process owns its job (a launcher owns a job of processes): a
    // Ctrl-C stops it once the step in flight is done, a second one at once.
    let lone = world == 1 && DistEnv::from_env()?.is_none();
    if lone {
        catch_interrupts(Again::Ends);
    }
    let mut was_interrupted = false;
    // The ranks that split the data: the replicas; the stages of one pipeline read the same batch.
    let (data_rank, data_ranks) = trainer.replica();
    if options.trace {
        // Thread ranks share this process, and so its timeline: one track each.
        match DistEnv::from_env()?.is_none() && world > 1 {
            true => timeline::enable(0, format!("{world} ranks as threads")),
            false => timeline::enable(rank, format!("rank {rank}")),
        }
    }
    let config = &options.config;
    let held_out =
        options.eval_every.map(|_| HeldOut::of(dataset.num_windows(), data_ranks, config.batch_size)).transpose()?;
    let train_windows = held_out.as_ref().map_or(dataset.num_windows(), HeldOut::train_windows);
    let holds_out = held_out.as_ref().map_or(0, HeldOut::len);
    let mut sampler = DistributedSampler::new(train_windows, data_ranks, data_rank, options.seed)?;
    if let Some(resume) = &options.resume {
        let dir = checkpoints::resolve(resume)?;
        let position = trainer.load_checkpoint(&dir).map_err(|e| anyhow!("resuming from {}: {e}", dir.display()))?;
        if let Some(position) = position {
            let (saved, here) = (resolved(&position.config)?, resolved(&options.data)?);
            if saved != here {
                bail!(
                    "{} was trained on other data: {}; resume it with the same data options",
                    dir.display(),
                    data_differences(&saved, &here).join("; ")
                );
            }
            if position.held_out != holds_out {
                bail!(
                    "{} was trained with {} windows held out for evaluation, this run holds out {holds_out}: \
                     resume with --eval-every given or left out as before",
                    dir.display(),
                    position.held_out
                );
            }
            sampler.restore(position.sampler)?;
        }
        let step = trainer.counters().step;
        if step >= config.max_steps {
            bail!(
                "{} is at step {step} and --max-steps is {}: nothing to train; raise --max-steps to continue",
                dir.display(),
                config.max_steps
            );
        }
        if is_logger {
            metrics::truncate_after(&options.out_dir.join(METRICS_FILE), step)?;
            report!("resumed from {} at step {step}", dir.display());
            // The log is cut back to this step above; the later checkpoints go aside.
            if let Some((folder, names)) = checkpoints::set_aside_after(&options.out_dir, step)? {
                report!(
                    "moved {} into {}: they belong to the run this one rewinds, so a later --resume continues \
                     this one; delete them when you no longer need them",
                    names.join(", "),
                    folder.display()
                );
            }
            let saved = Checkpoint::read_state(&dir)?.train;
            let schedule = config.train_config(options.layout.activation_checkpointing).schedule;
            if saved.schedule != schedule {
                report!(
                    "note: {} was trained on another learning-rate schedule; this run's (from --lr, \
                     --warmup-steps and --max-steps) takes over: step {} runs at lr {:.3e} where the checkpoint's \
                     gave {:.3e}",
                    dir.display(),
                    step + 1,
                    schedule.lr(step),
                    saved.schedule.lr(step)
                );
            }
            let was = saved.grad_accum_steps;
            if was != config.grad_accum_steps {
                report!(
                    "note: {} was trained with {} per step and this run takes {} (--grad-accum): each step \
                     now reads that many batches of --batch-size",
                    dir.display(),
                    count(was, "micro-batch"),
                    config.grad_accum_steps
                );
            }
        }
    }
    if is_logger {
        print_plan(options, dataset, device, num_params, trainer.model_states_bytes())?;
    }
    let mut log = if is_logger { Some(MetricsLog::open(&options.out_dir)?) } else { None };
    let bar = progress_bar(is_logger, trainer.counters().step, config.max_steps);
    let per_rank_batch = config.batch_size / data_ranks;
    let tokens_per_step = config.batch_size * config.grad_accum_steps * config.seq_len;
    let start = Instant::now();
    let (mut first, mut last, mut loss_ema) = (None, None, None::<f64>);
    let (mut sent_bytes, mut steps_trained, mut trailing_skips) = (0u64, 0usize, 0usize);
    let eval = |trainer: &mut _| -> Result<Option<f64>> {
        let Some(held_out) = &held_out else { return Ok(None) };
        evaluate(trainer, dataset, held_out, per_rank_batch, device).map(Some)
    };
    let first_eval = eval(&mut trainer)?;
    if let Some(loss) = first_eval {
        // Every rank takes part in gathering the memory figures.
        let memory_mib = memory_per_rank(trainer.process_group(), device)?;
        if is_logger {
            say(&bar, eval_line(trainer.counters().step, loss));
        }
        // A resumed run measured this step's loss before it stopped, if it was due.
        if let (Some(log), 0) = (log.as_mut(), trainer.counters().step) {
            log.record(&StepRecord::before_training(loss, memory_mib))?;
        }
    }
    let mut last_eval = first_eval;
    while trainer.counters().step < config.max_steps {
        faults::step_begins(rank, trainer.counters().step + 1)?;
        let step_start = Instant::now();
        let batches = (0..config.grad_accum_steps)
            .map(|_| dataset.batch(&sampler.next_batch(per_rank_batch), device))
            .collect::<candle_core::Result<Vec<Tensor>>>()?;
        let skipped_before = trainer.counters().skipped_steps;
        let step_span = timeline::span("compute", format!("step {}", trainer.counters().step + 1));
        let comm_before = trainer.comm_stats();
        let stats = trainer.train_step(&batches).map_err(|e| anyhow!("step {}: {e}", trainer.counters().step))?;
        sent_bytes += trainer.comm_stats().since(&comm_before).total_wire_bytes();
        steps_trained += 1;
        drop(step_span);
        // Each rank saw only its own batches.
        let loss = all_reduce_scalar(trainer.process_group(), stats.loss, ReduceOp::Avg, device)?;
        let counters = trainer.counters();
        let step = counters.step;
        trailing_skips = if counters.skipped_steps > skipped_before { trailing_skips + 1 } else { 0 };
        let tokens_per_s = tokens_per_step as f64 / step_start.elapsed().as_secs_f64();
        let due = options.eval_every.is_some_and(|every| step.is_multiple_of(every) || step == config.max_steps);
        let eval_loss = if due { eval(&mut trainer)? } else { None };
        last_eval = eval_loss.or(last_eval);
        let record = StepRecord {
            step,
            loss,
            lr: stats.lr,
            grad_norm: stats.grad_norm,
            tokens_per_s,
            elapsed_s: start.elapsed().as_secs_f64(),
            eval_loss,
            memory_mib: memory_per_rank(trainer.process_group(), device)?,
            skipped_steps: counters.skipped_steps,
        };
        if is_logger {
            report_anomalies(&bar, &record, &stats, counters.skipped_steps > skipped_before, &mut loss_ema);
            if let Some(log) = log.as_mut() {
                log.record(&record)?;
            }
            bar.set_position(step as u64);
            bar.set_message(format!("loss {:.4}  lr {:.2e}  {:.0} tok/s", record.loss, record.lr, record.tokens_per_s));
            // The step's own line first, then what was measured after it.
            if bar.is_hidden() && (step.is_multiple_of(options.log_every) || step == config.max_steps) {
                report!(
                    "step {:>6}  loss {:.4}  lr {:.2e}  grad norm {:.3}  {:.0} tok/s",
                    record.step,
                    record.loss,
                    record.lr,
                    record.grad_norm,
                    record.tokens_per_s
                );
            }
            if let Some(loss) = eval_loss {
                say(&bar, eval_line(step, loss));
            }
        }
        first.get_or_insert_with(|| record.clone());
        last = Some(record);
        let at_end = step == config.max_steps;
        if at_end || step.is_multiple_of(options.checkpoint_every) {
            save(&trainer, options, &sampler, holds_out)?;
        }
        if lone && interrupted() {
            was_interrupted = true;
            break;
        }
    }
    bar.finish_and_clear();
    if options.trace {
        write_trace(trainer.process_group(), &options.out_dir)?;
    }
    if is_logger {
        metrics::draw_loss_curve(&options.out_dir)?;
        if let Some(report) = trainer.report() {
            report!("{report}");
        }
    }
    Ok(Summary {
        first,
        last,
        steps: trainer.counters().step,
        skipped_updates: trainer.counters().skipped_steps,
        trailing_skips,
        interrupted: was_interrupted,
        seconds: start.elapsed().as_secs_f64(),
        num_params,
        sent_bytes_per_step: sent_bytes as f64 / steps_trained.max(1) as f64,
        gpu_memory_mib: compute::gpu_memory_mib(device),
        eval_loss: first_eval.zip(last_eval),
    })
}

/// What an evaluation prints: the held-out loss and its perplexity.
fn eval_line(step: usize, loss: f64) -> String {
    format!("eval at step {step}: held-out loss {loss:.4}, perplexity {:.2}", loss.exp())
}

/// Writes this step's checkpoint. Every rank says it is busy meanwhile: a
/// write slower than the collective timeout is not a stuck rank.
fn save(trainer: &impl Train, options: &RunOptions, sampler: &DistributedSampler, held_out: usize) -> Result<()> {
    let dir = checkpoints::step_dir(&options.out_dir, trainer.counters().step);
    let position = DataPosition { config: options.data.clone(), sampler: sampler.state(), held_out };
    let pg = trainer.process_group();
    let _span = timeline::span("io", format!("save {}", dir.display()));
    while_busy(pg, &format!("saving {}", dir.display()), || {
        trainer
            .save_checkpoint(&dir, Some(position))
            .map_err(|e| anyhow!("saving {}: {e}; {}", dir.display(), after_failed_save(options, &e)))?;
        if pg.rank() == 0 {
            checkpoints::prune(&options.out_dir, options.keep_checkpoints)?;
        }
        Ok(())
    })
}

/// Writes the timeline to `out_dir/trace.json`. Ranks that are processes
/// each write their own part; rank 0 puts the parts of this machine's ranks
/// together once all are written (other nodes' parts stay on their nodes).
fn write_trace(pg: &dyn ProcessGroup, out_dir: &Path) -> Result<()> {
    let whole = out_dir.join("trace.json");
    let ranks = if DistEnv::from_env()?.is_none() {
        // One process: its timeline holds every rank, threads included.
        if pg.rank() == 0 {
            timeline::write(&whole)?;
        }
        pg.world_size()
    } else {
        let part = |rank: usize| out_dir.join(format!("trace-rank{rank}.json"));
        timeline::write(&part(pg.rank()))?;
        pg.barrier()?;
        let parts: Vec<PathBuf> = (0..pg.world_size()).map(part).filter(|p| p.exists()).collect();
        if pg.rank() == 0 {
            timeline::merge(&parts.iter().map(PathBuf::as_path).collect::<Vec<_>>(), &whole)?;
            parts.iter().for_each(|p| drop(std::fs::remove_file(p)));
        }
        parts.len()
    };
    if pg.rank() == 0 {
        report!("timeline of {ranks} rank(s): {} (open it in https://ui.perfetto.dev)", whole.display());
    }
    Ok(())
}

/// What a failed save leaves: the staged files are gone, earlier checkpoints
/// untouched. Suggests freeing disk space only when the disk said it was full.
fn after_failed_save(options: &RunOptions, error: &candle_core::Error) -> String {
    let fix = match is_disk_full(error) {
        true => "free disk space",
        false => "fix the cause",
    };
    match checkpoints::steps(&options.out_dir).ok().and_then(|steps| steps.last().copied()) {
        Some(step) => format!("the checkpoint of step {step} is intact: {fix} and continue with --resume"),
        None => format!("no earlier checkpoint exists: {fix} and start again"),
    }
}

/// Whether `error` is the disk's (or the user's quota's) being full.
fn is_disk_full(error: &candle_core::Error) -> bool {
    let full =
        |e: &std::io::Error| matches!(e.kind(), std::io::ErrorKind::StorageFull | std::io::ErrorKind::QuotaExceeded);
    // Errors that reach here as text (from a tensor library's own I/O) keep the OS's number.
    let text = error.to_string();
    matches!(error, candle_core::Error::Io(e) if full(e))
        || text.contains("os error 28")
        || text.contains("os error 122")
}

/// Says so when a step was skipped for a non-finite gradient or its loss jumped.
fn report_anomalies(bar: &ProgressBar, record: &StepRecord, stats: &StepStats, skipped: bool, ema: &mut Option<f64>) {
    if skipped || !record.loss.is_finite() {
        say(
            bar,
            format!(
                "step {}: loss {:.4}, gradient norm {}: not finite, the update was skipped",
                record.step, record.loss, stats.grad_norm
            ),
        );
        return;
    }
    if let Some(avg) = *ema {
        if record.loss > 1.5 * avg && record.loss - avg > 0.5 {
            say(
                bar,
                format!("step {}: loss spike: {:.3} against a recent average of {avg:.3}", record.step, record.loss),
            );
        }
    }
    *ema = Some(ema.map_or(record.loss, |avg| 0.9 * avg + 0.1 * record.loss));
}

/// A line above the progress bar, or on stdout when there is no bar (a log
/// file, a launcher's pipe), where `ProgressBar::println` would drop it.
fn say(bar: &ProgressBar, line: String) {
    if bar.is_hidden() {
        report!("{line}");
    } else {
        bar.println(line);
    }
}

fn progress_bar(visible: bool, position: usize, len: usize) -> ProgressBar {
    if !visible {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(len as u64).with_position(position as u64);
    bar.set_style(ProgressStyle::with_template("{bar:30} {pos}/{len} {msg}  eta {eta}").expect("valid template"));
    bar
}

/// `held`: the bytes of model states this rank holds, where the trainer shards them.
fn print_plan(
    options: &RunOptions,
    dataset: &Dataset,
    device: &Device,
    num_params: usize,
    held: Option<u64>,
) -> Result<()> {
    let c = &options.config;
    let mib = |bytes: u64| bytes as f64 / (1 << 20) as f64;
    let whole = mib(num_params as u64 * (4 + 4 + 8)); // f32 parameters, gradients, two moments
    let what = "for parameters + gradients + AdamW state";
    let memory = match held {
        Some(bytes) => format!("{:.1} MiB {what} on this rank, {whole:.1} MiB unsharded", mib(bytes)),
        None => format!("{whole:.1} MiB {what} per rank"),
    };
    report!(
        "model: {:.2}M parameters ({} layers, width {}), {memory}",
        num_params as f64 / 1e6,
        c.model.num_layers,
        c.model.hidden_size,
    );
    report!("data: {dataset}");
    if device.is_cuda() {
        let carrier = match options.backend {
            Backend::Nccl => "collectives over NCCL",
            Backend::Tcp => "collectives over TCP through the host",
        };
        let carrier = if options.nproc > 1 { format!(", {carrier}") } else { String::new() };
        report!("device: one CUDA GPU per rank (rank 0 on {:?}){carrier}", device.location());
    }
    let parts = options.batch_parts();
    if parts > 1 {
        report!("threads: each rank's micro-batches split into {parts} parts, each on a thread of its own");
    }
    for line in banner::exercise_lines(options)? {
        report!("{line}");
    }
    if options.layout.prefetch {
        report!("parameters: each unit's all-gather starts while the unit before it computes (--prefetch)");
    }
    if options.layout.offload {
        report!(
            "optimizer state and f32 master weights: in a file in {}, read back when needed (--offload)",
            options.out_dir.display()
        );
    }
    report!(
        "batch: {} x {} x {} = {} per step, on {}",
        count(c.batch_size, "sequence"),
        count(c.seq_len, "token"),
        count(c.grad_accum_steps, "micro-batch"),
        count(c.batch_size * c.seq_len * c.grad_accum_steps, "token"),
        count(options.nproc, "rank")
    );
    report!("output: {}", options.out_dir.display());
    Ok(())
}

/// Every rank's memory in MiB, rank 0 first (see [`StepRecord::memory_mib`]),
/// gathered from all ranks; empty where the system does not say (then on
/// every rank alike, so no rank waits in a gather the others skip).
fn memory_per_rank(pg: &dyn ProcessGroup, device: &Device) -> Result<Vec<f64>> {
    let mine = match compute::gpu_memory_mib(device) {
        Some((used, _total)) => Some(used),
        None => peak_memory_mib(),
    };
    let Some(mine) = mine else { return Ok(vec![]) };
    let all = pg.all_gather(&Tensor::new(&[mine as f32], device)?)?;
    Ok(all.to_vec1::<f32>()?.into_iter().map(f64::from).collect())
}

/// The peak resident memory of this process in MiB, where the OS reports it.
pub fn peak_memory_mib() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}

/// `config` with its data file named absolutely: a relative path is the workbook's.
/// Each data option in which `here` differs from `saved`, by its flag, e.g.
/// "--seq-len 128 there, 64 here".
fn data_differences(saved: &DataConfig, here: &DataConfig) -> Vec<String> {
    let path =
        |config: &DataConfig| config.path.as_ref().map_or("the default".to_string(), |p| p.display().to_string());
    let options = [
        ("--dataset", saved.kind.to_string(), here.kind.to_string()),
        ("--data-path", path(saved), path(here)),
        ("--tokenizer", saved.tokenizer.to_string(), here.tokenizer.to_string()),
        ("--seq-len", saved.seq_len.to_string(), here.seq_len.to_string()),
        ("--seed", saved.seed.to_string(), here.seed.to_string()),
    ];
    options.into_iter().filter(|(_, a, b)| a != b).map(|(flag, a, b)| format!("{flag} {a} there, {b} here")).collect()
}

fn resolved(config: &DataConfig) -> Result<DataConfig> {
    let mut config = config.clone();
    if let Some(path) = config.path.as_mut() {
        let absolute = if path.is_relative() { workbook_root()?.join(&*path) } else { path.clone() };
        *path = absolute.canonicalize().unwrap_or(absolute);
    }
    Ok(config)
}

/// How a run records its data file: relative to the workbook when it lies
/// inside it, so that a moved workbook (or a checkpoint copied to another
/// clone) still resumes; absolute otherwise.
pub fn recorded_data_path(path: &Path, root: Option<&Path>) -> PathBuf {
    let absolute = path.canonicalize().unwrap_or_else(|_| std::path::absolute(path).unwrap_or(path.to_path_buf()));
    let root = root.map(|r| r.canonicalize().unwrap_or_else(|_| r.to_path_buf()));
    match root.as_deref().and_then(|root| absolute.strip_prefix(root).ok()) {
        Some(inside) => inside.to_path_buf(),
        None => absolute,
    }
}
