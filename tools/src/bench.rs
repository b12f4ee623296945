//! `bench`: the reference trainer's throughput beside PyTorch's, measured in one run.
//!
//! Speed claims belong to a benchmark, not to timed unit tests: this runs the
//! `bench` program of `trainer/` (one process on 1 and 2 kernel threads, and
//! DDP on 2 single-threaded ranks, as processes and as threads) and
//! `benchmarks/pytorch_baseline.py` (the same model, optimizer and batch in
//! PyTorch: one process on 1 and 2 threads, and DDP on the gloo backend with 2
//! single-threaded processes started by torchrun) in interleaved rounds, at
//! the config's shape and at GPT-2 124M's (T 256, batch 2). It prints each
//! setup's ratio to its PyTorch peer on as many threads and writes
//! `benchmarks/results.md`.

use std::path::Path;
use std::process::Command;

use anyhow::{bail, Context, Result};
use serde::de::DeserializeOwned;
use serde::Deserialize;
use xtask::render;
use xtask::workspace::{cargo, Workspace};

use crate::bench_fsdp::read_config;
use crate::python::python_that_imports;

pub const RESULTS: &str = "benchmarks/results.md";
const THROUGHPUT_HEADING: &str = "## Training throughput";
const BASELINE: &str = "benchmarks/pytorch_baseline.py";
const HOST: &str = "benchmarks/host.py";
/// The allocator settings the trainer makes at start-up with `mallopt`
/// (`workbook::memory::keep_freed_memory`: mmap threshold 32 MiB, no mmap,
/// trim threshold 1 GiB), given to PyTorch's processes through glibc's
/// tunables, so that neither side's allocator is tuned and the other's not.
pub const SAME_ALLOCATOR: (&str, &str) = (
    "GLIBC_TUNABLES",
    "glibc.malloc.mmap_threshold=33554432:glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=1073741824",
);

/// One run's figures, as the trainer's `bench` prints them (PyTorch's baseline
/// prints tokens/s only).
#[derive(Debug, Deserialize)]
pub struct Measurement {
    /// The trainer's name for what it ran (how a rank used its threads included).
    #[serde(default)]
    pub setup: Option<String>,
    pub tokens_per_s: f64,
    /// The most tensor bytes one rank sent per optimizer step.
    #[serde(default)]
    pub sent_bytes_per_step: Option<f64>,
    /// The largest peak resident memory of one rank, where ranks are processes.
    #[serde(default)]
    pub peak_memory_mib: Option<f64>,
}

/// What is trained and for how long: a config at a shape.
pub struct Workload {
    pub title: String,
    pub model_size: String,
    pub seq_len: Option<usize>,
    pub batch_size: Option<usize>,
    pub grad_accum: Option<usize>,
    pub steps: usize,
    pub warmup: usize,
}

/// A workload and the setups measured on it.
struct Shape {
    workload: Workload,
    setups: Vec<Setup>,
}

/// One side's configuration: who trains, on how many ranks and threads each.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Setup {
    framework: Framework,
    nproc: usize,
    threads_per_rank: usize,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Framework {
    Workbook { processes: bool },
    PyTorch,
}

impl Setup {
    const fn new(framework: Framework, nproc: usize, threads_per_rank: usize) -> Self {
        Self { framework, nproc, threads_per_rank }
    }

    fn threads(&self) -> usize {
        self.nproc * self.threads_per_rank
    }

    fn name(&self) -> String {
        let n = self.nproc;
        match (self.framework, n) {
            (Framework::Workbook { .. }, 1) => "workbook, single process".into(),
            (Framework::Workbook { processes: true }, _) => format!("workbook, DDP on {n} processes"),
            (Framework::Workbook { processes: false }, _) => format!("workbook, DDP on {n} thread ranks"),
            (Framework::PyTorch, 1) => "PyTorch, single process".into(),
            (Framework::PyTorch, _) => format!("PyTorch DDP (gloo, torchrun), {n} processes"),
        }
    }

    /// The PyTorch setup this one is compared with: the same ranks and threads.
    fn peer(&self) -> Option<Setup> {
        matches!(self.framework, Framework::Workbook { .. }).then_some(Setup { framework: Framework::PyTorch, ..*self })
    }
}

const WORKBOOK_THREADS: Framework = Framework::Workbook { processes: false };
const WORKBOOK: Framework = Framework::Workbook { processes: true };

/// One setup's tokens/s, one value per round.
struct Samples {
    setup: Setup,
    /// What the trainer called the run, where it says.
    label: Option<String>,
    tokens_per_s: Vec<f64>,
}

