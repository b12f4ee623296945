//! The pieces of the block diagrams (the Megatron MLP, the
//! sequence-parallel block): boxes of text, the operators between them as
//! lettered circles, and arrows.

use anyhow::Result;
use plotters::prelude::*;
use plotters::style::text_anchor::VPos;

use crate::loss::plot_error;
use crate::style::{centred, SMALL, TEXT};

pub type Area<'a> = DrawingArea<SVGBackend<'a>, plotters::coord::Shift>;

/// A box's height: room for three lines of text.
pub const BOX_H: i32 = 54;
const LINE: i32 = 15;
pub const OPERATOR_R: i32 = 13;
/// Arrows and the lines they end.
pub const GREY: RGBColor = RGBColor(0x66, 0x66, 0x66);

/// A box `width` wide at `at`, its `lines` centred in it.
pub fn boxed(root: &Area, at: (i32, i32), width: i32, lines: &[&str], color: RGBColor) -> Result<()> {
    let far = (at.0 + width, at.1 + BOX_H);
    root.draw(&Rectangle::new([at, far], color.mix(0.18).filled())).map_err(plot_error)?;
    root.draw(&Rectangle::new([at, far], color.stroke_width(1))).map_err(plot_error)?;
    let first = at.1 + (BOX_H - LINE * lines.len() as i32) / 2 + LINE / 2;
    for (k, line) in lines.iter().enumerate() {
        let centre = (at.0 + width / 2, first + LINE * k as i32);
        root.draw(&Text::new(line.to_string(), centre, centred(SMALL, VPos::Center))).map_err(plot_error)?;
    }
    Ok(())
}

/// A circle lettered `name`: a collective, or an operator made of one.
pub fn operator(root: &Area, centre: (i32, i32), name: &str, color: RGBColor) -> Result<()> {
    root.draw(&Circle::new(centre, OPERATOR_R, color.filled())).map_err(plot_error)?;
    let style = centred(TEXT, VPos::Center).color(&WHITE);
    root.draw(&Text::new(name.to_string(), centre, style)).map_err(plot_error)?;
    Ok(())
}

/// A grey arrow from `from` to `to`.
pub fn arrow(root: &Area, from: (i32, i32), to: (i32, i32)) -> Result<()> {
    root.draw(&PathElement::new([from, to], GREY.stroke_width(1))).map_err(plot_error)?;
    let (dx, dy) = (f64::from(to.0 - from.0), f64::from(to.1 - from.1));
    let length = (dx * dx + dy * dy).sqrt().max(1.0);
    let (ux, uy) = (dx / length, dy / length);
    let point =
        |along: f64, across: f64| (to.0 - (ux * along - uy * across) as i32, to.1 - (uy * along + ux * across) as i32);
    root.draw(&Polygon::new(vec![to, point(7.0, 3.5), point(7.0, -3.5)], GREY.filled())).map_err(plot_error)?;
    Ok(())
}
