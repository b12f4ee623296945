//! `matrix`: every data-parallel axis (DDP, ZeRO-1, ZeRO-2, FSDP under
//! each sharding strategy, HSDP) on
//! every mesh of tp {1, 2} × pp {1, 2} (sequence parallelism where tp = 2),
//! each trained by the `train` program as processes and compared with one
//! single-threaded process trained on the same batches: the loss of every
//! step and the final parameters. One row's checkpoint is then resumed on
//! another row. Prints the table as Markdown (`cargo xtask matrix` writes
//! it to `benchmarks/matrix.md`). A pair the trainer refuses is a row too,
//! with the trainer's reason; a loss further than [`TOLERANCE`] from one
//! process's fails the program.
//!
//! With `--device cuda` every run trains on the GPU, the ranks of a layout
//! sharing it over TCP, and is compared with one process on the same GPU.
//!
//! The parameters are compared, but not held to the loss's tolerance: the
//! first row is one process on two threads, the same arithmetic summed in
//! another order, and it shows what rounding alone does to them. AdamW's
//! step moves an element by lr · g / (|g| + ε): where a gradient element is
//! within a few ε of zero, the last bits of its sum decide its step.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use anyhow::{bail, Context, Result};
use candle_core::{Device, Tensor};
use clap::Parser;
use trainer::checkpoints::step_dir;
use trainer::compute::DeviceKind;
use trainer::metrics::{read_log, METRICS_FILE};

#[derive(Parser)]
#[command(name = "matrix")]
struct Args {
    /// Optimizer steps per run, each of two micro-batches.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(2..))]
    steps: u64,
    /// Where the runs write (a fresh directory under the system's temporary one by default).
    #[arg(long)]
    scratch: Option<PathBuf>,
    /// Run only the layouts named (as the table names them, e.g. "ZeRO-1 ×
    /// TP 2 (SP)"), and the resume row if its two layouts are among them.
    #[arg(long = "only", value_name = "LAYOUT")]
    only: Vec<String>,
    /// Where every run trains: on the GPU, a layout's ranks share it over TCP.
    #[arg(long, value_enum, default_value = "cpu")]
    device: DeviceKind,
}

/// A run's loss matches one process's when it is at most this far, relatively.
const TOLERANCE: f64 = 1e-5;

/// What the replicas of a mesh share.
#[derive(Clone, Copy, PartialEq, Eq)]
enum DataAxis {
    Ddp,
    Zero1,
    Zero2,
    Fsdp,
    /// FSDP keeping parameters whole: gradients and AdamW's state sharded.
    FsdpShardGradOp,
    /// FSDP sharding nothing.
    FsdpNoShard,
    Hsdp,
}

impl DataAxis {
    const ALL: [DataAxis; 7] = [
        DataAxis::Ddp,
        DataAxis::Zero1,
        DataAxis::Zero2,
        DataAxis::Fsdp,
        DataAxis::FsdpShardGradOp,
        DataAxis::FsdpNoShard,
        DataAxis::Hsdp,
    ];

    fn name(self) -> &'static str {
        match self {
            DataAxis::Ddp => "DDP",
            DataAxis::Zero1 => "ZeRO-1",
            DataAxis::Zero2 => "ZeRO-2",
            DataAxis::Fsdp => "FSDP",
            DataAxis::FsdpShardGradOp => "FSDP (SHARD_GRAD_OP)",
            DataAxis::FsdpNoShard => "FSDP (NO_SHARD)",
            DataAxis::Hsdp => "HSDP (2 × 2)",
        }
    }

    /// Data-parallel replicas: HSDP's are two shard groups of two.
    fn replicas(self) -> usize {
        if self == DataAxis::Hsdp {
            4
        } else {
            2
        }
    }

    fn flags(self) -> &'static [&'static str] {
        match self {
            DataAxis::Ddp => &["--strategy", "ddp"],
            DataAxis::Zero1 => &["--strategy", "zero1"],
            DataAxis::Zero2 => &["--strategy", "zero2"],
            DataAxis::Fsdp => &["--strategy", "fsdp"],
            DataAxis::FsdpShardGradOp => &["--strategy", "fsdp", "--sharding", "shard_grad_op"],
            DataAxis::FsdpNoShard => &["--strategy", "fsdp", "--sharding", "no_shard"],
            DataAxis::Hsdp => &["--strategy", "fsdp", "--sharding", "hybrid_shard", "--hybrid-group-size", "2"],
        }
    }
}