pub fn bench(ws: &Workspace, model_size: &str, steps: usize, large_steps: usize, rounds: usize) -> Result<bool> {
    if rounds == 0 {
        bail!("--rounds must be at least 1");
    }
    let python = python_with_torch();
    let tiny: ConfigShape = read_config(&ws.root, model_size)?;
    let mut shapes = vec![Shape {
        workload: Workload {
            title: format!(
                "`{model_size}` config (T {}, batch {} × {} micro-batch(es) per step)",
                tiny.seq_len, tiny.batch_size, tiny.grad_accum_steps
            ),
            model_size: model_size.into(),
            seq_len: None,
            batch_size: None,
            grad_accum: None,
            steps,
            warmup: 5,
        },
        setups: vec![
            Setup::new(WORKBOOK, 1, 1),
            Setup::new(WORKBOOK, 1, 2),
            Setup::new(WORKBOOK_THREADS, 2, 1),
            Setup::new(WORKBOOK, 2, 1),
        ],
    }];
    if large_steps > 0 {
        // Each step is seconds at this size: few steps, and only the setups that use both cores.
        shapes.push(Shape {
            workload: Workload {
                steps: large_steps,
                grad_accum: Some(4),
                ..Workload::gpt2_small("GPT-2 124M shape (`small` config, T 256, batch 2 × 4 micro-batches per step)")
            },
            setups: vec![Setup::new(WORKBOOK, 1, 2), Setup::new(WORKBOOK, 2, 1)],
        });
    }
    let mut report = format!(
        "Written by `cargo xtask bench` ({rounds} interleaved rounds). Host: {host}.\n\n\
         Both sides train the same Llama-style model with AdamW parameter groups, clipping and the\n\
         same global batch, on random tokens; DDP splits the batch across the ranks. Both run with the\n\
         same allocator settings (the trainer's `mallopt` calls, given to PyTorch as `{}`), and\n\
         PyTorch's DDP does not broadcast buffers (the model has none). tokens/s counts every rank's\n\
         tokens, and threads every thread of every rank (PyTorch's intra-op threads; the workbook\n\
         splits a rank's batch across its threads, each part with single-threaded kernels, where the\n\
         row says so). Each workbook row is compared with its\n\
         PyTorch peer (one process, or DDP on gloo with as many processes) on as many threads in the\n\
         same round; the table gives the median over rounds, the range of the ratios and every\n\
         round's tokens/s. README.md beside this file says where the time goes.\n",
        SAME_ALLOCATOR.0,
        host = host(python.as_deref())
    );
    for shape in &mut shapes {
        if python.is_some() {
            let peers: Vec<Setup> = shape.setups.iter().filter_map(Setup::peer).collect();
            for peer in peers {
                if !shape.setups.contains(&peer) {
                    shape.setups.push(peer);
                }
            }
        }
        println!(
            "{}",
            render::bold(&format!(
                "Training throughput, {}, {} timed steps, {rounds} rounds",
                shape.workload.title, shape.workload.steps
            ))
        );
        let mut samples: Vec<Samples> =
            shape.setups.iter().map(|&setup| Samples { setup, label: None, tokens_per_s: vec![] }).collect();
        // Rounds interleave the two sides, so that a machine that slows down for
        // a while slows both, and each ratio is taken within one round.
        for round in 1..=rounds {
            println!("  round {round} of {rounds}");
            for sample in &mut samples {
                let setup = &sample.setup;
                let tokens_per_s = match setup.framework {
                    Framework::Workbook { processes } => {
                        let ranks = Ranks { nproc: setup.nproc, threads_per_rank: setup.threads_per_rank, processes };
                        let measured = workbook_bench(&ws.root, &shape.workload, ranks, &[])?;
                        sample.label = measured.setup;
                        measured.tokens_per_s
                    }
                    Framework::PyTorch => {
                        let python = python.as_deref().expect("peers need torch");
                        pytorch_throughput(&ws.root, python, &shape.workload, setup)?
                    }
                };
                sample.tokens_per_s.push(tokens_per_s);
            }
        }
        let table = table(&samples);
        println!("{table}");
        report += &format!(
            "\n### {}\n\n{} timed optimizer steps after {} warm-up steps.\n\n{table}",
            shape.workload.title, shape.workload.steps, shape.workload.warmup
        );
    }
    replace_section(&ws.root.join(RESULTS), THROUGHPUT_HEADING, &report)?;
    println!("written to {RESULTS}");
    Ok(true)
}

impl Workload {
    /// GPT-2 124M's shape: the `small` config at T 256, batch 2, one micro-batch, 3 timed steps.
    pub fn gpt2_small(title: &str) -> Self {
        Workload {
            title: title.into(),
            model_size: "small".into(),
            seq_len: Some(256),
            batch_size: Some(2),
            grad_accum: None,
            steps: 8,
            warmup: 2,
        }
    }

