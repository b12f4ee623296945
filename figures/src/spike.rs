//! A run whose loss spiked, beside a run of the same model and data that did
//! not: the loss of each against the step, and under it the gradient norm
//! before clipping, on a log scale, with the clipping threshold. The norm is
//! what a person watches to see a spike coming, and the threshold shows which
//! steps clipping bounded.

use anyhow::Result;
use plotters::coord::Shift;
use plotters::prelude::*;

use crate::loss::{bounds, plot_error};
use crate::style::{draw_series_labels, font, SMALL, TITLE, WIDTH};

/// One optimizer step of a run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Step {
    pub step: usize,
    pub loss: f64,
    /// The global gradient norm before clipping.
    pub grad_norm: f64,
}

/// A run to draw: its name in the legend, its colour and its steps.
pub struct Run<'a> {
    pub name: &'a str,
    pub color: RGBColor,
    pub steps: &'a [Step],
}

impl Step {
    /// Whether the step's update was skipped: a loss or a norm that is not finite.
    fn skipped(&self) -> bool {
        !(self.loss.is_finite() && self.grad_norm.is_finite())
    }
}

/// Draws the loss panel over the norm panel; steps of a run whose loss or
/// norm is not finite (skipped updates) are left out of its lines and marked
/// by a tick under the loss panel's axis.
pub fn draw(title: &str, runs: &[Run], max_grad_norm: f64) -> Result<String> {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (WIDTH, 560)).into_drawing_area();
        root.fill(&WHITE).map_err(plot_error)?;
        let (top, bottom) = root.split_vertically(300);
        let finite = |run: &Run| -> Vec<Step> { run.steps.iter().copied().filter(|s| !s.skipped()).collect() };
        let last = runs.iter().flat_map(|r| r.steps.last()).map(|s| s.step).max().unwrap_or(1).max(2) as f64;
        loss_panel(&top, title, runs, last, &finite)?;
        norm_panel(&bottom, runs, last, max_grad_norm, &finite)?;
        root.present().map_err(plot_error)?;
    }
    Ok(svg)
}

fn loss_panel(
    area: &DrawingArea<SVGBackend, Shift>,
    title: &str,
    runs: &[Run],
    last: f64,
    finite: &dyn Fn(&Run) -> Vec<Step>,
) -> Result<()> {
    let (lo, hi) = bounds(runs.iter().flat_map(finite).map(|s| s.loss));
    let mut chart = ChartBuilder::on(area)
        .caption(title, font(TITLE))
        .margin(12)
        .x_label_area_size(30)
        .y_label_area_size(52)
        .build_cartesian_2d(0.0..last, lo.min(0.0)..hi)
        .map_err(plot_error)?;
    chart
        .configure_mesh()
        .y_desc("loss (nats per token)")
        .x_label_formatter(&|step| format!("{step:.0}"))
        .label_style(font(SMALL))
        .light_line_style(WHITE.mix(0.0))
        .draw()
        .map_err(plot_error)?;
    for run in runs {
        let color = run.color;
        chart
            .draw_series(LineSeries::new(finite(run).iter().map(|s| (s.step as f64, s.loss)), color.stroke_width(2)))
            .map_err(plot_error)?
            .label(run.name)
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 18, y)], color.stroke_width(2)));
        let skipped = run.steps.iter().filter(|s| s.skipped()).map(|s| s.step as f64);
        let tick = (hi - lo.min(0.0)) * 0.04;
        chart
            .draw_series(skipped.map(|step| PathElement::new([(step, lo.min(0.0)), (step, tick)], RED.stroke_width(2))))
            .map_err(plot_error)?;
    }
    draw_series_labels(chart.configure_series_labels())
}

fn norm_panel(
    area: &DrawingArea<SVGBackend, Shift>,
    runs: &[Run],
    last: f64,
    max_grad_norm: f64,
    finite: &dyn Fn(&Run) -> Vec<Step>,
) -> Result<()> {
    let norms = runs.iter().flat_map(finite).map(|s| s.grad_norm).filter(|n| *n > 0.0);
    let (lo, hi) = norms.chain([max_grad_norm]).fold((f64::INFINITY, 0.0f64), |(lo, hi), n| (lo.min(n), hi.max(n)));
    let mut chart = ChartBuilder::on(area)
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(52)
        .build_cartesian_2d(0.0..last, (lo * 0.8..hi * 1.25).log_scale())
        .map_err(plot_error)?;
    chart
        .configure_mesh()
        .x_desc("optimizer step")
        .y_desc("gradient norm (log)")
        .x_label_formatter(&|step| format!("{step:.0}"))
        .y_label_formatter(&|norm| format!("{norm}"))
        .label_style(font(SMALL))
        .light_line_style(WHITE.mix(0.0))
        .draw()
        .map_err(plot_error)?;
    for run in runs {
        let points = finite(run).into_iter().filter(|s| s.grad_norm > 0.0);
        chart
            .draw_series(LineSeries::new(points.map(|s| (s.step as f64, s.grad_norm)), run.color.stroke_width(1)))
            .map_err(plot_error)?;
    }
    let threshold = [(0.0, max_grad_norm), (last, max_grad_norm)];
    chart
        .draw_series(DashedLineSeries::new(threshold, 6, 4, BLACK.stroke_width(1)))
        .map_err(plot_error)?
        .label(format!("max_grad_norm = {max_grad_norm}: clipped above"))
        .legend(|(x, y)| PathElement::new([(x, y), (x + 18, y)], BLACK.stroke_width(1)));
    draw_series_labels(chart.configure_series_labels())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn steps(losses: &[f64]) -> Vec<Step> {
        losses.iter().enumerate().map(|(i, &loss)| Step { step: i + 1, loss, grad_norm: loss / 2.0 }).collect()
    }

    #[test]
    fn a_skipped_step_is_marked_and_left_out_of_the_lines() {
        let spiked = steps(&[5.0, 4.0, f64::NAN, 9.0, 3.0]);
        let calm = steps(&[5.0, 4.0, 3.5, 3.0, 2.5]);
        let runs =
            [Run { name: "spiked", color: RED, steps: &spiked }, Run { name: "calm", color: BLUE, steps: &calm }];
        let svg = draw("t", &runs, 1.0).unwrap();
        assert!(svg.contains("spiked") && svg.contains("calm"), "both runs are in the legend");
        assert!(svg.contains("max_grad_norm = 1: clipped above"));
        assert!(!svg.contains("NaN"), "a non-finite value never reaches the drawing");
    }
}