/// One layout: a data-parallel axis on a mesh.
#[derive(Clone, Copy)]
struct Layout {
    data: DataAxis,
    tp: usize,
    pp: usize,
}

impl Layout {
    fn nproc(self) -> usize {
        self.data.replicas() * self.tp * self.pp
    }

    /// The `train` flags of this layout, its number of ranks included.
    fn flags(self) -> Vec<String> {
        let mut flags = vec!["--nproc".to_string(), self.nproc().to_string()];
        flags.extend(self.data.flags().iter().map(|f| f.to_string()));
        if self.tp > 1 {
            flags.extend(["--tp".into(), self.tp.to_string(), "--sequence-parallel".into()]);
        }
        if self.pp > 1 {
            flags.extend(["--pp".into(), self.pp.to_string()]);
        }
        flags
    }

    fn describe(self) -> String {
        let mesh = match (self.tp, self.pp) {
            (1, 1) => String::new(),
            (tp, 1) => format!(" × TP {tp} (SP)"),
            (1, pp) => format!(" × PP {pp}"),
            (tp, pp) => format!(" × TP {tp} (SP) × PP {pp}"),
        };
        format!("{}{mesh}", self.data.name())
    }
}

/// How a run compares with one process.
enum Outcome {
    Trained { loss: f64, params: Difference, seconds: f64 },
    Refused(String),
}

/// How far a run's final parameters are from one process's.
#[derive(Clone, Copy, Default)]
struct Difference {
    /// The largest max |a − b| / max |b| of a tensor.
    largest: f64,
    /// Elements further than `TOLERANCE` · max |b| of their tensor.
    elements_off: usize,
    elements: usize,
}

fn main() -> ExitCode {
    trainer::main_with(|| run(Args::parse()))
}

fn run(args: Args) -> Result<()> {
    let steps = args.steps as usize;
    let scratch = match args.scratch {
        Some(dir) => dir,
        None => std::env::temp_dir().join(format!("workbook-matrix-{}", std::process::id())),
    };
    let every: Vec<Layout> = DataAxis::ALL
        .into_iter()
        .flat_map(|data| [(1, 1), (2, 1), (1, 2), (2, 2)].map(|(tp, pp)| Layout { data, tp, pp }))
        .collect();
    if let Some(unknown) = args.only.iter().find(|name| !every.iter().any(|layout| layout.describe() == **name)) {
        bail!("--only {unknown}: not a layout of the matrix; name one as its table does, such as `FSDP × TP 2 (SP) × PP 2`");
    }
    let chosen = |layout: Layout| args.only.is_empty() || args.only.contains(&layout.describe());
    let layouts: Vec<Layout> = every.into_iter().filter(|&layout| chosen(layout)).collect();
    std::fs::create_dir_all(&scratch).with_context(|| format!("cannot create {}", scratch.display()))?;
    let train = Train { program: train_program()?, steps, device: args.device };
    let one = scratch.join("one-process");
    let _ = train.run(&one, &["--nproc", "1", "--threads", "1"].map(String::from), None)?;
    let mut rows = Vec::new();
    // The GPU's arithmetic does not depend on the host's threads: no such row there.
    if args.device == DeviceKind::Cpu {
        let two_threads = scratch.join("two-threads");
        let two_threads_flags = ["--nproc", "1", "--threads", "2"].map(String::from);
        let outcome = train.compared(&two_threads, &two_threads_flags, None, &one)?;
        rows.push(("one process, each micro-batch split across 2 threads".to_string(), 1, outcome));
    }
    for layout in layouts {
        let dir = scratch.join(layout.describe().replace([' ', '(', ')'], ""));
        let outcome = train.compared(&dir, &layout.flags(), None, &one)?;
        eprintln!("{}: {}", layout.describe(), cell(&outcome));
        rows.push((layout.describe(), layout.nproc(), outcome));
    }
    // A checkpoint holds whole tensors: the last step's row picks up the first row's run half way.
    let (from, to) = (Layout { data: DataAxis::Fsdp, tp: 2, pp: 2 }, Layout { data: DataAxis::Zero2, tp: 2, pp: 1 });
    if chosen(from) && chosen(to) {
        let first = scratch.join(from.describe().replace([' ', '(', ')'], ""));
        let resumed = scratch.join("resumed");
        let outcome = train.compared(&resumed, &to.flags(), Some(&step_dir(&first, steps / 2)), &one)?;
        let what = format!("{} resuming {} at step {}", to.describe(), from.describe(), steps / 2);
        eprintln!("{what}: {}", cell(&outcome));
        rows.push((what, to.nproc(), outcome));
    }
    println!("{}", table(&rows, steps, args.device));
    std::fs::remove_dir_all(&scratch).ok();
    let differing = rows.iter().filter(|(_, _, outcome)| verdict(outcome) == "DIFFERS").count();
    if differing > 0 {
        bail!("{differing} run(s) differ from one process by more than {TOLERANCE:.0e} in their loss");
    }
    Ok(())
}

