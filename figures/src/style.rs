//! The colours, sizes, text and legend every figure shares, so that a
//! forward pass or a collective looks the same on every page.

use anyhow::Result;
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use crate::loss::plot_error;

/// Computing forward.
pub const FORWARD: RGBColor = RGBColor(0x4c, 0x78, 0xa8);
/// Computing backward.
pub const BACKWARD: RGBColor = RGBColor(0xf5, 0x85, 0x18);
/// Communication.
pub const COMM: RGBColor = RGBColor(0x54, 0xa2, 0x4b);
/// Communication that reduces (reduce-scatter, all-reduce).
pub const REDUCE: RGBColor = RGBColor(0x17, 0x6d, 0x5a);
/// Anything else that takes time (a step's optimizer update, a save).
pub const OTHER: RGBColor = RGBColor(0x9d, 0x75, 0x5d);
/// Idle time: a pipeline's bubble.
pub const IDLE: RGBColor = RGBColor(0xe4, 0xe4, 0xe4);
/// A second series beside the first (the learning rate beside the loss).
pub const SECOND: RGBColor = RGBColor(0xb2, 0x79, 0xa2);

pub const FONT: &str = "sans-serif";
/// The guide's text column is about 750 px wide.
pub const WIDTH: u32 = 720;

/// Text sizes, in the px a reader sees with the figure at its native width.
/// The smallest is the guide's small print: nothing in a figure is smaller.
/// Bar labels, ticks, legends and notes.
pub const SMALL: f64 = 12.0;
/// Axis names, a panel's own caption, the operators' letters.
pub const TEXT: f64 = 13.0;
/// A figure's title.
pub const TITLE: f64 = 15.0;

/// plotters writes a font of size s into the SVG as s / 1.24; asking for
/// `size` × 1.24 makes the SVG say `size`.
const PLOTTERS_SHRINK: f64 = 1.24;

/// The sans-serif font of `size` px (as the SVG will say).
pub fn font(size: f64) -> FontDesc<'static> {
    (FONT, size * PLOTTERS_SHRINK).into_font()
}

/// About how wide `text` is at `size` px: a sans-serif character averages a
/// little over half its size, digits and capitals more.
pub fn text_width(text: &str, size: f64) -> f64 {
    0.62 * size * text.chars().count() as f64
}

/// Text of `size` px, centred on its point across, placed by `vertical` up and down.
pub fn centred(size: f64, vertical: VPos) -> TextStyle<'static> {
    placed(size, HPos::Center, vertical)
}

/// Text of `size` px, placed on its point by `across` and `vertical`.
pub fn placed(size: f64, across: HPos, vertical: VPos) -> TextStyle<'static> {
    TextStyle::from(font(size)).pos(Pos::new(across, vertical))
}

/// Draws a chart's series labels (plotters' legend) as every figure does:
/// top right, on a pale box, in the small print.
pub fn draw_series_labels<'a, DB: DrawingBackend + 'a, CT: CoordTranslate>(
    mut labels: plotters::chart::SeriesLabelStyle<'a, '_, DB, CT>,
) -> Result<()> {
    labels
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK.mix(0.3))
        .label_font(font(SMALL))
        .draw()
        .map_err(plot_error)
}

/// Where a legend's entries start, under the figures' label column.
const LEGEND_LEFT: i32 = 140;
/// How far apart a legend's rows are.
const LEGEND_ROW: i32 = 22;

/// The height a legend of `entries` (label, colour) takes.
pub fn legend_height(entries: &[(&str, RGBColor)]) -> u32 {
    8 + LEGEND_ROW as u32 * legend_rows(entries).len() as u32
}

/// Draws `entries` as coloured boxes with their labels, in rows that fit the width.
pub fn draw_legend(area: &DrawingArea<SVGBackend, Shift>, entries: &[(&str, RGBColor)]) -> Result<()> {
    for (row, placed) in legend_rows(entries).iter().enumerate() {
        let y = 4 + LEGEND_ROW * row as i32;
        for (x, (label, color)) in placed {
            area.draw(&Rectangle::new([(*x, y), (x + 14, y + 14)], color.filled())).map_err(plot_error)?;
            area.draw(&Text::new(label.to_string(), (x + 20, y), font(SMALL))).map_err(plot_error)?;
        }
    }
    Ok(())
}

/// The legend's entries laid out in rows that fit the figure's width, each
/// with its left edge.
fn legend_rows<'a>(entries: &[(&'a str, RGBColor)]) -> Vec<Vec<(i32, (&'a str, RGBColor))>> {
    let mut rows: Vec<Vec<(i32, (&str, RGBColor))>> = vec![vec![]];
    let mut x = LEGEND_LEFT;
    for &(label, color) in entries {
        let width = 34 + text_width(label, SMALL) as i32;
        if x + width > WIDTH as i32 && x > LEGEND_LEFT {
            rows.push(vec![]);
            x = LEGEND_LEFT;
        }
        rows.last_mut().expect("one row at least").push((x, (label, color)));
        x += width;
    }
    rows
}
