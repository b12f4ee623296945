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
}

/// The spans of the trace at `path`, ordered by start.
pub fn read(path: &Path) -> Result<Vec<Span>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let file: File =
        serde_json::from_str(&text).with_context(|| format!("{} is not a Chrome trace", path.display()))?;
    let mut spans: Vec<Span> = file
        .events
        .into_iter()
        .filter(|e| e.ph == "X")
        .map(|e| Span { rank: e.pid, name: e.name, category: e.cat, start: e.ts, end: e.ts + e.dur })
        .collect();
    spans.sort_by(|a, b| a.start.total_cmp(&b.start));
    Ok(spans)
}

/// The spans inside the last optimizer step every rank finished (the time
/// between the earliest start and the latest end of that step's `step N`
/// spans), with times relative to its start, in milliseconds.
pub fn last_step(spans: &[Span]) -> Result<Vec<Span>> {
    let step_of = |s: &Span| s.name.strip_prefix("step ").and_then(|n| n.parse::<usize>().ok());
    let last = spans.iter().filter_map(step_of).max().context("the trace holds no `step N` span")?;
    let steps: Vec<&Span> = spans.iter().filter(|s| step_of(s) == Some(last)).collect();
    let begin = steps.iter().map(|s| s.start).fold(f64::INFINITY, f64::min);
    let end = steps.iter().map(|s| s.end).fold(f64::NEG_INFINITY, f64::max);
    Ok(spans
        .iter()
        .filter(|s| s.start >= begin && s.end <= end && step_of(s).is_none())
        .map(|s| Span { start: (s.start - begin) / 1e3, end: (s.end - begin) / 1e3, ..s.clone() })
        .collect())
}
