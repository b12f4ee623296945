//! `bench`: the reference trainer's throughput beside PyTorch's, measured in one run.
//!
//! Speed claims belong to a benchmark, not to timed unit tests: this runs the
//! `bench` program of `trainer/` (one process on 1 and 2 kernel threads, and
//! DDP on 2 single-threaded CPU ranks, on the tiny config) and
//! `benchmarks/pytorch_baseline.py` (the same model, optimizer and batch in
//! PyTorch, on 1 and 2 threads) in interleaved rounds, prints each setup's
//! ratio to PyTorch on as many threads and writes `benchmarks/results.md`.

use std::path::Path;
use std::process::Command;

use anyhow::{bail, Context, Result};
use serde::Deserialize;

use crate::render;
use crate::workspace::Workspace;

pub const RESULTS: &str = "benchmarks/results.md";
const THROUGHPUT_HEADING: &str = "## Training throughput";
const BASELINE: &str = "benchmarks/pytorch_baseline.py";

#[derive(Debug, Deserialize)]
struct Measurement {
    setup: String,
    threads: usize,
    tokens_per_s: f64,
}

/// The baseline script's output line (its other fields are ignored).
#[derive(Debug, Deserialize)]
struct Baseline {
    tokens_per_s: f64,
}

/// The workbook's setups: (ranks, kernel threads per rank). Every setup is
/// compared with PyTorch running on as many threads in all.
const SETUPS: [(usize, usize); 3] = [(1, 1), (1, 2), (2, 1)];
const THREAD_COUNTS: [usize; 2] = [1, 2];
const PYTORCH: &str = "PyTorch, single process";

/// One setup's tokens/s, one value per round.
struct Samples {
    setup: String,
    threads: usize,
    tokens_per_s: Vec<f64>,
}

pub fn bench(ws: &Workspace, model_size: &str, steps: usize, rounds: usize) -> Result<bool> {
    if rounds == 0 {
        bail!("--rounds must be at least 1");
    }
    println!("{}", render::bold(&format!("Training throughput, {model_size} config, {steps} timed steps, {rounds} rounds")));
    let python = python_with_torch();
    let mut samples: Vec<Samples> = vec![];
    let mut record = |m: Measurement| match samples.iter_mut().find(|s| s.setup == m.setup && s.threads == m.threads) {
        Some(s) => s.tokens_per_s.push(m.tokens_per_s),
        None => samples.push(Samples { setup: m.setup, threads: m.threads, tokens_per_s: vec![m.tokens_per_s] }),
    };
    // Rounds interleave the two sides, so that a machine that slows down for
    // a while slows both, and each ratio is taken within one round.
    for round in 1..=rounds {
        println!("  round {round} of {rounds}");
        for (nproc, threads) in SETUPS {
            workbook_throughput(&ws.root, model_size, steps, nproc, threads)?.into_iter().for_each(&mut record);
        }
        for threads in THREAD_COUNTS {
            let Some(python) = &python else { break };
            let tokens_per_s = pytorch_throughput(&ws.root, python, model_size, steps, threads)?;
            record(Measurement { setup: PYTORCH.into(), threads, tokens_per_s });
        }
    }
    let table = table(&samples);
    println!("{table}");
    let report = format!(
        "Written by `cargo xtask bench` (model size `{model_size}`, {steps} timed optimizer steps after 5 warm-up\n\
         steps, random tokens, {rounds} interleaved rounds; {cpu}). Both sides train the same Llama-style\n\
         model with AdamW parameter groups, clipping and the same batch; tokens/s counts every rank's\n\
         tokens, and threads every rank's kernel threads. Each row is compared with PyTorch on as many\n\
         threads in the same round; the table gives the median over rounds and the range of the\n\
         ratios. README.md beside this file says where the time goes.\n\n{table}\n",
        cpu = cpu_model()
    );
    replace_section(&ws.root.join(RESULTS), THROUGHPUT_HEADING, &report)?;
    println!("written to {RESULTS}");
    Ok(true)
}

