//! The run's record: one JSON line per step, and a loss curve drawn as SVG at the end.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

/// What one optimizer step measured. A value that is not finite (a skipped
/// update's NaN loss) is written as the string `"NaN"`, `"inf"` or `"-inf"`,
/// which JSON has no number for.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
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

/// Appends step records to `metrics.jsonl`.
pub struct MetricsLog {
    out: BufWriter<File>,
}

impl MetricsLog {
    pub fn append_to(path: &Path) -> Result<Self> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .with_context(|| format!("cannot open {}", path.display()))?;
        Ok(Self { out: BufWriter::new(file) })
    }

    pub fn record(&mut self, record: &StepRecord) -> Result<()> {
        serde_json::to_writer(&mut self.out, record)?;
        self.out.write_all(b"\n")?;
        self.out.flush()?;
        Ok(())
    }
}

/// Reads every record of a `metrics.jsonl`. A last line cut short (a run
/// killed, or a disk that filled, in the middle of writing it) is left out;
/// a bad line anywhere else is an error.
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
            Err(e) => bail!("bad line {} in {}: {e}: {line}", index + 1, path.display()),
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

/// Draws loss against step as a standalone SVG picture.
pub fn loss_curve_svg(records: &[StepRecord]) -> String {
    let (w, h, pad) = (640.0, 360.0, 48.0);
    let points: Vec<(f64, f64)> =
        records.iter().filter(|r| r.loss.is_finite()).map(|r| (r.step as f64, r.loss)).collect();
    let mut svg = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"12\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <text x=\"{}\" y=\"20\" text-anchor=\"middle\">training loss</text>\n",
        w / 2.0
    );
    if points.len() >= 2 {
        let (x0, x1) = (points[0].0, points[points.len() - 1].0);
        let lo = points.iter().map(|p| p.1).fold(f64::INFINITY, f64::min);
        let hi = points.iter().map(|p| p.1).fold(f64::NEG_INFINITY, f64::max);
        let sx = |x: f64| pad + (x - x0) / (x1 - x0).max(1.0) * (w - 2.0 * pad);
        let sy = |y: f64| h - pad - (y - lo) / (hi - lo).max(1e-9) * (h - 2.0 * pad);
        let path: Vec<String> = points.iter().map(|&(x, y)| format!("{:.1},{:.1}", sx(x), sy(y))).collect();
        svg.push_str(&format!(
            "<polyline fill=\"none\" stroke=\"#1f77b4\" stroke-width=\"1.5\" points=\"{}\"/>\n",
            path.join(" ")
        ));
        svg.push_str(&format!(
            "<line x1=\"{pad}\" y1=\"{b}\" x2=\"{r}\" y2=\"{b}\" stroke=\"black\"/>\n<line x1=\"{pad}\" y1=\"{pad}\" x2=\"{pad}\" y2=\"{b}\" stroke=\"black\"/>\n",
            b = h - pad,
            r = w - pad
        ));
        for (value, y) in [(hi, sy(hi)), (lo, sy(lo))] {
            svg.push_str(&format!(
                "<text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{value:.2}</text>\n",
                pad - 4.0,
                y + 4.0
            ));
        }
        for (value, x) in [(x0, sx(x0)), (x1, sx(x1))] {
            svg.push_str(&format!(
                "<text x=\"{x:.1}\" y=\"{}\" text-anchor=\"middle\">step {value}</text>\n",
                h - pad + 16.0
            ));
        }
    }
    svg.push_str("</svg>\n");
    svg
}
