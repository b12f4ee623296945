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

/// About how wide one character of a 11-12 px label is.
pub const CHAR_PX: f64 = 6.2;

/// Text of `size` px, centred on its point across, placed by `vertical` up and down.
pub fn centred(size: u32, vertical: VPos) -> TextStyle<'static> {
    TextStyle::from((FONT, size).into_font()).pos(Pos::new(HPos::Center, vertical))
}

/// Where a legend's entries start, under the figures' label column.
const LEGEND_LEFT: i32 = 140;

/// The height a legend of `entries` (label, colour) takes.
pub fn legend_height(entries: &[(&str, RGBColor)]) -> u32 {
    8 + 20 * legend_rows(entries).len() as u32
}

/// Draws `entries` as coloured boxes with their labels, in rows that fit the width.
pub fn draw_legend(area: &DrawingArea<SVGBackend, Shift>, entries: &[(&str, RGBColor)]) -> Result<()> {
    for (row, placed) in legend_rows(entries).iter().enumerate() {
        let y = 4 + 20 * row as i32;
        for (x, (label, color)) in placed {
            area.draw(&Rectangle::new([(*x, y), (x + 14, y + 12)], color.filled())).map_err(plot_error)?;
            area.draw(&Text::new(label.to_string(), (x + 20, y), (FONT, 12).into_font())).map_err(plot_error)?;
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
        let width = 34 + (CHAR_PX * label.chars().count() as f64) as i32;
        if x + width > WIDTH as i32 && x > LEGEND_LEFT {
            rows.push(vec![]);
            x = LEGEND_LEFT;
        }
        rows.last_mut().expect("one row at least").push((x, (label, color)));
        x += width;
    }
    rows
}