/// The `train` program beside this one.
fn train_program() -> Result<PathBuf> {
    let here = std::env::current_exe().context("cannot find this program's path")?;
    let train = here.with_file_name(format!("train{}", std::env::consts::EXE_SUFFIX));
    if !train.exists() {
        bail!(
            "{} is missing: build it first (cargo build -p trainer --features solutions --bin train), or run \
             cargo xtask matrix",
            train.display()
        );
    }
    Ok(train)
}

/// The `train` program, and what every run of the matrix shares.
struct Train {
    program: PathBuf,
    steps: usize,
    device: DeviceKind,
}

impl Train {
    /// A run with `flags` in `dir` (from `resume` when given), compared with
    /// the one-process run in `one`.
    fn compared(&self, dir: &Path, flags: &[String], resume: Option<&Path>, one: &Path) -> Result<Outcome> {
        let seconds = match self.run(dir, flags, resume)? {
            Ok(seconds) => seconds,
            Err(reason) => return Ok(Outcome::Refused(reason)),
        };
        let (ours, theirs) = (read_log(&dir.join(METRICS_FILE))?, read_log(&one.join(METRICS_FILE))?);
        let theirs: HashMap<usize, f64> = theirs.iter().map(|r| (r.step, r.loss)).collect();
        let mut loss = 0f64;
        for record in &ours {
            let Some(&want) = theirs.get(&record.step) else { bail!("one process logged no step {}", record.step) };
            loss = loss.max((record.loss - want).abs() / want.abs());
        }
        let params = params_difference(&step_dir(dir, self.steps), &step_dir(one, self.steps))?;
        Ok(Outcome::Trained { loss, params, seconds })
    }

    /// Runs `train` with the matrix's common flags and `flags` into `dir`:
    /// the seconds it took, or the trainer's reason when it refuses the layout.
    fn run(&self, dir: &Path, flags: &[String], resume: Option<&Path>) -> Result<std::result::Result<f64, String>> {
        let mut command = Command::new(&self.program);
        // The bundled TinyStories sample: text, as a user trains on.
        command.args(["--model-size", "tiny", "--dataset", "tinystories", "--seq-len", "64", "--batch-size", "8"]);
        command.args(["--grad-accum", "2", "--log-every", "1000"]);
        command.args(["--max-steps", &self.steps.to_string(), "--checkpoint-every", &(self.steps / 2).to_string()]);
        if self.device == DeviceKind::Cuda {
            // NCCL holds one rank per GPU: the TCP rings let a layout's ranks share one.
            command.args(["--device", "cuda", "--backend", "tcp"]);
        }
        command.arg("--checkpoint-dir").arg(dir).args(flags);
        if let Some(from) = resume {
            command.arg("--resume").arg(from);
        }
        let start = std::time::Instant::now();
        let output = command.output().with_context(|| format!("cannot start {}", self.program.display()))?;
        let seconds = start.elapsed().as_secs_f64();
        let stderr = String::from_utf8_lossy(&output.stderr);
        if output.status.success() {
            return Ok(Ok(seconds));
        }
        match stderr.lines().find_map(|line| line.strip_prefix("error: ")) {
            // A layout refused before training is a row of the table; a failure while training is not.
            Some(reason) if !dir.join(METRICS_FILE).exists() => Ok(Err(reason.to_string())),
            _ => bail!("train {} failed:\n{}\n{stderr}", flags.join(" "), String::from_utf8_lossy(&output.stdout)),
        }
    }
}

