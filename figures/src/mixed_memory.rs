//! Model states per rank under FULL_SHARD, in fp32 and in bf16 mixed
//! precision, on more and more ranks: parameters, gradients, f32 master
//! weights and AdamW's moments, as `cargo xtask estimate` counts them.

use anyhow::{bail, Context, Result};
use serde::Deserialize;

use crate::bars::{self, Bar, Chart};
use crate::style::{BACKWARD, FORWARD, REDUCE, SECOND};

/// One line of `precision-memory.jsonl`: one precision on one world size.
#[derive(Deserialize)]
pub struct PrecisionRow {
    precision: String,
    world_size: usize,
    params: f64,
    parameter_bytes: f64,
    gradient_bytes: f64,
    master_bytes: f64,
    moment_bytes: f64,
}

/// Reads the lines of `text`.
pub fn rows(text: &str) -> Result<Vec<PrecisionRow>> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).with_context(|| format!("not a precision memory row: {l}")))
        .collect()
}

/// Draws the bars, the precisions side by side for each world size.
pub fn draw(rows: &[PrecisionRow]) -> Result<String> {
    let Some(first) = rows.first() else { bail!("no precision memory row to draw") };
    let mut world_sizes: Vec<usize> = rows.iter().map(|r| r.world_size).collect();
    world_sizes.sort_unstable();
    world_sizes.dedup();
    let chart = Chart {
        title: format!(
            "FULL_SHARD model states per rank, {:.0}M parameters: fp32 and bf16 mixed precision",
            first.params / 1e6
        ),
        parts: &[
            ("parameters", FORWARD),
            ("gradients", BACKWARD),
            ("f32 master weights", SECOND),
            ("AdamW moments (m, v)", REDUCE),
        ],
        mark: None,
    };
    let bars: Vec<Bar> = world_sizes
        .iter()
        .flat_map(|&n| rows.iter().filter(move |r| r.world_size == n))
        .map(|row| Bar {
            label: row.precision.clone(),
            group: format!("N = {}", row.world_size),
            parts: vec![row.parameter_bytes, row.gradient_bytes, row.master_bytes, row.moment_bytes],
            mark: None,
        })
        .collect();
    bars::draw(&chart, &bars)
}
