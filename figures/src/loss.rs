//! A run's loss against its step (and the held-out loss, where measured),
//! with the learning rate on a second axis: the first thing to look at in a
//! run, and what `train` writes as `loss.svg`.

use anyhow::{anyhow, Result};
use plotters::prelude::*;

use crate::style::{draw_series_labels, font, BACKWARD, FORWARD, SECOND, SMALL, TITLE, WIDTH};

/// One optimizer step's record.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepPoint {
    pub step: usize,
    pub loss: f64,
    pub lr: f64,
    /// The held-out loss, at the steps that measured it.
    pub eval_loss: Option<f64>,
}

/// Draws the loss (left axis) and the learning rate (right axis) against the
/// step. Steps whose loss is not finite (skipped updates) are left out of the
/// line; with fewer than two finite points the chart says so instead.
pub fn draw(title: &str, points: &[StepPoint]) -> Result<String> {
    let finite: Vec<StepPoint> = points.iter().copied().filter(|p| p.loss.is_finite() && p.lr.is_finite()).collect();
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (WIDTH, 360)).into_drawing_area();
        root.fill(&WHITE).map_err(plot_error)?;
        if finite.len() < 2 {
            root.draw(&Text::new(format!("{title}: fewer than two finite steps to draw"), (20, 180), font(TITLE)))
                .map_err(plot_error)?;
            root.present().map_err(plot_error)?;
            drop(root);
            return Ok(svg);
        }
        let (first, last) = (finite[0].step as f64, finite[finite.len() - 1].step as f64);
        let evals: Vec<(f64, f64)> =
            finite.iter().filter_map(|p| p.eval_loss.filter(|l| l.is_finite()).map(|l| (p.step as f64, l))).collect();
        let (lo, hi) = bounds(finite.iter().map(|p| p.loss).chain(evals.iter().map(|e| e.1)));
        let lr_max = finite.iter().map(|p| p.lr).fold(0.0, f64::max).max(f64::MIN_POSITIVE);
        let mut chart = ChartBuilder::on(&root)
            .caption(title, font(TITLE))
            .margin(12)
            .x_label_area_size(42)
            .y_label_area_size(60)
            .right_y_label_area_size(76)
            .build_cartesian_2d(first..last, lo..hi)
            .map_err(plot_error)?
            .set_secondary_coord(first..last, 0.0..lr_max * 1.05);
        chart
            .configure_mesh()
            .x_desc("optimizer step")
            .x_label_formatter(&|step| format!("{step:.0}"))
            .y_desc("loss (nats per token)")
            .label_style(font(SMALL))
            .light_line_style(WHITE.mix(0.0))
            .draw()
            .map_err(plot_error)?;
        chart
            .configure_secondary_axes()
            .y_desc("learning rate")
            .y_label_formatter(&|lr| format!("{lr:.1e}"))
            .label_style(font(SMALL))
            .draw()
            .map_err(plot_error)?;
        chart
            .draw_series(LineSeries::new(finite.iter().map(|p| (p.step as f64, p.loss)), FORWARD.stroke_width(2)))
            .map_err(plot_error)?
            .label("loss")
            .legend(|(x, y)| PathElement::new([(x, y), (x + 18, y)], FORWARD.stroke_width(2)));
        if !evals.is_empty() {
            chart
                .draw_series(LineSeries::new(evals.iter().copied(), BACKWARD.stroke_width(2)).point_size(3))
                .map_err(plot_error)?
                .label("held-out loss")
                .legend(|(x, y)| PathElement::new([(x, y), (x + 18, y)], BACKWARD.stroke_width(2)));
        }
        chart
            .draw_secondary_series(LineSeries::new(
                finite.iter().map(|p| (p.step as f64, p.lr)),
                SECOND.stroke_width(1),
            ))
            .map_err(plot_error)?
            .label("learning rate")
            .legend(|(x, y)| PathElement::new([(x, y), (x + 18, y)], SECOND.stroke_width(1)));
        draw_series_labels(chart.configure_series_labels())?;
        root.present().map_err(plot_error)?;
    }
    Ok(svg)
}

/// The range of `values` with a little room above and below.
pub(crate) fn bounds(values: impl Iterator<Item = f64>) -> (f64, f64) {
    let (lo, hi) = values.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| (lo.min(v), hi.max(v)));
    let room = ((hi - lo) * 0.05).max(1e-6);
    (lo - room, hi + room)
}

/// plotters' errors borrow the backend; the message is what matters.
pub(crate) fn plot_error(error: impl std::fmt::Display) -> anyhow::Error {
    anyhow!("drawing a figure: {error}")
}
