//! Time lanes: one row per rank, stage or thread, one bar per span, idle
//! time shaded grey. The pipeline schedules and the FSDP timeline are drawn
//! with it.

use anyhow::Result;
use plotters::coord::ranged1d::SegmentValue;
use plotters::prelude::*;
use plotters::style::text_anchor::VPos;

use crate::loss::plot_error;
use crate::style::{
    centred, draw_legend, draw_series_labels, font, legend_height, text_width, IDLE, SMALL, TEXT, TITLE, WIDTH,
};

/// A span of work drawn as a bar, with its label inside when it fits.
pub struct Bar {
    pub start: f64,
    pub end: f64,
    pub label: String,
    pub color: RGBColor,
}

/// A row of bars.
pub struct Lane {
    pub label: String,
    pub bars: Vec<Bar>,
}

/// Lanes under one title, sharing the time axis with the figure's other panels.
pub struct Panel {
    pub title: String,
    pub lanes: Vec<Lane>,
}

/// A quantity over the same time axis, under the lanes: each series a step
/// line through its (time, value) samples, holding each value until the next.
pub struct Curve {
    pub title: String,
    pub unit: String,
    pub series: Vec<Series>,
}

/// One line of a [`Curve`]: its label, colour and (time, value) samples.
pub type Series = (String, RGBColor, Vec<(f64, f64)>);

const CURVE_PX: u32 = 230;
/// Of a curve's height, what its caption, margins and time axis take.
const CURVE_FRAME_PX: f64 = 84.0;
/// The height of a curve's box of series labels: its padding and one row per series.
fn series_labels_px(series: usize) -> f64 {
    12.0 + 20.0 * series as f64
}

const LANE_PX: u32 = 30;
const PANEL_EXTRA_PX: u32 = 84;
/// Room for a lane's label (`stage 0: ≤ 8 held`, `rank 1: compute`).
const LABEL_PX: u32 = 140;

/// Draws `panels` stacked, on one time axis (`axis`, from 0 to the last end),
/// `curve` under them if there is one, and `legend` (label, colour) last.
pub fn draw(panels: &[Panel], curve: Option<&Curve>, axis: &str, legend: &[(&str, RGBColor)]) -> Result<String> {
    let end = panels
        .iter()
        .flat_map(|p| p.lanes.iter().flat_map(|l| l.bars.iter().map(|b| b.end)))
        .fold(0.0, f64::max)
        .max(f64::MIN_POSITIVE);
    let heights: Vec<u32> = panels.iter().map(|p| PANEL_EXTRA_PX + LANE_PX * p.lanes.len() as u32).collect();
    let legend_px = legend_height(legend);
    let mut svg = String::new();
    {
        let curve_px = if curve.is_some() { CURVE_PX } else { 0 };
        let total = heights.iter().sum::<u32>() + curve_px + legend_px;
        let root = SVGBackend::with_string(&mut svg, (WIDTH, total)).into_drawing_area();
        root.fill(&WHITE).map_err(plot_error)?;
        let (body, key) = root.split_vertically(total - legend_px);
        let mut rest = body;
        for (panel, height) in panels.iter().zip(&heights) {
            let (area, below) = rest.split_vertically(*height);
            draw_panel(&area, panel, end, axis)?;
            rest = below;
        }
        if let Some(curve) = curve {
            draw_curve(&rest, curve, end, axis)?;
        }
        draw_legend(&key, legend)?;
        root.present().map_err(plot_error)?;
    }
    Ok(svg)
}

