//! A timeline of what each rank did and when, as a Chrome trace: open the
//! file in <https://ui.perfetto.dev> or `chrome://tracing` and every rank is
//! a process, every thread a track (the rank's own work, its communication
//! thread), every span a bar. Overlap, idle ranks and the gather/free rhythm
//! of FSDP are then seen, not just counted.
//!
//! Off unless [`enable`] is called: a [`span`] then costs one atomic load.
//! Spans are stamped with wall-clock microseconds, so the files of ranks on
//! one machine line up when [`merge`] puts them together.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use candle_core::Result;
use serde_json::{json, Value};

use crate::error::io_path;

static ENABLED: AtomicBool = AtomicBool::new(false);
static TIMELINE: OnceLock<Timeline> = OnceLock::new();

struct Timeline {
    /// The process id in the trace: the rank, for a rank that is a process.
    pid: usize,
    /// What the trace calls the process: `rank 3`.
    label: String,
    /// The wall clock at `origin`, in microseconds since the Unix epoch.
    epoch_us: f64,
    origin: Instant,
    events: Mutex<Vec<Value>>,
    /// Thread names in the order their first span ended: their track numbers.
    threads: Mutex<Vec<String>>,
}

/// Starts recording this process's spans, as process `pid` called `label`
/// (`rank 3`) in the trace. Later calls do nothing.
pub fn enable(pid: usize, label: String) {
    let epoch_us = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64() * 1e6);
    TIMELINE.get_or_init(|| Timeline {
        pid,
        label,
        epoch_us,
        origin: Instant::now(),
        events: Mutex::new(vec![]),
        threads: Mutex::new(vec![]),
    });
    ENABLED.store(true, Ordering::Release);
}

/// A span that ends when the guard is dropped.
#[must_use = "the span ends when this guard is dropped"]
pub struct Span {
    started: Option<(Instant, String, &'static str)>,
}

/// Opens a span called `name` in `category` (`"compute"`, `"comm"`, `"io"`)
/// on the current thread; it closes when the returned guard drops.
pub fn span(category: &'static str, name: impl Into<String>) -> Span {
    if !ENABLED.load(Ordering::Acquire) {
        return Span { started: None };
    }
    Span { started: Some((Instant::now(), name.into(), category)) }
}

impl Drop for Span {
    fn drop(&mut self) {
        let (Some((start, name, category)), Some(timeline)) = (self.started.take(), TIMELINE.get()) else {
            return;
        };
        let thread = std::thread::current().name().unwrap_or("main").to_string();
        let event = json!({
            "name": name,
            "cat": category,
            "ph": "X",
            "ts": timeline.epoch_us + (start - timeline.origin).as_secs_f64() * 1e6,
            "dur": start.elapsed().as_secs_f64() * 1e6,
            "pid": timeline.pid,
            "tid": timeline.track(thread),
        });
        timeline.events.lock().unwrap_or_else(PoisonError::into_inner).push(event);
    }
}

/// Records that the counter `name` (e.g. the bytes of gathered FSDP units)
/// is `value` from now on: the trace draws it as a curve under the rank.
pub fn counter(name: &'static str, value: f64) {
    if !ENABLED.load(Ordering::Acquire) {
        return;
    }
    let Some(timeline) = TIMELINE.get() else { return };
    let event = json!({
        "name": name,
        "ph": "C",
        "ts": timeline.epoch_us + timeline.origin.elapsed().as_secs_f64() * 1e6,
        "pid": timeline.pid,
        "args": { "value": value },
    });
    timeline.events.lock().unwrap_or_else(PoisonError::into_inner).push(event);
}

impl Timeline {
    /// The track number of the thread called `name`.
    fn track(&self, name: String) -> usize {
        let mut threads = self.threads.lock().unwrap_or_else(PoisonError::into_inner);
        threads.iter().position(|t| *t == name).unwrap_or_else(|| {
            threads.push(name);
            threads.len() - 1
        })
    }

    /// The metadata events that name this rank's process and its tracks.
    fn labels(&self) -> Vec<Value> {
        let name = |kind: &str, tid: usize, label: String| json!({"name": kind, "ph": "M", "pid": self.pid, "tid": tid, "args": {"name": label}});
        let threads = self.threads.lock().unwrap_or_else(PoisonError::into_inner);
        std::iter::once(name("process_name", 0, self.label.clone()))
            .chain(threads.iter().enumerate().map(|(tid, thread)| name("thread_name", tid, thread.clone())))
            .collect()
    }
}

/// Writes the spans recorded so far to `path` as a Chrome trace, with the
/// rank and its threads named. Nothing is written unless [`enable`] was called.
pub fn write(path: &Path) -> Result<()> {
    let Some(timeline) = TIMELINE.get() else { return Ok(()) };
    let mut events = timeline.labels();
    events.extend(timeline.events.lock().unwrap_or_else(PoisonError::into_inner).iter().cloned());
    let text = serde_json::to_string(&json!({ "traceEvents": events })).map_err(candle_core::Error::wrap)?;
    std::fs::write(path, text).map_err(|e| io_path("write", path, e))
}

/// Puts the traces in `parts` (one per rank) into one file at `path`.
pub fn merge(parts: &[&Path], path: &Path) -> Result<()> {
    let mut events = vec![];
    for part in parts {
        let text = std::fs::read_to_string(part).map_err(|e| io_path("read", part, e))?;
        let trace: Value = serde_json::from_str(&text).map_err(candle_core::Error::wrap)?;
        events.extend(trace["traceEvents"].as_array().cloned().unwrap_or_default());
    }
    let text = serde_json::to_string(&json!({ "traceEvents": events })).map_err(candle_core::Error::wrap)?;
    std::fs::write(path, text).map_err(|e| io_path("write", path, e))
}
