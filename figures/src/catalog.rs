//! The guide's figures: each one's file, the recorded data it is drawn
//! from (files in the guide's `figure-data/`), and how.

use std::path::Path;

use anyhow::{Context, Result};
use plotters::style::RGBColor;
use serde::de::DeserializeOwned;

use crate::lanes::{self, Curve, Panel};
use crate::loss::{self, StepPoint};
use crate::ring::{self, RingRecord};
use crate::schedule::Schedule;
use crate::spike::{self, Run};
use crate::style::{BACKWARD, COMM, FORWARD, IDLE, REDUCE};
use crate::{formats, megatron, mesh, mixed_memory, pipeline, ranks, sequence, trace, zero, zero_flow};

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
    Figure { file: "loss-spike.svg", draw: loss_spike },
    Figure { file: "pipeline-schedules.svg", draw: pipeline_schedules },
    Figure { file: "pipeline-slots.svg", draw: pipeline_slots },
    Figure { file: "fsdp-timeline.svg", draw: fsdp_timeline },
    Figure { file: "fsdp-prefetch.svg", draw: fsdp_prefetch },
    Figure { file: "ddp-overlap.svg", draw: ddp_overlap },
    Figure { file: "ring-steps.svg", draw: ring_steps },
    Figure { file: "zero-memory.svg", draw: zero_memory },
    Figure { file: "zero-step.svg", draw: zero_step },
    Figure { file: "precision-memory.svg", draw: precision_memory },
    Figure { file: "megatron-mlp.svg", draw: megatron_mlp },
    Figure { file: "float-formats.svg", draw: float_formats },
    Figure { file: "device-mesh.svg", draw: device_mesh },
    Figure { file: "sequence-parallel.svg", draw: sequence_parallel },
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
    metrics_records(data, "loss-curve.metrics.jsonl")
}

/// The records of a recorded run's `metrics.jsonl`, one per step.
pub(crate) fn metrics_records(data: &Path, file: &str) -> Result<Vec<serde_json::Value>> {
    read(data, file)?
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|line| serde_json::from_str(line).with_context(|| format!("bad metrics line: {line}")))
        .collect()
}

/// The recorded run whose loss spiked: its steps, and the clipping threshold
/// and peak learning rate its final trainer state holds.
pub(crate) struct SpikeRun {
    pub steps: Vec<spike::Step>,
    pub max_grad_norm: f64,
    pub max_lr: f64,
}

/// The optimizer steps of the metrics file `file`, as the spike figure
/// draws them: a non-finite loss or norm (a skipped update) is written as
/// text, read as NaN. Step 0, the evaluation before training, is no step.
pub(crate) fn spike_steps(data: &Path, file: &str) -> Result<Vec<spike::Step>> {
    let finite_or_nan = |value: &serde_json::Value| value.as_f64().unwrap_or(f64::NAN);
    let mut steps = vec![];
    for record in metrics_records(data, file)? {
        let step = record["step"].as_u64().with_context(|| format!("a metrics line has no step: {record}"))?;
        if step > 0 {
            steps.push(spike::Step {
                step: step as usize,
                loss: finite_or_nan(&record["loss"]),
                grad_norm: finite_or_nan(&record["grad_norm"]),
            });
        }
    }
    Ok(steps)
}

/// The largest learning rate the metrics file `file` records: its schedule's peak.
pub(crate) fn peak_lr(data: &Path, file: &str) -> Result<f64> {
    let peak = metrics_records(data, file)?.iter().filter_map(|r| r["lr"].as_f64()).fold(0.0, f64::max);
    // The warmup's last step computes the peak in floating point: 0.003 may come out 0.0030000000000000005.
    Ok((peak * 1e6).round() / 1e6)
}

pub(crate) fn spike_run(data: &Path) -> Result<SpikeRun> {
    let state: serde_json::Value = json(data, "loss-spike.trainer_state.json")?;
    let number = |pointer: &str| {
        state.pointer(pointer).and_then(|v| v.as_f64()).with_context(|| format!("the trainer state has no {pointer}"))
    };
    Ok(SpikeRun {
        steps: spike_steps(data, "loss-spike.metrics.jsonl")?,
        max_grad_norm: number("/train/max_grad_norm")?,
        max_lr: number("/train/schedule/max_lr")?,
    })
}

