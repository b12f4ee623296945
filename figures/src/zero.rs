//! ZeRO's memory per rank: each stage's parameters, gradients and optimizer
//! state on 1, 2 and 4 ranks, as the FSDP runtime's ledger measured them
//! (bars), beside the ZeRO paper's formula (a black line on each bar).

use anyhow::{bail, Context, Result};
use serde::Deserialize;

use crate::bars::{self, Bar, Chart};
use crate::style::{BACKWARD, FORWARD, REDUCE};

/// One line of `zero-memory.jsonl`: one stage on one world size.
#[derive(Deserialize)]
pub struct ZeroRow {
    strategy: String,
    world_size: usize,
    params: u64,
    parameter_bytes: u64,
    gradient_bytes: u64,
    optimizer_bytes: u64,
    formula_bytes: f64,
}

/// Reads the lines of `text`.
pub fn rows(text: &str) -> Result<Vec<ZeroRow>> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).with_context(|| format!("not a ZeRO memory row: {l}")))
        .collect()
}

/// Draws the bars, grouped by stage.
pub fn draw(rows: &[ZeroRow]) -> Result<String> {
    let Some(first) = rows.first() else { bail!("no ZeRO memory row to draw") };
    let chart = Chart {
        title: format!(
            "Model states per rank, fp32 AdamW, {:.0}M parameters: measured and the ZeRO formula",
            first.params as f64 / 1e6
        ),
        parts: &[("parameters", FORWARD), ("gradients", BACKWARD), ("optimizer state (m, v)", REDUCE)],
        mark: Some("formula"),
    };
    let bars: Vec<Bar> = rows
        .iter()
        .map(|row| Bar {
            label: format!("N={}", row.world_size),
            group: stage_only(&row.strategy),
            parts: [row.parameter_bytes, row.gradient_bytes, row.optimizer_bytes].map(|b| b as f64).to_vec(),
            mark: Some(row.formula_bytes),
        })
        .collect();
    bars::draw(&chart, &bars)
}

/// `ZeRO-2` of the recorded `ZeRO-2 (SHARD_GRAD_OP)`: which FSDP strategy is
/// which stage is exercise 12's question, and chapter 12 shows this figure.
fn stage_only(strategy: &str) -> String {
    strategy.split(" (").next().unwrap_or(strategy).to_string()
}