    /// The flags that give a program this workload's shape.
    fn shape_flags(&self, command: &mut Command) {
        let flags = [("--seq-len", self.seq_len), ("--batch-size", self.batch_size), ("--grad-accum", self.grad_accum)];
        for (flag, value) in flags {
            if let Some(value) = value {
                command.args([flag, &value.to_string()]);
            }
        }
    }
}

/// How the workbook's ranks run.
#[derive(Debug, Clone, Copy)]
pub struct Ranks {
    pub nproc: usize,
    pub threads_per_rank: usize,
    /// Processes started by the launcher, or threads of one process.
    pub processes: bool,
}

/// One run of the trainer's `bench` with the reference solutions, in a
/// process of its own (its kernel thread pool is sized once per process);
/// `flags` choose what the DDP or pipeline runs with.
pub fn workbook_bench(root: &Path, workload: &Workload, ranks: Ranks, flags: &[&str]) -> Result<Measurement> {
    let mut command = cargo(root);
    command
        // The trainer shares each rank's threads itself, as `cargo train` does.
        .env_remove("RAYON_NUM_THREADS")
        .env_remove("CANDLE_NUM_THREADS")
        .args(["run", "--quiet", "--package", "trainer", "--features", "solutions", "--bin", "bench", "--"])
        .args(["--threads", &ranks.threads_per_rank.to_string()])
        .args(["--model-size", &workload.model_size])
        .args(["--steps", &workload.steps.to_string(), "--warmup", &workload.warmup.to_string()])
        .args(["--nproc", &ranks.nproc.to_string(), "--ranks", if ranks.processes { "processes" } else { "threads" }])
        .args(flags);
    workload.shape_flags(&mut command);
    let output = command.output().context("cannot run cargo")?;
    if !output.status.success() {
        bail!("the trainer's bench failed:\n{}", String::from_utf8_lossy(&output.stderr));
    }
    last_json_line(&output.stdout)
}

/// PyTorch's tokens/s: one process, or DDP on gloo started by torchrun.
fn pytorch_throughput(root: &Path, python: &str, workload: &Workload, setup: &Setup) -> Result<f64> {
    let config = root.join("configs").join(format!("{}.toml", workload.model_size));
    let mut command = Command::new(python);
    command.current_dir(root);
    if setup.nproc > 1 {
        command.args(["-m", "torch.distributed.run", "--nproc_per_node", &setup.nproc.to_string()]);
        command.args(["--master_port", &free_port()?.to_string()]);
    }
    command
        .arg(BASELINE)
        .args(["--config", &config.to_string_lossy(), "--threads", &setup.threads_per_rank.to_string()])
        .args(["--steps", &workload.steps.to_string(), "--warmup", &workload.warmup.to_string()])
        .env("OMP_NUM_THREADS", setup.threads_per_rank.to_string())
        .env(SAME_ALLOCATOR.0, SAME_ALLOCATOR.1);
    workload.shape_flags(&mut command);
    let output = command.output().context("cannot run the PyTorch baseline")?;
    if !output.status.success() {
        bail!("the PyTorch baseline failed:\n{}", String::from_utf8_lossy(&output.stderr));
    }
    Ok(last_json_line::<Measurement>(&output.stdout)?.tokens_per_s)
}

/// The last line of `stdout` that is a JSON object, read as `T`.
fn last_json_line<T: DeserializeOwned>(stdout: &[u8]) -> Result<T> {
    let text = String::from_utf8_lossy(stdout);
    let line = text.lines().rev().find(|l| l.starts_with('{')).unwrap_or_default();
    serde_json::from_str(line).with_context(|| format!("unexpected bench output: {text}"))
}

pub fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// The interpreter for the PyTorch baselines, or `None` with a note saying why not.
pub fn python_with_torch() -> Option<String> {
    python_that_imports("torch").map_err(|why| println!("  PyTorch baseline skipped: {why}")).ok()
}

/// The smallest and the largest of `values`.
pub fn extremes(values: &[f64]) -> (f64, f64) {
    values.iter().fold((f64::MAX, f64::MIN), |(low, high), &v| (low.min(v), high.max(v)))
}

pub fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let mid = sorted.len() / 2;
    if sorted.len() % 2 == 1 {
        sorted[mid]
    } else {
        (sorted[mid - 1] + sorted[mid]) / 2.0
    }
}