fn loss_spike(data: &Path) -> Result<String> {
    let spiked = spike_run(data)?;
    let calm = spike_steps(data, "loss-curve.metrics.jsonl")?;
    let spiked_name = format!("peak lr {}", spiked.max_lr);
    let calm_name = format!("peak lr {} (the config's)", peak_lr(data, "loss-curve.metrics.jsonl")?);
    let runs = [
        Run { name: &spiked_name, color: BACKWARD, steps: &spiked.steps },
        Run { name: &calm_name, color: FORWARD, steps: &calm },
    ];
    spike::draw("tiny model, same data and seed: a peak learning rate that spikes", &runs, spiked.max_grad_norm)
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

/// A pipeline figure's key: the passes and the bubble.
const PIPELINE_LEGEND: [(&str, RGBColor); 3] =
    [("forward Fk of micro-batch k", FORWARD), ("backward Bk", BACKWARD), ("idle: the bubble", IDLE)];

fn pipeline_schedules(data: &Path) -> Result<String> {
    let panels: Vec<Panel> = [(Schedule::GPipe, "gpipe.trace.json"), (Schedule::OneFOneB, "1f1b.trace.json")]
        .into_iter()
        .map(|(schedule, file)| pipeline::panel(schedule, &last_step(data, file)?.spans))
        .collect::<Result<_>>()?;
    lanes::draw(&panels, None, "milliseconds into the step", &PIPELINE_LEGEND)
}

/// The stages and micro-batches of the recorded pipeline runs, which the
/// idealised chart is drawn beside.
const IDEAL_STAGES: usize = 4;
const IDEAL_MICRO_BATCHES: usize = 8;

/// The schedules by their rules alone: derived, not recorded, so it reads no data.
fn pipeline_slots(_data: &Path) -> Result<String> {
    let panels: Vec<Panel> = [Schedule::GPipe, Schedule::OneFOneB]
        .into_iter()
        .map(|schedule| pipeline::ideal_panel(schedule, IDEAL_STAGES, IDEAL_MICRO_BATCHES))
        .collect::<Result<_>>()?;
    lanes::draw(&panels, None, "slot: each forward and each backward takes one", &PIPELINE_LEGEND)
}

/// What the FSDP figures' lanes show, in colour.
const FSDP_LEGEND: [(&str, RGBColor); 5] = [
    ("forward Fb of block b", FORWARD),
    ("backward Bb of block b", BACKWARD),
    ("AG all-gather", COMM),
    ("RS reduce-scatter", REDUCE),
    ("idle", IDLE),
];

/// The caption of the curve of gathered parameters under FSDP's lanes.
const GATHERED: &str = "Gathered (unsharded) parameters alive";

/// The MiB of gathered parameters `rank` held over `step`, from its counter.
fn gathered_mib(step: &trace::Trace, rank: usize) -> Vec<(f64, f64)> {
    let points = step.samples.iter().filter(|s| s.rank == rank && s.name == "gathered bytes");
    points.map(|s| (s.time, s.value / (1u64 << 20) as f64)).collect()
}

fn fsdp_timeline(data: &Path) -> Result<String> {
    let step = last_step(data, "fsdp.trace.json")?;
    let title = "FULL_SHARD on 2 ranks: one step of the tiny model".to_string();
    let colors = [FORWARD, BACKWARD];
    let series = (0..2).map(|rank| (format!("rank {rank}"), colors[rank], gathered_mib(&step, rank))).collect();
    let curve = Curve { title: format!("{GATHERED} on each rank"), unit: "MiB".to_string(), series };
    lanes::draw(&[ranks::panel(title, &step.spans)?], Some(&curve), "milliseconds into the step", &FSDP_LEGEND)
}

/// The same FULL_SHARD run without and with `--prefetch`, one panel each on
/// one time axis, and rank 0's gathered parameters in each under them.
fn fsdp_prefetch(data: &Path) -> Result<String> {
    let runs =
        [("without --prefetch", "fsdp.trace.json", FORWARD), ("with --prefetch", "fsdp-prefetch.trace.json", BACKWARD)];
    let mut panels = vec![];
    let mut series = vec![];
    for (name, file, color) in runs {
        let step = last_step(data, file)?;
        let title = format!("FULL_SHARD on 2 ranks, {name}: one step of the tiny model");
        panels.push(ranks::panel(title, &step.spans)?);
        series.push((format!("rank 0, {name}"), color, gathered_mib(&step, 0)));
    }
    let curve = Curve { title: format!("{GATHERED} on rank 0 of each run"), unit: "MiB".to_string(), series };
    lanes::draw(&panels, Some(&curve), "milliseconds into the step", &FSDP_LEGEND)
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

fn precision_memory(data: &Path) -> Result<String> {
    mixed_memory::draw(&mixed_memory::rows(&read(data, "precision-memory.jsonl")?)?)
}

/// ZeRO-1/2's step is drawn from its formulas, not from a run: it reads no data.
fn zero_step(_data: &Path) -> Result<String> {
    zero_flow::draw(4)
}

fn megatron_mlp(data: &Path) -> Result<String> {
    megatron::draw(&json(data, "megatron-mlp.json")?)
}

fn device_mesh(data: &Path) -> Result<String> {
    mesh::draw(&json(data, "device-mesh.json")?)
}

/// Drawn from the step's structure: it reads no data.
fn sequence_parallel(_data: &Path) -> Result<String> {
    sequence::draw()
}

/// Worked out from the formats' bit widths: it reads no data.
fn float_formats(_data: &Path) -> Result<String> {
    formats::draw()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::style::SMALL;

    /// The sizes of every `font-size="…"` in `svg`.
    fn font_sizes(svg: &str) -> Vec<f64> {
        svg.split("font-size=\"").skip(1).filter_map(|rest| rest.split('"').next()?.parse().ok()).collect()
    }

    #[test]
    fn no_figure_prints_text_smaller_than_the_guides_small_print() {
        let data = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../guide/figure-data"));
        for figure in FIGURES {
            let sizes = font_sizes(&figure.draw(data).unwrap());
            assert!(!sizes.is_empty(), "{} has no text: is the SVG backend still writing font-size?", figure.file);
            let smallest = sizes.iter().copied().fold(f64::INFINITY, f64::min);
            // A hair under, for plotters' float arithmetic (15 comes out as 15.000000000000002).
            assert!(
                smallest >= SMALL - 1e-9,
                "{} prints text at {smallest} px, under {SMALL} px at its native width: size it with style::font",
                figure.file
            );
        }
    }
}
