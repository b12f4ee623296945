//! `bench allreduce`: the process backend's ring all-reduce beside gloo's, in
//! bus bandwidth as nccl-tests define it, on 2 processes on loopback.
//!
//! Runs `trainer`'s `allreduce` program and `benchmarks/allreduce_gloo.py`
//! (started by torchrun) in interleaved rounds, takes each payload's ratio
//! within a round, and writes the table into `benchmarks/results.md` under its
//! own heading.

use std::path::Path;
use std::process::Command;

use anyhow::{bail, Context, Result};
use serde::Deserialize;
use xtask::render;
use xtask::workspace::{cargo, Workspace};

use crate::bench::{
    cpu_model, extremes, free_port, median, python_with_torch, replace_section, RESULTS, SAME_ALLOCATOR,
};

const HEADING: &str = "## All-reduce bus bandwidth";
const GLOO_ALLREDUCE: &str = "benchmarks/allreduce_gloo.py";
/// Payloads in MB, as nccl-tests sweeps them.
const SIZES_MB: &str = "1,4,16,64,256";

/// One payload's all-reduce timing, as `allreduce` and the gloo script print it.
#[derive(Debug, Deserialize)]
struct Bandwidth {
    bytes: u64,
    busbw_gbs: f64,
}

/// Each payload's bus bandwidth on both sides, one value per round.
struct Payload {
    bytes: u64,
    ours: Vec<f64>,
    gloo: Vec<f64>,
}

pub fn bench_allreduce(ws: &Workspace, rounds: usize) -> Result<bool> {
    if rounds == 0 {
        bail!("--rounds must be at least 1");
    }
    println!("{}", render::bold(&format!("All-reduce bus bandwidth, 2 processes on loopback, {rounds} rounds")));
    let python = python_with_torch();
    let mut payloads: Vec<Payload> = vec![];
    for round in 1..=rounds {
        println!("  round {round} of {rounds}");
        for mine in bandwidths(&mut ours(&ws.root), "the workbook's allreduce")? {
            match payloads.iter_mut().find(|p| p.bytes == mine.bytes) {
                Some(payload) => payload.ours.push(mine.busbw_gbs),
                None => payloads.push(Payload { bytes: mine.bytes, ours: vec![mine.busbw_gbs], gloo: vec![] }),
            }
        }
        if let Some(python) = python.as_deref() {
            for theirs in bandwidths(&mut gloo(&ws.root, python)?, "the gloo all-reduce")? {
                if let Some(payload) = payloads.iter_mut().find(|p| p.bytes == theirs.bytes) {
                    payload.gloo.push(theirs.busbw_gbs);
                }
            }
        }
    }
    let table = table(&payloads);
    println!("{table}");
    let body = format!(
        "Written by `cargo xtask bench allreduce` ({rounds} interleaved rounds, {cpu}). f32 payloads on\n\
         2 single-threaded processes on loopback, mean of 5 all-reduces after one warm-up, both sides\n\
         with the same allocator settings; busbw = payload / time · 2(N−1)/N, as nccl-tests define\n\
         it (`trainer/src/bin/allreduce.rs`, `{GLOO_ALLREDUCE}`). Each ratio is taken within a\n\
         round; the table gives the medians and the range of the ratios.\n\n{table}",
        cpu = cpu_model()
    );
    replace_section(&ws.root.join(RESULTS), HEADING, &body)?;
    println!("written to {RESULTS}");
    Ok(true)
}

/// The workbook's `allreduce` program on 2 processes.
fn ours(root: &Path) -> Command {
    let mut command = cargo(root);
    command.args(["run", "--quiet", "--package", "trainer", "--bin", "allreduce", "--"]).args([
        "--nproc",
        "2",
        "--sizes-mb",
        SIZES_MB,
    ]);
    command
}

/// gloo's all-reduce on 2 processes started by torchrun, on the trainer's allocator settings.
fn gloo(root: &Path, python: &str) -> Result<Command> {
    let mut command = Command::new(python);
    command
        .current_dir(root)
        .args(["-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", &free_port()?.to_string()])
        .args([GLOO_ALLREDUCE, "--sizes-mb", SIZES_MB])
        .env(SAME_ALLOCATOR.0, SAME_ALLOCATOR.1);
    Ok(command)
}

/// One run's bandwidths, each rank on one kernel thread.
fn bandwidths(command: &mut Command, what: &str) -> Result<Vec<Bandwidth>> {
    let output = command.env("RAYON_NUM_THREADS", "1").output().with_context(|| format!("cannot run {what}"))?;
    if !output.status.success() {
        bail!("{what} failed:\n{}", String::from_utf8_lossy(&output.stderr));
    }
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| line.find('{').map(|start| &line[start..]))
        .map(|json| serde_json::from_str(json).with_context(|| format!("unexpected output of {what}: {json}")))
        .collect()
}

/// Each payload's median bandwidths, the median of the per-round ratios and their range.
fn table(payloads: &[Payload]) -> String {
    let mut out = String::from(
        "| payload | workbook ring, busbw GB/s | gloo, busbw GB/s | ratio | range over rounds |\n\
         |---:|---:|---:|---:|---:|\n",
    );
    for payload in payloads {
        let ratios: Vec<f64> = payload.ours.iter().zip(&payload.gloo).map(|(o, g)| o / g).collect();
        let (gloo, ratio, range) = match ratios.is_empty() {
            true => (String::new(), String::new(), String::new()),
            false => {
                let (low, high) = extremes(&ratios);
                (
                    format!("{:.2}", median(&payload.gloo)),
                    format!("{:.2}x", median(&ratios)),
                    format!("{low:.2}x to {high:.2}x"),
                )
            }
        };
        out.push_str(&format!(
            "| {} MB | {:.2} | {gloo} | {ratio} | {range} |\n",
            payload.bytes / 1_000_000,
            median(&payload.ours)
        ));
    }
    out
}
