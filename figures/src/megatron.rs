//! The Megatron MLP split over tensor-parallel ranks, drawn from the model's
//! shapes: the input whole on every rank, each rank holding a run of the
//! hidden units (the rows of gate and up, the columns of down, as the
//! workbook stores a linear weight: out × in), and the two conjugate
//! operators that keep the pieces consistent, f before and g after.

use anyhow::{bail, Result};
use plotters::prelude::*;
use plotters::style::text_anchor::VPos;
use serde::Deserialize;

use crate::diagram::{arrow, boxed, operator, BOX_H, OPERATOR_R};
use crate::loss::plot_error;
use crate::style::{centred, font, BACKWARD, COMM, FORWARD, REDUCE, SMALL, TEXT, TITLE, WIDTH};

/// The shapes the figure is drawn for.
#[derive(Deserialize)]
pub struct MlpShape {
    hidden: usize,
    intermediate: usize,
    tp: usize,
}

/// From one rank's row to the next, with room for the rank's name between.
const ROW: i32 = 84;
const TOP: i32 = 56;
/// Between a box and the next thing along its row, room for an arrow.
const GAP: i32 = 22;
const NOTE_LINE: i32 = 19;

/// Draws the split for `shape`.
pub fn draw(shape: &MlpShape) -> Result<String> {
    let MlpShape { hidden: c, intermediate: i, tp } = *shape;
    if tp < 2 || i % tp != 0 {
        bail!("the MLP's {i} units do not split over {tp} ranks");
    }
    let part = i / tp;
    let notes = [
        "f: identity forward; backward, all-reduce of the input's gradient (each rank saw only its columns)",
        "g: all-reduce forward (Y = sum of the partial Ys); identity backward",
        "one all-reduce each way per MLP; the same pair wraps attention, cut by heads",
    ];
    let rows_end = TOP + ROW * tp as i32 - (ROW - BOX_H);
    let height = (rows_end + 24 + NOTE_LINE * notes.len() as i32) as u32;
    // Left to right: X, f, the rank's four pieces, g, Y; each box as wide as its text.
    let x_box = 76;
    let piece_widths = [112, 84, 104, 84];
    let f_centre = 4 + x_box + GAP + OPERATOR_R;
    let mut lefts = vec![];
    let mut x = f_centre + OPERATOR_R + GAP;
    for width in piece_widths {
        lefts.push(x);
        x += width + GAP;
    }
    let g_centre = x + OPERATOR_R;
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (WIDTH, height)).into_drawing_area();
        root.fill(&WHITE).map_err(plot_error)?;
        root.draw(&Text::new(
            format!("The SwiGLU MLP on {tp} tensor-parallel ranks (C = {c}, I = {i}; BT tokens)"),
            (WIDTH as i32 / 2, 16),
            centred(TITLE, VPos::Center),
        ))
        .map_err(plot_error)?;
        let middle = TOP + ROW * tp as i32 / 2 - ROW / 2 + BOX_H / 2;
        boxed(&root, (4, middle - BOX_H / 2), x_box, &["X, whole", &format!("BT × {c}")], FORWARD)?;
        for rank in 0..tp {
            let y = TOP + ROW * rank as i32;
            let centre = y + BOX_H / 2;
            arrow(&root, (4 + x_box, middle), (f_centre - OPERATOR_R, centre))?;
            operator(&root, (f_centre, centre), "f", COMM)?;
            let units = units_of(rank, part);
            let pieces: [(Vec<String>, RGBColor); 4] = [
                (vec!["gate, up".into(), format!("rows {units}"), format!("{part} × {c} each")], FORWARD),
                (vec!["SwiGLU".into(), format!("BT × {part}")], FORWARD),
                (vec!["down".into(), format!("cols {units}"), format!("{c} × {part}")], FORWARD),
                (vec!["partial Y".into(), format!("BT × {c}")], BACKWARD),
            ];
            // Each piece fed by the one before it, f feeding the first.
            let mut from = f_centre + OPERATOR_R;
            for (((lines, color), left), width) in pieces.iter().zip(&lefts).zip(piece_widths) {
                arrow(&root, (from, centre), (*left, centre))?;
                let lines: Vec<&str> = lines.iter().map(String::as_str).collect();
                boxed(&root, (*left, y), width, &lines, *color)?;
                from = left + width;
            }
            arrow(&root, (from, centre), (g_centre - OPERATOR_R, middle))?;
            root.draw(&Text::new(
                format!("rank {rank}"),
                (lefts[0] + piece_widths[0] / 2, y - 10),
                centred(SMALL, VPos::Center),
            ))
            .map_err(plot_error)?;
        }
        operator(&root, (g_centre, middle), "g", REDUCE)?;
        let y_at = g_centre + OPERATOR_R + GAP;
        arrow(&root, (g_centre + OPERATOR_R, middle), (y_at, middle))?;
        root.draw(&Text::new("Y", (y_at + 8, middle), centred(TEXT, VPos::Center))).map_err(plot_error)?;
        for (k, note) in notes.iter().enumerate() {
            let y = rows_end + 20 + NOTE_LINE * k as i32;
            root.draw(&Text::new(note.to_string(), (12, y), font(SMALL))).map_err(plot_error)?;
        }
        root.present().map_err(plot_error)?;
    }
    Ok(svg)
}

/// The hidden units rank `rank` holds, as `a..b`.
fn units_of(rank: usize, part: usize) -> String {
    format!("{}..{}", rank * part, (rank + 1) * part)
}