/// How far the parameters of the checkpoint `ours` are from `theirs`'.
fn params_difference(ours: &Path, theirs: &Path) -> Result<Difference> {
    let load = |dir: &Path| {
        let file = dir.join("model.safetensors");
        candle_core::safetensors::load(&file, &Device::Cpu).with_context(|| format!("cannot read {}", file.display()))
    };
    let (ours, theirs) = (load(ours)?, load(theirs)?);
    if ours.len() != theirs.len() {
        bail!("the checkpoints hold {} and {} tensors", ours.len(), theirs.len());
    }
    let mut difference = Difference::default();
    for (name, want) in &theirs {
        let Some(got) = ours.get(name) else { bail!("the checkpoint has no `{name}`") };
        let max_abs = |t: &Tensor| -> Result<f64> { Ok(t.abs()?.max_all()?.to_scalar::<f32>()? as f64) };
        let scale = max_abs(want)?.max(f64::MIN_POSITIVE);
        let apart = (got - want)?.abs()?;
        difference.largest = difference.largest.max(max_abs(&apart)? / scale);
        let off = apart.gt(TOLERANCE * scale)?.to_dtype(candle_core::DType::F32)?.sum_all()?.to_scalar::<f32>()?;
        difference.elements_off += off as usize;
        difference.elements += want.elem_count();
    }
    Ok(difference)
}

/// Whether a run's loss matches one process's, or why it did not run.
fn verdict(outcome: &Outcome) -> String {
    match outcome {
        Outcome::Trained { loss, .. } if *loss <= TOLERANCE => "matches".to_string(),
        Outcome::Trained { .. } => "DIFFERS".to_string(),
        Outcome::Refused(reason) => format!("refused: {reason}"),
    }
}

fn cell(outcome: &Outcome) -> String {
    match outcome {
        Outcome::Trained { loss, params, .. } => {
            format!("loss {} ({loss:.1e}), parameters {:.1e}", verdict(outcome), params.largest)
        }
        Outcome::Refused(_) => verdict(outcome),
    }
}

/// The rows as a Markdown table, with what was run above it.
fn table(rows: &[(String, usize, Outcome)], steps: usize, device: DeviceKind) -> String {
    let (written_by, ranks, rounding) = match device {
        DeviceKind::Cpu => (
            "`cargo xtask matrix`",
            "ranks as processes, each run compared with one single-threaded process",
            " The first row is one process summing in another order: what rounding alone does to the parameters, \
             through AdamW's lr · g / (|g| + ε) where an element's gradient is within a few ε of zero.",
        ),
        DeviceKind::Cuda => (
            "`scripts/gpu-check.sh run` (`matrix --device cuda`)",
            "on one GPU, the ranks processes sharing it over TCP, each run compared with one process on the GPU",
            "",
        ),
    };
    let mut out = format!(
        "# The data-parallel axis × tensor × pipeline parallelism\n\n\
         Written by {written_by}: the `train` program with the reference solutions, tiny config, the \
         bundled TinyStories sample (T 64, 8 sequences per micro-batch), fp32, {steps} steps of 2 micro-batches, \
         {ranks} trained on the same batches. \
         *loss*: the largest relative difference of a step's loss, over every step; the loss matches within \
         {TOLERANCE:.0e}. *parameters*: of the final parameters, the largest max |a − b| / max |b| of a tensor, \
         and how many elements are further than {TOLERANCE:.0e} · max |b| of their tensor.{rounding}\n\n\
         | layout | ranks | loss | parameters | elements off | seconds | loss verdict |\n\
         |---|---|---|---|---|---|---|\n"
    );
    for (what, nproc, outcome) in rows {
        let verdict = verdict(outcome);
        let line = match outcome {
            Outcome::Trained { loss, params, seconds } => format!(
                "| {what} | {nproc} | {loss:.1e} | {:.1e} | {} of {} | {seconds:.0} | {verdict} |\n",
                params.largest, params.elements_off, params.elements
            ),
            Outcome::Refused(_) => format!("| {what} | {nproc} | | | | | {verdict} |\n"),
        };
        out.push_str(&line);
    }
    out
}
