//! The Megatron MLP split over tensor-parallel ranks, drawn from the model's
//! shapes: the input whole on every rank, each rank holding a run of the
//! hidden units (the rows of gate and up, the columns of down, as the
//! workbook stores a linear weight: out × in), and the two conjugate
//! operators that keep the pieces consistent, f before and g after.

use anyhow::{bail, Result};
use plotters::prelude::*;
use plotters::style::text_anchor::VPos;
use serde::Deserialize;

use crate::loss::plot_error;
use crate::style::{centred, BACKWARD, COMM, FONT, FORWARD, REDUCE, WIDTH};

/// The shapes the figure is drawn for.
#[derive(Deserialize)]
pub struct MlpShape {
    hidden: usize,
    intermediate: usize,
    tp: usize,
}

type Area<'a> = DrawingArea<SVGBackend<'a>, plotters::coord::Shift>;

const BOX_W: i32 = 94;
const BOX_H: i32 = 40;
const ROW: i32 = 70;
const TOP: i32 = 56;

/// Draws the split for `shape`.
pub fn draw(shape: &MlpShape) -> Result<String> {
    let MlpShape { hidden: c, intermediate: i, tp } = *shape;
    if tp < 2 || i % tp != 0 {
        bail!("the MLP's {i} units do not split over {tp} ranks");
    }
    let part = i / tp;
    let height = (TOP + ROW * tp as i32 + 70) as u32;
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (WIDTH, height)).into_drawing_area();
        root.fill(&WHITE).map_err(plot_error)?;
        root.draw(&Text::new(
            format!("The SwiGLU MLP on {tp} tensor-parallel ranks (C = {c}, I = {i}; BT tokens)"),
            (WIDTH as i32 / 2, 16),
            centred(15, VPos::Center),
        ))
        .map_err(plot_error)?;
        let middle = TOP + ROW * tp as i32 / 2 - ROW / 2 + BOX_H / 2;
        let columns = [4, 124, 148, 262, 376, 490, 606, 632];
        boxed(&root, (columns[0], middle - BOX_H / 2), "X, whole", &format!("BT × {c}"), FORWARD)?;
        for rank in 0..tp {
            let y = TOP + ROW * rank as i32;
            let centre = y + BOX_H / 2;
            arrow(&root, (columns[0] + BOX_W, middle), (columns[1] - 14, centre))?;
            operator(&root, (columns[1], centre), "f", COMM)?;
            let pieces = [
                (format!("gate, up: rows {}", units_of(rank, part)), format!("{part} × {c} each"), FORWARD),
                ("SwiGLU".to_string(), format!("BT × {part}"), FORWARD),
                (format!("down: cols {}", units_of(rank, part)), format!("{c} × {part}"), FORWARD),
                (format!("partial Y, rank {rank}"), format!("BT × {c}"), BACKWARD),
            ];
            // Each piece fed by the one before it, f feeding the first.
            let mut from = columns[1] + 14;
            for ((title, shape, color), x) in pieces.iter().zip(&columns[2..6]) {
                arrow(&root, (from, centre), (*x, centre))?;
                boxed(&root, (*x, y), title, shape, *color)?;
                from = x + BOX_W;
            }
            arrow(&root, (from, centre), (columns[6] + 12, middle))?;
            root.draw(&Text::new(format!("rank {rank}"), (columns[2] + BOX_W / 2, y - 8), centred(11, VPos::Center)))
                .map_err(plot_error)?;
        }
        operator(&root, (columns[6] + 26, middle), "g", REDUCE)?;
        root.draw(&Text::new("Y", (columns[7] + 64, middle), centred(13, VPos::Center))).map_err(plot_error)?;
        arrow(&root, (columns[6] + 40, middle), (columns[7] + 56, middle))?;
        let notes = [
            "f: identity forward; backward, all-reduce of the input's gradient (each rank saw only its columns)",
            "g: all-reduce forward (Y = sum of the partial Ys); identity backward",
            "one all-reduce each way per MLP; the same pair wraps attention, cut by heads",
        ];
        for (k, note) in notes.iter().enumerate() {
            let y = height as i32 - 58 + 18 * k as i32;
            root.draw(&Text::new(note.to_string(), (12, y), (FONT, 12).into_font())).map_err(plot_error)?;
        }
        root.present().map_err(plot_error)?;
    }
    Ok(svg)
}

/// The hidden units rank `rank` holds, as `a..b`.
fn units_of(rank: usize, part: usize) -> String {
    format!("{}..{}", rank * part, (rank + 1) * part)
}

fn boxed(root: &Area, at: (i32, i32), title: &str, shape: &str, color: RGBColor) -> Result<()> {
    let far = (at.0 + BOX_W, at.1 + BOX_H);
    root.draw(&Rectangle::new([at, far], color.mix(0.18).filled())).map_err(plot_error)?;
    root.draw(&Rectangle::new([at, far], color.stroke_width(1))).map_err(plot_error)?;
    root.draw(&Text::new(title.to_string(), (at.0 + BOX_W / 2, at.1 + 13), centred(10, VPos::Center)))
        .map_err(plot_error)?;
    root.draw(&Text::new(shape.to_string(), (at.0 + BOX_W / 2, at.1 + 28), centred(11, VPos::Center)))
        .map_err(plot_error)?;
    Ok(())
}

fn operator(root: &Area, centre: (i32, i32), name: &str, color: RGBColor) -> Result<()> {
    root.draw(&Circle::new(centre, 13, color.filled())).map_err(plot_error)?;
    let style = centred(14, VPos::Center).color(&WHITE);
    root.draw(&Text::new(name.to_string(), centre, style)).map_err(plot_error)?;
    Ok(())
}

fn arrow(root: &Area, from: (i32, i32), to: (i32, i32)) -> Result<()> {
    let grey = RGBColor(0x66, 0x66, 0x66);
    root.draw(&PathElement::new([from, to], grey.stroke_width(1))).map_err(plot_error)?;
    let (dx, dy) = (f64::from(to.0 - from.0), f64::from(to.1 - from.1));
    let length = (dx * dx + dy * dy).sqrt().max(1.0);
    let (ux, uy) = (dx / length, dy / length);
    let point =
        |along: f64, across: f64| (to.0 - (ux * along - uy * across) as i32, to.1 - (uy * along + ux * across) as i32);
    root.draw(&Polygon::new(vec![to, point(7.0, 3.5), point(7.0, -3.5)], grey.filled())).map_err(plot_error)?;
    Ok(())
}
