//! The measured numbers the guide quotes: one small file per source under
//! `guide/src/numbers/`, each number (with its unit) or table between a pair
//! of anchor lines, and each chapter that quotes one holds it between two
//! comments naming its file and anchor ([`chapters`]), written again from
//! the file with it. So every number a chapter shows comes from a committed
//! run (`benchmarks/results.md` or a run recorded in `guide/figure-data/`),
//! and a new run changes every chapter that quotes it. Numbers derived from
//! measured ones (an MFU from tokens/s) are computed here, never typed.

mod allreduce;
pub mod chapters;
pub(crate) mod format;
mod fsdp;
mod gpu;
mod mesh;
mod model;
mod phase4;
mod results;
mod runs;
mod throughput;

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use results::Results;

/// Everything a quoted number is computed from.
pub struct Sources {
    results: Results,
    /// The recorded runs: `guide/figure-data/`.
    data: PathBuf,
    /// The model configs: `configs/`.
    configs: PathBuf,
}

impl Sources {
    pub fn read(results: &Path, data: &Path, configs: &Path) -> Result<Sources> {
        let text = std::fs::read_to_string(results).with_context(|| format!("cannot read {}", results.display()))?;
        Ok(Sources { results: Results::parse(&text), data: data.to_path_buf(), configs: configs.to_path_buf() })
    }
}

/// One number, phrase or table, under the anchor a chapter quotes it by.
pub struct Quote {
    anchor: &'static str,
    text: String,
}

fn quote(anchor: &'static str, text: impl Into<String>) -> Quote {
    Quote { anchor, text: text.into() }
}

/// A markdown table of `rows` under `header` (its title and alignment
/// lines), quoted whole: a comment between a table's lines would end it.
fn table(header: &str, rows: String) -> String {
    format!("{header}\n{rows}")
}

/// `body` as a plain-text code block, quoted whole, fences and all.
fn code_block(body: String) -> String {
    format!("```text\n{body}\n```")
}

/// One generated file of quotes.
pub struct NumberFile {
    /// Its name in `guide/src/numbers/`.
    pub file: &'static str,
    /// Where its numbers come from, for the reader of the file.
    from: &'static str,
    quotes: fn(&Sources) -> Result<Vec<Quote>>,
}

impl NumberFile {
    /// The file's text: a header saying where it comes from, then each quote
    /// between `ANCHOR: name` and `ANCHOR_END: name` lines.
    pub fn render(&self, sources: &Sources) -> Result<String> {
        let quotes = (self.quotes)(sources).with_context(|| format!("computing the numbers of {}", self.file))?;
        let mut text =
            format!("<!-- Written by `cargo xtask figures` from {}: do not edit, run it again. -->\n", self.from);
        for Quote { anchor, text: body } in quotes {
            text.push_str(&format!("ANCHOR: {anchor}\n{body}\nANCHOR_END: {anchor}\n"));
        }
        Ok(text)
    }
}

pub const NUMBER_FILES: &[NumberFile] = &[
    NumberFile {
        file: "throughput.md",
        from: "benchmarks/results.md (`## Training throughput`) and configs/small.toml",
        quotes: throughput::quotes,
    },
    NumberFile {
        file: "gpu.md",
        from: "benchmarks/results.md (`## On one GPU`) and configs/small.toml",
        quotes: gpu::quotes,
    },
    NumberFile {
        file: "phase4.md",
        from: "benchmarks/results.md (`## Phase 4 inside the trainer` and `## All-reduce bus bandwidth`)",
        quotes: phase4::quotes,
    },
    NumberFile {
        file: "mesh.md",
        from: "benchmarks/results.md (`## Parallelisms composed on a mesh`)",
        quotes: mesh::quotes,
    },
    NumberFile {
        file: "fsdp.md",
        from: "benchmarks/results.md (`## FSDP: memory and communication per rank`)",
        quotes: fsdp::quotes,
    },
    NumberFile {
        file: "allreduce.md",
        from: "benchmarks/results.md (`## All-reduce bus bandwidth`)",
        quotes: allreduce::quotes,
    },
    NumberFile {
        file: "loss-curve-run.md",
        from: "guide/figure-data/loss-curve.metrics.jsonl and configs/tiny.toml",
        quotes: runs::loss_curve,
    },
    NumberFile {
        file: "loss-spike-run.md",
        from: "guide/figure-data/loss-spike.metrics.jsonl, loss-spike.trainer_state.json and loss-curve.metrics.jsonl",
        quotes: runs::loss_spike,
    },
    NumberFile {
        file: "ddp-overlap-run.md",
        from: "guide/figure-data/ddp-overlap.trace.json",
        quotes: runs::ddp_overlap,
    },
    NumberFile { file: "fsdp-run.md", from: "guide/figure-data/fsdp.trace.json", quotes: runs::fsdp },
];