/// One process per setup: the kernel thread pool is sized once per process.
fn workbook_throughput(root: &Path, model_size: &str, steps: usize, nproc: usize, threads: usize) -> Result<Vec<Measurement>> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let output = Command::new(&cargo)
        .current_dir(root)
        .env("RAYON_NUM_THREADS", threads.to_string())
        .args(["run", "--quiet", "--package", "trainer", "--features", "solutions", "--bin", "bench", "--"])
        .args(["--model-size", model_size, "--steps", &steps.to_string(), "--nproc", &nproc.to_string()])
        .output()
        .context("cannot run cargo")?;
    if !output.status.success() {
        bail!("the trainer's bench failed:\n{}", String::from_utf8_lossy(&output.stderr));
    }
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter(|line| line.starts_with('{'))
        .map(|line| serde_json::from_str(line).with_context(|| format!("unexpected bench output: {line}")))
        .collect()
}

/// `python3`, or the interpreter named by WORKBOOK_PYTHON, when it can import
/// torch; `None` (with a note) otherwise.
fn python_with_torch() -> Option<String> {
    let python = std::env::var("WORKBOOK_PYTHON").unwrap_or_else(|_| "python3".into());
    let has_torch = Command::new(&python).args(["-c", "import torch"]).output().is_ok_and(|o| o.status.success());
    if !has_torch {
        println!("  PyTorch baseline skipped: `{python}` cannot import torch (set WORKBOOK_PYTHON to an interpreter that can)");
    }
    has_torch.then_some(python)
}

/// PyTorch's tokens/s on `threads` threads.
fn pytorch_throughput(root: &Path, python: &str, model_size: &str, steps: usize, threads: usize) -> Result<f64> {
    let config = root.join("configs").join(format!("{model_size}.toml"));
    let output = Command::new(python)
        .current_dir(root)
        .arg(BASELINE)
        .args(["--config", &config.to_string_lossy(), "--threads", &threads.to_string(), "--steps", &steps.to_string()])
        .output()
        .context("cannot run the PyTorch baseline")?;
    if !output.status.success() {
        bail!("the PyTorch baseline failed:\n{}", String::from_utf8_lossy(&output.stderr));
    }
    let line = String::from_utf8_lossy(&output.stdout).lines().last().unwrap_or_default().to_string();
    let parsed: Baseline = serde_json::from_str(&line).with_context(|| format!("unexpected baseline output: {line}"))?;
    Ok(parsed.tokens_per_s)
}

fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let mid = sorted.len() / 2;
    if sorted.len() % 2 == 1 { sorted[mid] } else { (sorted[mid - 1] + sorted[mid]) / 2.0 }
}

/// Each setup's median beside PyTorch on the same number of threads: the
/// median of the per-round ratios, and their range.
fn table(samples: &[Samples]) -> String {
    let mut out = String::from("| setup | threads | tokens/s | vs PyTorch, same threads | range over rounds |\n|---|---:|---:|---:|---:|\n");
    for row in samples {
        let baseline = samples.iter().find(|s| s.setup == PYTORCH && s.threads == row.threads);
        let (ratio, range) = match baseline {
            Some(b) if row.setup != PYTORCH => {
                let ratios: Vec<f64> = row.tokens_per_s.iter().zip(&b.tokens_per_s).map(|(w, p)| w / p).collect();
                let (low, high) = ratios.iter().fold((f64::MAX, f64::MIN), |(lo, hi), &r| (lo.min(r), hi.max(r)));
                (format!("{:.2}x", median(&ratios)), format!("{low:.2}x to {high:.2}x"))
            }
            _ => (String::new(), String::new()),
        };
        out.push_str(&format!("| {} | {} | {:.0} | {ratio} | {range} |\n", row.setup, row.threads, median(&row.tokens_per_s)));
    }
    out
}

pub fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| info.lines().find(|l| l.starts_with("model name")).map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string()))
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
    use super::{replace_section, table, Samples, PYTORCH};

    #[test]
    fn ratios_are_taken_within_a_round() {
        let samples = [
            Samples { setup: "workbook".into(), threads: 1, tokens_per_s: vec![90.0, 200.0, 110.0] },
            Samples { setup: PYTORCH.into(), threads: 1, tokens_per_s: vec![100.0, 200.0, 100.0] },
        ];
        let text = table(&samples);
        assert!(text.contains("| workbook | 1 | 110 | 1.00x | 0.90x to 1.10x |"), "{text}");
        assert!(text.contains(&format!("| {PYTORCH} | 1 | 100 |  |  |")), "{text}");
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
