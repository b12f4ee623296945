//! Reads the Chrome trace that `train --trace` writes: every span with its
//! rank (the trace's process) and category (compute on the rank's thread,
//! comm on its communication thread).

use std::path::Path;

use anyhow::{Context, Result};
use serde::Deserialize;

/// One span of a trace, in microseconds of wall clock.
#[derive(Debug, Clone)]
pub struct Span {
    pub rank: usize,
    pub name: String,
    pub category: String,
    pub start: f64,
    pub end: f64,
}

#[derive(Deserialize)]
struct File {
    #[serde(rename = "traceEvents")]
    events: Vec<Event>,
}

#[derive(Deserialize)]
struct Event {
    name: String,
    ph: String,
    #[serde(default)]
    cat: String,
    #[serde(default)]
    ts: f64,
    #[serde(default)]
    dur: f64,
    #[serde(default)]
    pid: usize,
    #[serde(default)]
    args: Option<serde_json::Value>,
}

/// A counter's new value (e.g. the bytes of gathered FSDP units), from its
/// time on, in microseconds of wall clock.
#[derive(Debug, Clone)]
pub struct Sample {
    pub rank: usize,
    pub name: String,
    pub time: f64,
    pub value: f64,
}

/// A trace's spans and counter samples, each ordered by time.
pub struct Trace {
    pub spans: Vec<Span>,
    pub samples: Vec<Sample>,
}

/// The spans and counter samples of the trace at `path`.
pub fn read(path: &Path) -> Result<Trace> {
    let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let file: File =
        serde_json::from_str(&text).with_context(|| format!("{} is not a Chrome trace", path.display()))?;
    let mut samples: Vec<Sample> = file
        .events
        .iter()
        .filter(|e| e.ph == "C")
        .map(|e| Sample {
            rank: e.pid,
            name: e.name.clone(),
            time: e.ts,
            value: e.args.as_ref().and_then(|a| a["value"].as_f64()).unwrap_or(0.0),
        })
        .collect();
    samples.sort_by(|a, b| a.time.total_cmp(&b.time));
    let mut spans: Vec<Span> = file
        .events
        .into_iter()
        .filter(|e| e.ph == "X")
        .map(|e| Span { rank: e.pid, name: e.name, category: e.cat, start: e.ts, end: e.ts + e.dur })
        .collect();
    spans.sort_by(|a, b| a.start.total_cmp(&b.start));
    Ok(Trace { spans, samples })
}

impl Trace {
    /// What happened inside the last optimizer step every rank finished (the
    /// time between the earliest start and the latest end of that step's
    /// `step N` spans), with times relative to its start, in milliseconds.
    /// Each counter starts at the value it had when the step began.
    pub fn last_step(&self) -> Result<Trace> {
        let step_of = |s: &Span| s.name.strip_prefix("step ").and_then(|n| n.parse::<usize>().ok());
        let last = self.spans.iter().filter_map(step_of).max().context("the trace holds no `step N` span")?;
        let steps: Vec<&Span> = self.spans.iter().filter(|s| step_of(s) == Some(last)).collect();
        let begin = steps.iter().map(|s| s.start).fold(f64::INFINITY, f64::min);
        let end = steps.iter().map(|s| s.end).fold(f64::NEG_INFINITY, f64::max);
        let spans = self
            .spans
            .iter()
            .filter(|s| s.start >= begin && s.end <= end && step_of(s).is_none())
            .map(|s| Span { start: (s.start - begin) / 1e3, end: (s.end - begin) / 1e3, ..s.clone() })
            .collect();
        let mut samples = vec![];
        for sample in &self.samples {
            let at = ((sample.time - begin) / 1e3).max(0.0);
            if sample.time > end {
                continue;
            }
            // A sample before the step is the value the step starts with.
            if sample.time < begin {
                samples.retain(|s: &Sample| !(s.rank == sample.rank && s.name == sample.name));
            }
            samples.push(Sample { time: at, ..sample.clone() });
        }
        Ok(Trace { spans, samples })
    }
}
