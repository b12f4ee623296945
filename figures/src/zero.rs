//! ZeRO's memory per rank: each stage's parameters, gradients and optimizer
//! state on 1, 2 and 4 ranks, as the FSDP runtime's ledger measured them
//! (bars), beside the ZeRO paper's formula (a black line on each bar).

use anyhow::{bail, Context, Result};
use plotters::coord::ranged1d::SegmentValue;
use plotters::prelude::*;
use plotters::style::text_anchor::VPos;
use serde::Deserialize;

use crate::loss::plot_error;
use crate::style::{centred, draw_legend, font, legend_height, BACKWARD, FORWARD, REDUCE, SMALL, TITLE, WIDTH};

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

const HEIGHT: u32 = 420;
const GIB: f64 = (1u64 << 30) as f64;

/// Reads the lines of `text`.
pub fn rows(text: &str) -> Result<Vec<ZeroRow>> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).with_context(|| format!("not a ZeRO memory row: {l}")))
        .collect()
}

/// Draws the bars, grouped by stage.
pub fn draw(rows: &[ZeroRow]) -> Result<String> {
    if rows.is_empty() {
        bail!("no ZeRO memory row to draw");
    }
    // `(0..n).into_segmented()` has n + 1 segments: the axis below has one per row.
    let top =
        rows.iter().map(|r| (r.parameter_bytes + r.gradient_bytes + r.optimizer_bytes) as f64).fold(0.0, f64::max);
    let top = top.max(rows.iter().map(|r| r.formula_bytes).fold(0.0, f64::max)) / GIB * 1.12;
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (WIDTH, HEIGHT)).into_drawing_area();
        root.fill(&WHITE).map_err(plot_error)?;
        let kinds =
            [("parameters", FORWARD), ("gradients", BACKWARD), ("optimizer state (m, v)", REDUCE), ("formula", BLACK)];
        let (body, key) = root.split_vertically(HEIGHT - legend_height(&kinds));
        let title = format!(
            "Model states per rank, fp32 AdamW, {:.0}M parameters: measured and the ZeRO formula",
            rows[0].params as f64 / 1e6
        );
        let mut chart = ChartBuilder::on(&body)
            .caption(title, font(TITLE))
            .margin(10)
            .x_label_area_size(52)
            .y_label_area_size(52)
            .build_cartesian_2d((0..rows.len() - 1).into_segmented(), 0.0..top)
            .map_err(plot_error)?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(rows.len())
            .x_label_formatter(&|v| match v {
                SegmentValue::CenterOf(i) if *i < rows.len() => format!("N={}", rows[*i].world_size),
                _ => String::new(),
            })
            .y_desc("GiB per rank")
            .label_style(font(SMALL))
            .light_line_style(WHITE.mix(0.0))
            .draw()
            .map_err(plot_error)?;
        for (i, row) in rows.iter().enumerate() {
            let parts = [row.parameter_bytes, row.gradient_bytes, row.optimizer_bytes];
            let mut base = 0.0;
            for (bytes, (_, color)) in parts.iter().zip(&kinds[..3]) {
                let height = *bytes as f64 / GIB;
                let (left, right) = (SegmentValue::Exact(i), SegmentValue::Exact(i + 1));
                chart
                    .draw_series([
                        Rectangle::new([(left.clone(), base), (right.clone(), base + height)], color.filled()),
                        Rectangle::new([(left, base), (right, base + height)], WHITE.stroke_width(2)),
                    ])
                    .map_err(plot_error)?;
                base += height;
            }
            let formula = row.formula_bytes / GIB;
            chart
                .draw_series([PathElement::new(
                    [(SegmentValue::Exact(i), formula), (SegmentValue::Exact(i + 1), formula)],
                    BLACK.stroke_width(2),
                )])
                .map_err(plot_error)?;
            chart
                .draw_series([Text::new(
                    format!("{base:.2}"),
                    (SegmentValue::CenterOf(i), base + top * 0.02),
                    centred(SMALL, VPos::Bottom),
                )])
                .map_err(plot_error)?;
        }
        // The stage names under their groups of bars.
        let plot = chart.plotting_area().get_pixel_range();
        let per_bar = f64::from(plot.0.end - plot.0.start) / rows.len() as f64;
        let mut first = 0;
        while first < rows.len() {
            let count = rows[first..].iter().take_while(|r| r.strategy == rows[first].strategy).count();
            let middle = plot.0.start as f64 + per_bar * (first as f64 + count as f64 / 2.0);
            let style = centred(SMALL, VPos::Top);
            root.draw(&Text::new(stage_only(&rows[first].strategy), (middle as i32, plot.1.end + 24), style))
                .map_err(plot_error)?;
            first += count;
        }
        draw_legend(&key, &kinds)?;
        root.present().map_err(plot_error)?;
    }
    Ok(svg)
}

/// `ZeRO-2` of the recorded `ZeRO-2 (SHARD_GRAD_OP)`: which FSDP strategy is
/// which stage is exercise 12's question, and chapter 12 shows this figure.
fn stage_only(strategy: &str) -> String {
    strategy.split(" (").next().unwrap_or(strategy).to_string()
}
