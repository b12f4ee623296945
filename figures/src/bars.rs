//! Stacked bars of bytes per rank, one part per kind of state, each bar's
//! total above it and the bars' groups named under the axis. ZeRO's stages
//! and mixed precision against the number of ranks are drawn with it.

use plotters::coord::ranged1d::SegmentValue;
use plotters::prelude::*;
use plotters::style::text_anchor::VPos;

use anyhow::{bail, Result};

use crate::loss::plot_error;
use crate::style::{centred, draw_legend, font, legend_height, SMALL, TITLE, WIDTH};

/// One bar: its parts' bytes, in the order of the chart's parts.
pub struct Bar {
    /// Under the bar (`N=2`, `bf16`).
    pub label: String,
    /// Under the run of neighbouring bars that share it.
    pub group: String,
    pub parts: Vec<f64>,
    /// A black line across the bar at these bytes (a formula beside a measurement).
    pub mark: Option<f64>,
}

/// The chart: its title, the parts' names and colours, and the name of the
/// black marks if there are any.
pub struct Chart<'a> {
    pub title: String,
    pub parts: &'a [(&'a str, RGBColor)],
    pub mark: Option<&'a str>,
}

const HEIGHT: u32 = 420;
const GIB: f64 = (1u64 << 30) as f64;

/// Draws `bars` in GiB per rank.
pub fn draw(chart: &Chart, bars: &[Bar]) -> Result<String> {
    if bars.is_empty() {
        bail!("no bar to draw");
    }
    let mut legend = chart.parts.to_vec();
    legend.extend(chart.mark.map(|name| (name, BLACK)));
    let total = |bar: &Bar| bar.parts.iter().sum::<f64>();
    let top = bars.iter().map(|b| total(b).max(b.mark.unwrap_or(0.0))).fold(0.0, f64::max) / GIB * 1.12;
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (WIDTH, HEIGHT)).into_drawing_area();
        root.fill(&WHITE).map_err(plot_error)?;
        let (body, key) = root.split_vertically(HEIGHT - legend_height(&legend));
        // `(0..n).into_segmented()` has n + 1 segments: the axis below has one per bar.
        let mut plot = ChartBuilder::on(&body)
            .caption(&chart.title, font(TITLE))
            .margin(10)
            .x_label_area_size(52)
            .y_label_area_size(52)
            .build_cartesian_2d((0..bars.len() - 1).into_segmented(), 0.0..top)
            .map_err(plot_error)?;
        plot.configure_mesh()
            .disable_x_mesh()
            .x_labels(bars.len())
            .x_label_formatter(&|v| match v {
                SegmentValue::CenterOf(i) if *i < bars.len() => bars[*i].label.clone(),
                _ => String::new(),
            })
            .y_desc("GiB per rank")
            .label_style(font(SMALL))
            .light_line_style(WHITE.mix(0.0))
            .draw()
            .map_err(plot_error)?;
        for (i, bar) in bars.iter().enumerate() {
            let (left, right) = (SegmentValue::Exact(i), SegmentValue::Exact(i + 1));
            let mut base = 0.0;
            for (bytes, (_, color)) in bar.parts.iter().zip(chart.parts) {
                let height = bytes / GIB;
                plot.draw_series([
                    Rectangle::new([(left.clone(), base), (right.clone(), base + height)], color.filled()),
                    Rectangle::new([(left.clone(), base), (right.clone(), base + height)], WHITE.stroke_width(2)),
                ])
                .map_err(plot_error)?;
                base += height;
            }
            if let Some(mark) = bar.mark {
                let at = mark / GIB;
                plot.draw_series([PathElement::new([(left, at), (right, at)], BLACK.stroke_width(2))])
                    .map_err(plot_error)?;
            }
            plot.draw_series([Text::new(
                format!("{base:.2}"),
                (SegmentValue::CenterOf(i), base + top * 0.02),
                centred(SMALL, VPos::Bottom),
            )])
            .map_err(plot_error)?;
        }
        // The groups' names under their runs of bars.
        let pixels = plot.plotting_area().get_pixel_range();
        let per_bar = f64::from(pixels.0.end - pixels.0.start) / bars.len() as f64;
        let mut first = 0;
        while first < bars.len() {
            let count = bars[first..].iter().take_while(|b| b.group == bars[first].group).count();
            let middle = pixels.0.start as f64 + per_bar * (first as f64 + count as f64 / 2.0);
            let at = (middle as i32, pixels.1.end + 24);
            root.draw(&Text::new(bars[first].group.clone(), at, centred(SMALL, VPos::Top))).map_err(plot_error)?;
            first += count;
        }
        draw_legend(&key, &legend)?;
        root.present().map_err(plot_error)?;
    }
    Ok(svg)
}
