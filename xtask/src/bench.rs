//! `bench`: the reference trainer's throughput beside PyTorch's, measured in one run.
//!
//! Speed claims belong to a benchmark, not to timed unit tests: this runs the
//! `bench` program of `trainer/` (one process on 1 and 2 kernel threads, and
//! DDP on 2 single-threaded CPU ranks, on the tiny config) and
//! `benchmarks/pytorch_baseline.py` (the same model, optimizer and batch in
//! PyTorch, on 1 and 2 threads) back to back, prints each setup's ratio to
//! PyTorch on as many threads and writes `benchmarks/results.md`.

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

pub fn bench(ws: &Workspace, model_size: &str, steps: usize) -> Result<bool> {
    println!("{}", render::bold(&format!("Training throughput, {model_size} config, {steps} timed steps")));
    let mut rows = vec![];
    for (nproc, threads) in SETUPS {
        rows.extend(workbook_throughput(&ws.root, model_size, steps, nproc, threads)?);
    }
    let mut baselines = vec![];
    for threads in THREAD_COUNTS {
        let Some(tokens_per_s) = pytorch_throughput(&ws.root, model_size, steps, threads)? else { break };
        baselines.push((threads, tokens_per_s));
        rows.push(Measurement { setup: "PyTorch, single process".into(), threads, tokens_per_s });
    }
    let table = table(&rows, &baselines);
    println!("{table}");
    let report = format!(
        "Written by `cargo xtask bench` (model size `{model_size}`, {steps} timed optimizer steps after 5 warm-up\n\
         steps, random tokens; {cpu}). Both sides train the same Llama-style model with AdamW\n\
         parameter groups, clipping and the same batch; tokens/s counts every rank's tokens, and\n\
         threads every rank's kernel threads. Each row is compared with PyTorch on as many threads,\n\
         on the same machine in the same run; README.md beside this file says where the time goes.\n\n{table}\n",
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

/// PyTorch's tokens/s on `threads` threads, or `None` (with a note) when no Python with torch is at hand.
fn pytorch_throughput(root: &Path, model_size: &str, steps: usize, threads: usize) -> Result<Option<f64>> {
    let python = std::env::var("WORKBOOK_PYTHON").unwrap_or_else(|_| "python3".into());
    let has_torch = Command::new(&python).args(["-c", "import torch"]).output().is_ok_and(|o| o.status.success());
    if !has_torch {
        println!("  PyTorch baseline skipped: `{python}` cannot import torch (set WORKBOOK_PYTHON to an interpreter that can)");
        return Ok(None);
    }
    let config = root.join("configs").join(format!("{model_size}.toml"));
    let output = Command::new(&python)
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
    Ok(Some(parsed.tokens_per_s))
}

/// Each row beside PyTorch on the same number of threads.
fn table(rows: &[Measurement], baselines: &[(usize, f64)]) -> String {
    let mut out = String::from("| setup | threads | tokens/s | vs PyTorch, same threads |\n|---|---:|---:|---:|\n");
    for row in rows {
        let baseline = baselines.iter().find(|(threads, _)| *threads == row.threads);
        let ratio = baseline.map_or("n/a".to_string(), |(_, b)| format!("{:.2}x", row.tokens_per_s / b));
        out.push_str(&format!("| {} | {} | {:.0} | {ratio} |\n", row.setup, row.threads, row.tokens_per_s));
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
    use super::replace_section;

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