/// Each setup's median beside its PyTorch peer: the median of the per-round
/// ratios, and their range.
fn table(samples: &[Samples]) -> String {
    let mut out = String::from(
        "| setup | threads | tokens/s | vs PyTorch, same ranks and threads | range over rounds | each round |\n\
         |---|---:|---:|---:|---:|---:|\n",
    );
    for row in samples {
        let peer = row.setup.peer().and_then(|p| samples.iter().find(|s| s.setup == p));
        let (ratio, range) = match peer {
            Some(b) => {
                let ratios: Vec<f64> = row.tokens_per_s.iter().zip(&b.tokens_per_s).map(|(w, p)| w / p).collect();
                let (low, high) = extremes(&ratios);
                (format!("{:.2}x", median(&ratios)), format!("{low:.2}x to {high:.2}x"))
            }
            None => (String::new(), String::new()),
        };
        let tokens_per_s = median(&row.tokens_per_s);
        let rounds: Vec<String> = row.tokens_per_s.iter().map(|t| format!("{t:.0}")).collect();
        out.push_str(&format!(
            "| {} | {} | {tokens_per_s:.0} | {ratio} | {range} | {} |\n",
            row.label.clone().unwrap_or_else(|| row.setup.name()),
            row.setup.threads(),
            rounds.join(", ")
        ));
    }
    out
}

/// T, the global batch and the micro-batches per step of `configs/<model_size>.toml`.
#[derive(Deserialize)]
struct ConfigShape {
    seq_len: usize,
    batch_size: usize,
    grad_accum_steps: usize,
}

/// The machine, so that runs on different ones can be compared: the CPU,
/// its cores, and (with PyTorch) torch's version, whether it has MKL, and a
/// GEMM calibration at 1 and 2 threads.
fn host(python: Option<&str>) -> String {
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let mut host = format!("{}, {cores} cores", cpu_model());
    let Some(python) = python else { return host };
    let calibrated = Command::new(python).arg(HOST).env(SAME_ALLOCATOR.0, SAME_ALLOCATOR.1).output();
    let info = calibrated.ok().filter(|o| o.status.success()).map(|o| last_json_line::<serde_json::Value>(&o.stdout));
    if let Some(Ok(info)) = info {
        host += &format!(
            "; torch {}, MKL {}; a 1024 × 1024 f32 matrix product at {:.0} GFLOP/s on 1 thread, {:.0} on 2",
            info["torch"].as_str().unwrap_or("?"),
            if info["mkl"].as_bool().unwrap_or(false) { "yes" } else { "no" },
            info["gflops_1"].as_f64().unwrap_or(f64::NAN),
            info["gflops_2"].as_f64().unwrap_or(f64::NAN),
        );
    }
    host
}

pub fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_else(|| "CPU model unknown".into())
}

/// Writes `body` under `heading` in the results file, replacing what that
/// heading held and keeping the other sections.
pub fn replace_section(path: &Path, heading: &str, body: &str) -> Result<()> {
    let old = std::fs::read_to_string(path).unwrap_or_default();
    let mut sections: Vec<(String, String)> = vec![];
    for chunk in old.split("\n## ").skip(1) {
        let (title, text) = chunk.split_once('\n').unwrap_or((chunk, ""));
        sections.push((format!("## {title}"), text.trim().to_string()));
    }
    match sections.iter_mut().find(|(title, _)| title == heading) {
        Some(section) => section.1 = body.trim().to_string(),
        None => sections.push((heading.to_string(), body.trim().to_string())),
    }
    let mut out = String::from("# Benchmark results\n");
    for (title, text) in sections {
        out.push_str(&format!("\n{title}\n\n{text}\n"));
    }
    std::fs::write(path, out).with_context(|| format!("cannot write {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::{replace_section, table, Framework, Samples, Setup, WORKBOOK};

    #[test]
    fn ratios_are_taken_within_a_round_against_the_peer_with_as_many_ranks() {
        let samples = [
            Samples { setup: Setup::new(WORKBOOK, 2, 1), label: None, tokens_per_s: vec![90.0, 200.0, 110.0] },
            Samples { setup: Setup::new(Framework::PyTorch, 1, 2), label: None, tokens_per_s: vec![50.0, 50.0, 50.0] },
            Samples {
                setup: Setup::new(Framework::PyTorch, 2, 1),
                label: None,
                tokens_per_s: vec![100.0, 200.0, 100.0],
            },
        ];
        let text = table(&samples);
        assert!(text.contains("| workbook, DDP on 2 processes | 2 | 110 | 1.00x | 0.90x to 1.10x |"), "{text}");
        assert!(text.contains("| PyTorch DDP (gloo, torchrun), 2 processes | 2 | 100 |  |  |"), "{text}");
    }

    #[test]
    fn a_section_is_replaced_and_the_others_kept() {
        let path = std::env::temp_dir().join(format!("results-{}.md", std::process::id()));
        std::fs::write(&path, "# Benchmark results\n\n## A\n\nold a\n\n## B\n\nb stays\n").unwrap();
        replace_section(&path, "## A", "new a").unwrap();
        replace_section(&path, "## C", "c").unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        assert_eq!(text, "# Benchmark results\n\n## A\n\nnew a\n\n## B\n\nb stays\n\n## C\n\nc\n");
    }
}