fn draw_panel(
    area: &DrawingArea<SVGBackend, plotters::coord::Shift>,
    panel: &Panel,
    end: f64,
    axis: &str,
) -> Result<()> {
    let lanes = panel.lanes.len();
    // `(0..n).into_segmented()` has n + 1 segments: the axis below has one per lane.
    let labels: Vec<&str> = panel.lanes.iter().map(|l| l.label.as_str()).collect();
    let mut chart = ChartBuilder::on(area)
        .caption(&panel.title, font(TITLE))
        .margin(8)
        .x_label_area_size(44)
        .y_label_area_size(LABEL_PX)
        .build_cartesian_2d(0.0..end, (0..lanes.max(1) - 1).into_segmented())
        .map_err(plot_error)?;
    chart
        .configure_mesh()
        .disable_y_mesh()
        .x_desc(axis)
        .x_label_formatter(&|ms| format!("{ms:.0}"))
        .y_label_formatter(&|v| match v {
            SegmentValue::CenterOf(i) if *i < lanes => labels[lanes - 1 - i].to_string(),
            _ => String::new(),
        })
        .label_style(font(SMALL))
        .light_line_style(WHITE.mix(0.0))
        .draw()
        .map_err(plot_error)?;
    let (px_left, px_right) =
        (chart.plotting_area().get_pixel_range().0.start, chart.plotting_area().get_pixel_range().0.end);
    let px_per_unit = f64::from(px_right - px_left) / end;
    // Rows are drawn top to bottom in the order given.
    let row = |i: usize| lanes - 1 - i;
    for (i, lane) in panel.lanes.iter().enumerate() {
        let (top, bottom) = (SegmentValue::Exact(row(i) + 1), SegmentValue::Exact(row(i)));
        chart
            .draw_series([Rectangle::new([(0.0, top.clone()), (end, bottom.clone())], IDLE.filled())])
            .map_err(plot_error)?;
        for bar in &lane.bars {
            chart
                .draw_series([
                    Rectangle::new([(bar.start, top.clone()), (bar.end, bottom.clone())], bar.color.filled()),
                    Rectangle::new([(bar.start, top.clone()), (bar.end, bottom.clone())], WHITE.stroke_width(1)),
                ])
                .map_err(plot_error)?;
            let fits = |label: &str| (bar.end - bar.start) * px_per_unit > text_width(label, SMALL) + 4.0;
            // A bar too narrow for `F5` still shows `5`: a lane missing one
            // label among its neighbours' reads as a missing micro-batch.
            let number: String = bar.label.chars().filter(char::is_ascii_digit).collect();
            let shown =
                [bar.label.as_str(), number.as_str()].into_iter().find(|label| !label.is_empty() && fits(label));
            if let Some(label) = shown {
                let middle = (bar.start + bar.end) / 2.0;
                let style = centred(SMALL, VPos::Center).color(&WHITE);
                chart
                    .draw_series([Text::new(label.to_string(), (middle, SegmentValue::CenterOf(row(i))), style)])
                    .map_err(plot_error)?;
            }
        }
    }
    Ok(())
}

fn draw_curve(
    area: &DrawingArea<SVGBackend, plotters::coord::Shift>,
    curve: &Curve,
    end: f64,
    axis: &str,
) -> Result<()> {
    let highest = curve.series.iter().flat_map(|(_, _, points)| points.iter().map(|p| p.1)).fold(0.0, f64::max);
    // The series labels sit top right, over the plot: the axis goes high
    // enough that the highest value passes under their box.
    let plot_px = f64::from(CURVE_PX) - CURVE_FRAME_PX;
    let top = highest * plot_px / (plot_px - series_labels_px(curve.series.len()) - 6.0);
    let mut chart = ChartBuilder::on(area)
        .caption(&curve.title, font(TEXT))
        .margin(8)
        .x_label_area_size(44)
        .y_label_area_size(LABEL_PX)
        .build_cartesian_2d(0.0..end, 0.0..top.max(f64::MIN_POSITIVE))
        .map_err(plot_error)?;
    chart
        .configure_mesh()
        .x_desc(axis)
        .y_desc(&curve.unit)
        .x_label_formatter(&|ms| format!("{ms:.0}"))
        .y_labels(4)
        .label_style(font(SMALL))
        .light_line_style(WHITE.mix(0.0))
        .draw()
        .map_err(plot_error)?;
    for (label, color, points) in &curve.series {
        let mut steps = vec![];
        for (i, &(time, value)) in points.iter().enumerate() {
            let until = points.get(i + 1).map_or(end, |next| next.0);
            steps.extend([(time, value), (until, value)]);
        }
        chart
            .draw_series(LineSeries::new(steps, color.stroke_width(2)))
            .map_err(plot_error)?
            .label(label.clone())
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 18, y)], color.stroke_width(2)));
    }
    draw_series_labels(chart.configure_series_labels())
}
