//! The run's record: one JSON line per step, and a loss curve drawn as SVG at the end.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;

use anyhow::{Context, Result};
use figures::loss::StepPoint;
use serde::{Deserialize, Serialize};

use crate::tensorboard::{EventWriter, EVENTS_FILE};

/// What one optimizer step measured. A value that is not finite (a skipped
/// update's NaN loss) is written as the string `"NaN"`, `"inf"` or `"-inf"`,
/// which JSON has no number for.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StepRecord {
    pub step: usize,
    /// The loss averaged over every rank's micro-batches.
    #[serde(with = "any_float")]
    pub loss: f64,
    #[serde(with = "any_float")]
    pub lr: f64,
    #[serde(with = "any_float")]
    pub grad_norm: f64,
    /// Tokens per second over all ranks.
    #[serde(with = "any_float")]
    pub tokens_per_s: f64,
    #[serde(with = "any_float")]
    pub elapsed_s: f64,
    /// The loss on the held-out windows, at the steps that measured it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eval_loss: Option<f64>,
    /// Each rank's memory in MiB, rank 0 first: the GPU's memory in use, or
    /// on the CPU the process's peak resident memory; empty where the system
    /// does not say.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub memory_mib: Vec<f64>,
    /// The updates skipped so far for a non-finite gradient.
    #[serde(default)]
    pub skipped_steps: u64,
}

impl StepRecord {
    /// The record of the held-out loss measured before the first step (step
    /// 0): nothing was trained, so the training fields are NaN.
    pub fn before_training(eval_loss: f64, memory_mib: Vec<f64>) -> Self {
        Self {
            step: 0,
            loss: f64::NAN,
            lr: f64::NAN,
            grad_norm: f64::NAN,
            tokens_per_s: f64::NAN,
            elapsed_s: 0.0,
            eval_loss: Some(eval_loss),
            memory_mib,
            skipped_steps: 0,
        }
    }
}

/// An f64 as a JSON number when finite, else as a word.
mod any_float {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(value: &f64, out: S) -> Result<S::Ok, S::Error> {
        match *value {
            v if v.is_finite() => out.serialize_f64(v),
            v if v.is_nan() => out.serialize_str("NaN"),
            v if v > 0.0 => out.serialize_str("inf"),
            _ => out.serialize_str("-inf"),
        }
    }

    #[derive(Deserialize)]
    #[serde(untagged)]
    enum NumberOrWord {
        Number(f64),
        Word(String),
        // Written by versions that let serde_json turn a NaN into null.
        Null(()),
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(input: D) -> Result<f64, D::Error> {
        match NumberOrWord::deserialize(input)? {
            NumberOrWord::Number(v) => Ok(v),
            NumberOrWord::Null(()) => Ok(f64::NAN),
            NumberOrWord::Word(word) => word
                .parse()
                .map_err(|_| serde::de::Error::custom(format!("`{word}` is not a number, NaN, inf or -inf"))),
        }
    }
}

/// The step records' file in a run's directory.
pub const METRICS_FILE: &str = "metrics.jsonl";

/// Appends step records to `metrics.jsonl`, and their scalars to
/// TensorBoard's event file beside it.
pub struct MetricsLog {
    out: BufWriter<File>,
    events: EventWriter,
}

impl MetricsLog {
    /// The log of the run in `dir`: `metrics.jsonl` appended to, and the
    /// event file written afresh from what `metrics.jsonl` already holds (the
    /// kept steps of a resumed run).
    pub fn open(dir: &Path) -> Result<Self> {
        let path = dir.join(METRICS_FILE);
        let history = if path.exists() { read_log(&path)? } else { vec![] };
        let mut events = EventWriter::create(&dir.join(EVENTS_FILE))?;
        for record in &history {
            events.scalars(record.step, &scalars(record))?;
        }
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .with_context(|| format!("cannot open {}", path.display()))?;
        Ok(Self { out: BufWriter::new(file), events })
    }

    pub fn record(&mut self, record: &StepRecord) -> Result<()> {
        serde_json::to_writer(&mut self.out, record)?;
        self.out.write_all(b"\n")?;
        self.out.flush()?;
        self.events.scalars(record.step, &scalars(record))
    }
}

/// What TensorBoard plots of a step, by tag: before the first step (step
/// 0), only the evaluation.
fn scalars(record: &StepRecord) -> Vec<(String, f64)> {
    let mut scalars = match record.step {
        0 => vec![],
        _ => vec![
            ("train/loss".to_string(), record.loss),
            ("train/learning_rate".to_string(), record.lr),
            ("train/grad_norm".to_string(), record.grad_norm),
            ("train/tokens_per_s".to_string(), record.tokens_per_s),
            ("train/skipped_steps".to_string(), record.skipped_steps as f64),
        ],
    };
    if let Some(loss) = record.eval_loss {
        scalars.extend([("eval/loss".to_string(), loss), ("eval/perplexity".to_string(), loss.exp())]);
    }
    let per_rank = record.memory_mib.iter().enumerate();
    scalars.extend(per_rank.map(|(rank, &mib)| (format!("memory/rank_{rank}_mib"), mib)));
    scalars
}

/// Reads every record of a `metrics.jsonl`. A last line cut short (a run
/// killed, or a disk that filled, in the middle of writing it) is left out;
/// a bad line anywhere else is left out with a warning that names it: the
/// log is a record of the run, and resuming never depends on it.
pub fn read_log(path: &Path) -> Result<Vec<StepRecord>> {
    Ok(read_lines(path)?.into_iter().map(|(record, _)| record).collect())
}

/// Each record with its line as written.
fn read_lines(path: &Path) -> Result<Vec<(StepRecord, String)>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    let mut records = Vec::with_capacity(lines.len());
    for (index, line) in lines.iter().enumerate() {
        match serde_json::from_str(line) {
            Ok(record) => records.push((record, line.to_string())),
            Err(_) if index + 1 == lines.len() && !text.ends_with('\n') => break,
            Err(e) => eprintln!("warning: skipping bad line {} of {}: {e}: {line}", index + 1, path.display()),
        }
    }
    Ok(records)
}

/// Keeps the records of steps up to `step` (a resumed run writes the later
/// ones again), dropping a torn last line too. The kept lines are copied as
/// they are, not re-printed, and the file is replaced whole.
pub fn truncate_after(path: &Path, step: usize) -> Result<()> {
    if !path.exists() {
        return Ok(());
    }
    let mut text = String::new();
    for (_, line) in read_lines(path)?.iter().filter(|(record, _)| record.step <= step) {
        text.push_str(line);
        text.push('\n');
    }
    let staging = path.with_extension("jsonl.tmp");
    std::fs::write(&staging, text).with_context(|| format!("cannot write {}", staging.display()))?;
    std::fs::rename(&staging, path).with_context(|| format!("cannot replace {}", path.display()))
}

/// Draws the loss curve of the run in `out_dir` from its log into `loss.svg` there.
pub fn draw_loss_curve(out_dir: &Path) -> Result<()> {
    let records = read_log(&out_dir.join(METRICS_FILE))?;
    let path = out_dir.join("loss.svg");
    std::fs::write(&path, loss_curve_svg(&records)?).with_context(|| format!("cannot write {}", path.display()))
}

/// Draws loss and learning rate against step as a standalone SVG picture.
pub fn loss_curve_svg(records: &[StepRecord]) -> Result<String> {
    let points: Vec<StepPoint> =
        records.iter().map(|r| StepPoint { step: r.step, loss: r.loss, lr: r.lr, eval_loss: r.eval_loss }).collect();
    figures::loss::draw("training loss and learning rate", &points)
}
