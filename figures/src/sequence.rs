//! A block under sequence parallelism (exercise 27), on each rank of a
//! tensor-parallel group of N: the norms and residual adds on the rank's
//! T/N tokens, the attention and MLP partials on every token, and the
//! collectives along T at the borders between the two regions. Drawn from
//! the step's structure, not from a run.

use anyhow::Result;
use plotters::prelude::*;
use plotters::style::text_anchor::VPos;

use crate::diagram::{arrow, boxed, operator, Area, BOX_H, GREY, OPERATOR_R};
use crate::loss::plot_error;
use crate::style::{centred, font, BACKWARD, COMM, FORWARD, OTHER, REDUCE, SMALL, TITLE, WIDTH};

/// A sublayer's row: what comes in, its norm, its partial and what goes out.
struct Sublayer {
    input: &'static str,
    norm: &'static str,
    partial: [&'static str; 2],
    output: &'static str,
}

const SUBLAYERS: [Sublayer; 2] = [
    Sublayer { input: "x", norm: "input_layernorm", partial: ["attention", "this rank's heads"], output: "h" },
    Sublayer { input: "h", norm: "post_attention_layernorm", partial: ["MLP", "this rank's units"], output: "out" },
];

/// Left edges and widths along a row: the input, the norm, the partial and
/// the residual add, with the all-gather and the reduce-scatter between.
const INPUT: (i32, i32) = (8, 84);
const NORM: (i32, i32) = (112, 176);
const PARTIAL: (i32, i32) = (350, 130);
const ADD: (i32, i32) = (542, 110);
const GATHER_X: i32 = 318;
const SCATTER_X: i32 = 510;
/// Where the first row's boxes start, and from one row to the next.
const TOP: i32 = 104;
const ROW: i32 = 104;
const NOTE_LINE: i32 = 19;

/// Draws the block.
pub fn draw() -> Result<String> {
    let notes = [
        "AG: all-gather along T; backward, a reduce-scatter of its output's gradient along T",
        "RS: reduce-scatter along T, summing the ranks' partials; backward, an all-gather along T",
        "the norms' weight gradients, each from this rank's T/N tokens, are all-reduced",
        "N: the tensor-parallel group's size; the workbook's block has no dropout",
    ];
    let rows_end = TOP + ROW * SUBLAYERS.len() as i32 - (ROW - BOX_H);
    let height = (rows_end + 30 + NOTE_LINE * notes.len() as i32) as u32;
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (WIDTH, height)).into_drawing_area();
        root.fill(&WHITE).map_err(plot_error)?;
        let title = "One block under sequence parallelism, on each of N tensor-parallel ranks";
        root.draw(&Text::new(title, (WIDTH as i32 / 2, 16), centred(TITLE, VPos::Center))).map_err(plot_error)?;
        let regions = [
            (0, GATHER_X, ["sequence-parallel", "this rank's T/N tokens"], OTHER),
            (GATHER_X, SCATTER_X, ["tensor-parallel", "every token, split weights"], FORWARD),
            (SCATTER_X, WIDTH as i32, ["sequence-parallel", "T/N tokens"], OTHER),
        ];
        for (left, right, [name, what], color) in regions {
            root.draw(&Rectangle::new([(left, 34), (right, rows_end + 12)], color.mix(0.08).filled()))
                .map_err(plot_error)?;
            let middle = (left + right) / 2;
            root.draw(&Text::new(name, (middle, 46), centred(SMALL, VPos::Center))).map_err(plot_error)?;
            root.draw(&Text::new(what, (middle, 62), centred(SMALL, VPos::Center))).map_err(plot_error)?;
        }
        for (row, sublayer) in SUBLAYERS.iter().enumerate() {
            draw_sublayer(&root, TOP + ROW * row as i32, sublayer)?;
        }
        for (k, note) in notes.iter().enumerate() {
            let y = rows_end + 30 + NOTE_LINE * k as i32;
            root.draw(&Text::new(note.to_string(), (12, y), font(SMALL))).map_err(plot_error)?;
        }
        root.present().map_err(plot_error)?;
    }
    Ok(svg)
}

/// One sublayer's row, its boxes' tops at `top`: the input chunk through
/// its norm, gathered, through the partial, scattered and added back.
fn draw_sublayer(root: &Area, top: i32, sublayer: &Sublayer) -> Result<()> {
    let centre = top + BOX_H / 2;
    let chunk = "(B, T/N, C)";
    let whole = "(B, T, C)";
    boxed(root, (INPUT.0, top), INPUT.1, &[sublayer.input, chunk], FORWARD)?;
    arrow(root, (INPUT.0 + INPUT.1, centre), (NORM.0, centre))?;
    boxed(root, (NORM.0, top), NORM.1, &["RMSNorm", sublayer.norm, chunk], FORWARD)?;
    arrow(root, (NORM.0 + NORM.1, centre), (GATHER_X - OPERATOR_R, centre))?;
    operator(root, (GATHER_X, centre), "AG", COMM)?;
    backward(root, (GATHER_X, centre), "RS")?;
    arrow(root, (GATHER_X + OPERATOR_R, centre), (PARTIAL.0, centre))?;
    let [name, part] = sublayer.partial;
    boxed(root, (PARTIAL.0, top), PARTIAL.1, &[name, part, &format!("{whole}, a partial")], BACKWARD)?;
    arrow(root, (PARTIAL.0 + PARTIAL.1, centre), (SCATTER_X - OPERATOR_R, centre))?;
    operator(root, (SCATTER_X, centre), "RS", REDUCE)?;
    backward(root, (SCATTER_X, centre), "AG")?;
    arrow(root, (SCATTER_X + OPERATOR_R, centre), (ADD.0, centre))?;
    boxed(root, (ADD.0, top), ADD.1, &[&format!("{} = {} + RS", sublayer.output, sublayer.input), chunk], FORWARD)?;
    // The residual: the input chunk, around everything, into the add.
    let over = top - 10;
    let (from, to) = (INPUT.0 + INPUT.1 / 2, ADD.0 + ADD.1 / 2);
    root.draw(&PathElement::new([(from, top), (from, over), (to, over)], GREY)).map_err(plot_error)?;
    arrow(root, (to, over), (to, top))?;
    Ok(())
}

/// What the operator at `centre` becomes in backward, under it.
fn backward(root: &Area, centre: (i32, i32), name: &str) -> Result<()> {
    let at = (centre.0, centre.1 + OPERATOR_R + 11);
    root.draw(&Text::new(format!("back: {name}"), at, centred(SMALL, VPos::Center))).map_err(plot_error)?;
    Ok(())
}
