//! The guide's figures: each one's file, the recorded data it is drawn
//! from (files in the guide's `figure-data/`), and how.

use std::path::Path;

use anyhow::{Context, Result};
use serde::de::DeserializeOwned;

use crate::lanes::{self, Curve, Panel};
use crate::loss::{self, StepPoint};
use crate::ring::{self, RingRecord};
use crate::style::{BACKWARD, COMM, FORWARD, IDLE, REDUCE};
use crate::{megatron, pipeline, ranks, trace, zero};

/// One figure of the guide.
pub struct Figure {
    /// The SVG's file name in `guide/src/figures/`.
    pub file: &'static str,
    draw: fn(&Path) -> Result<String>,
}

impl Figure {
    /// Draws the figure from the data files in `data`.
    pub fn draw(&self, data: &Path) -> Result<String> {
        (self.draw)(data).with_context(|| format!("drawing {}", self.file))
    }
}

pub const FIGURES: &[Figure] = &[
    Figure { file: "loss-curve.svg", draw: loss_curve },
    Figure { file: "pipeline-schedules.svg", draw: pipeline_schedules },
    Figure { file: "fsdp-timeline.svg", draw: fsdp_timeline },
    Figure { file: "ddp-overlap.svg", draw: ddp_overlap },
    Figure { file: "ring-steps.svg", draw: ring_steps },
    Figure { file: "zero-memory.svg", draw: zero_memory },
    Figure { file: "megatron-mlp.svg", draw: megatron_mlp },
];

/// The text of the data file `file`.
fn read(data: &Path, file: &str) -> Result<String> {
    let path = data.join(file);
    std::fs::read_to_string(&path)
        .with_context(|| format!("cannot read {}: record it with `cargo xtask figures --record`", path.display()))
}

/// The data file `file`, read as JSON.
fn json<T: DeserializeOwned>(data: &Path, file: &str) -> Result<T> {
    serde_json::from_str(&read(data, file)?).with_context(|| format!("{file} is not what its figure expects"))
}

/// The last step of the trace `file`.
pub(crate) fn last_step(data: &Path, file: &str) -> Result<trace::Trace> {
    trace::read(&data.join(file))?.last_step()
}

/// The records of the `metrics.jsonl` the loss curve is drawn from, one per step.
pub(crate) fn loss_curve_records(data: &Path) -> Result<Vec<serde_json::Value>> {
    read(data, "loss-curve.metrics.jsonl")?
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|line| serde_json::from_str(line).with_context(|| format!("bad metrics line: {line}")))
        .collect()
}

fn loss_curve(data: &Path) -> Result<String> {
    let mut points = vec![];
    for record in loss_curve_records(data)? {
        let number = |key: &str| record[key].as_f64().unwrap_or(f64::NAN);
        points.push(StepPoint {
            step: record["step"].as_u64().unwrap_or(0) as usize,
            loss: number("loss"),
            lr: number("lr"),
            eval_loss: record["eval_loss"].as_f64(),
        });
    }
    loss::draw("tiny model on the bundled stories: loss, held-out loss and learning rate", &points)
}

fn pipeline_schedules(data: &Path) -> Result<String> {
    let panels: Vec<Panel> = [("GPipe", "gpipe.trace.json"), ("1F1B", "1f1b.trace.json")]
        .into_iter()
        .map(|(name, file)| pipeline::panel(name, &last_step(data, file)?.spans))
        .collect::<Result<_>>()?;
    lanes::draw(
        &panels,
        None,
        "milliseconds into the step",
        &[("forward Fk of micro-batch k", FORWARD), ("backward Bk", BACKWARD), ("idle: the bubble", IDLE)],
    )
}

fn fsdp_timeline(data: &Path) -> Result<String> {
    let step = last_step(data, "fsdp.trace.json")?;
    let title = "FULL_SHARD on 2 ranks: one step of the tiny model".to_string();
    let legend = [
        ("forward Fb of block b", FORWARD),
        ("backward Bb of block b", BACKWARD),
        ("AG all-gather", COMM),
        ("RS reduce-scatter", REDUCE),
        ("idle", IDLE),
    ];
    let colors = [FORWARD, BACKWARD];
    let series = (0..2)
        .map(|rank| {
            let points = step.samples.iter().filter(|s| s.rank == rank && s.name == "gathered bytes");
            let mib: Vec<(f64, f64)> = points.map(|s| (s.time, s.value / (1u64 << 20) as f64)).collect();
            (format!("rank {rank}"), colors[rank], mib)
        })
        .collect();
    let curve = Curve {
        title: "Gathered (unsharded) parameters alive on each rank".to_string(),
        unit: "MiB".to_string(),
        series,
    };
    lanes::draw(&[ranks::panel(title, &step.spans)?], Some(&curve), "milliseconds into the step", &legend)
}

fn ddp_overlap(data: &Path) -> Result<String> {
    let spans = last_step(data, "ddp-overlap.trace.json")?.spans;
    let title = "DDP with --ddp-overlap on 2 ranks: buckets all-reduced during backward".to_string();
    let legend = [
        ("forward Fb of block b", FORWARD),
        ("backward Bb", BACKWARD),
        ("AR a bucket's all-reduce", REDUCE),
        ("idle", IDLE),
    ];
    lanes::draw(&[ranks::panel(title, &spans)?], None, "milliseconds into the step", &legend)
}

fn ring_steps(data: &Path) -> Result<String> {
    ring::draw(&json::<RingRecord>(data, "ring.json")?)
}

fn zero_memory(data: &Path) -> Result<String> {
    zero::draw(&zero::rows(&read(data, "zero-memory.jsonl")?)?)
}

fn megatron_mlp(data: &Path) -> Result<String> {
    megatron::draw(&json(data, "megatron-mlp.json")?)
}
