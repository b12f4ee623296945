//! The device mesh as a grid in three dimensions: every rank at its
//! coordinates (dp, pp, tp), as the workbook's `DeviceMesh` numbers them
//! (recorded by `record_mesh`), the groups along each axis as the lines
//! between neighbours, and one rank's three groups drawn bold.

use anyhow::{bail, Result};
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, VPos};
use serde::Deserialize;

use crate::loss::plot_error;
use crate::style::{centred, placed, COMM, FORWARD, IDLE, SECOND, SMALL, TEXT, TITLE, WIDTH};

/// What `record_mesh` printed.
#[derive(Deserialize)]
pub struct MeshRecord {
    shape: Coords,
    /// Rank r's coordinates at index r.
    coords: Vec<Coords>,
    /// The rank whose groups are drawn bold.
    rank: usize,
    groups: Groups,
}

/// Sizes or coordinates along the three axes.
#[derive(Deserialize, Clone, Copy, PartialEq, Eq)]
struct Coords {
    dp: usize,
    pp: usize,
    tp: usize,
}

/// The ranks of one rank's group along each axis.
#[derive(Deserialize)]
struct Groups {
    dp: Vec<usize>,
    pp: Vec<usize>,
    tp: Vec<usize>,
}

/// One axis: its name, colour, a step one rank along it, its group of the
/// drawn rank, and the two coordinates its groups share.
struct Axis<'a> {
    name: &'static str,
    color: RGBColor,
    step: fn(Coords) -> Coords,
    group: &'a [usize],
    shared: &'static str,
}

impl Axis<'_> {
    /// The rank one step along this axis from `from`, if the mesh has one.
    fn next(&self, coords: &[Coords], from: Coords) -> Option<usize> {
        let to = (self.step)(from);
        coords.iter().position(|c| *c == to)
    }
}

const HEIGHT: u32 = 350;
/// Where rank 0 sits, and how far the grid reaches along tp (across), pp
/// (down) and dp (back: up and to the right).
const ORIGIN: (i32, i32) = (60, 160);
const TP_SPAN: i32 = 170;
const PP_SPAN: i32 = 150;
const DP_SPAN: (i32, i32) = (110, -85);
const NODE_R: i32 = 17;
/// Where the key's text starts, and its line height.
const KEY_LEFT: i32 = 430;
const KEY_LINE: i32 = 22;

/// Draws `record`.
pub fn draw(record: &MeshRecord) -> Result<String> {
    let MeshRecord { shape, coords, rank, groups } = record;
    let world = shape.dp * shape.pp * shape.tp;
    if coords.len() != world || *rank >= world {
        bail!("the record holds {} ranks' coordinates for a mesh of {world}, and rank {rank}", coords.len());
    }
    let axes = [
        Axis {
            name: "tp",
            color: COMM,
            step: |c| Coords { tp: c.tp + 1, ..c },
            group: &groups.tp,
            shared: "dp and pp",
        },
        Axis {
            name: "pp",
            color: FORWARD,
            step: |c| Coords { pp: c.pp + 1, ..c },
            group: &groups.pp,
            shared: "dp and tp",
        },
        Axis {
            name: "dp",
            color: SECOND,
            step: |c| Coords { dp: c.dp + 1, ..c },
            group: &groups.dp,
            shared: "pp and tp",
        },
    ];
    let at = |c: &Coords| {
        let step = |span: i32, size: usize| if size > 1 { span / (size as i32 - 1) } else { 0 };
        (
            ORIGIN.0 + step(TP_SPAN, shape.tp) * c.tp as i32 + step(DP_SPAN.0, shape.dp) * c.dp as i32,
            ORIGIN.1 + step(PP_SPAN, shape.pp) * c.pp as i32 + step(DP_SPAN.1, shape.dp) * c.dp as i32,
        )
    };
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (WIDTH, HEIGHT)).into_drawing_area();
        root.fill(&WHITE).map_err(plot_error)?;
        let title = format!(
            "The device mesh dp {} × pp {} × tp {}: {world} ranks, and rank {rank}'s three groups",
            shape.dp, shape.pp, shape.tp
        );
        root.draw(&Text::new(title, (WIDTH as i32 / 2, 16), centred(TITLE, VPos::Center))).map_err(plot_error)?;
        // Each rank's line to its next neighbour along each axis: the groups.
        for axis in &axes {
            for (r, c) in coords.iter().enumerate() {
                let Some(next) = axis.next(coords, *c) else { continue };
                let bold = axis.group.contains(&r) && axis.group.contains(&next);
                let style = if bold { axis.color.stroke_width(5) } else { axis.color.mix(0.45).stroke_width(2) };
                root.draw(&PathElement::new([at(c), at(&coords[next])], style)).map_err(plot_error)?;
            }
        }
        for (r, c) in coords.iter().enumerate() {
            let centre = at(c);
            let (fill, text) = if r == *rank { (BLACK, WHITE) } else { (IDLE, BLACK) };
            root.draw(&Circle::new(centre, NODE_R, fill.filled())).map_err(plot_error)?;
            root.draw(&Circle::new(centre, NODE_R, BLACK.stroke_width(1))).map_err(plot_error)?;
            let style = centred(TEXT, VPos::Center).color(&text);
            root.draw(&Text::new(r.to_string(), centre, style)).map_err(plot_error)?;
            // Below and to the right, between the lines that leave a rank.
            let label_at = (centre.0 + NODE_R - 2, centre.1 + NODE_R + 2);
            let style = placed(SMALL, HPos::Left, VPos::Top);
            root.draw(&Text::new(format!("({}, {}, {})", c.dp, c.pp, c.tp), label_at, style)).map_err(plot_error)?;
        }
        // Each axis named at rank 0's line along it.
        let zero = coords[0];
        for axis in &axes {
            let Some(far) = axis.next(coords, zero) else { continue };
            let (from, to) = (at(&zero), at(&coords[far]));
            let middle = ((from.0 + to.0) / 2, (from.1 + to.1) / 2);
            // Off the line, on the side away from the grid.
            let label_at = match axis.name {
                "tp" => (middle.0, middle.1 - 14),
                "pp" => (middle.0 - 22, middle.1),
                _ => (middle.0 - 16, middle.1 - 12),
            };
            let style = centred(TEXT, VPos::Center).color(&axis.color);
            root.draw(&Text::new(axis.name, label_at, style)).map_err(plot_error)?;
        }
        let c = coords[*rank];
        let mut key = vec![(format!("rank {rank} at (dp, pp, tp) = ({}, {}, {})", c.dp, c.pp, c.tp), None)];
        for axis in &axes {
            let members: Vec<String> = axis.group.iter().map(usize::to_string).collect();
            let line = format!("{} group {{{}}}: same {}", axis.name, members.join(", "), axis.shared);
            key.push((line, Some(axis.color)));
        }
        key.extend([
            (String::new(), None),
            ("faint: the other groups of each axis".to_string(), None),
            ("(dp, pp, tp) beside each rank, as".to_string(), None),
            ("DeviceMesh numbers them: tp varies".to_string(), None),
            ("fastest, so a tp group's ranks are".to_string(), None),
            ("neighbours".to_string(), None),
        ]);
        for (k, (line, color)) in key.into_iter().enumerate() {
            let y = 70 + KEY_LINE * k as i32;
            let text_left = match color {
                Some(color) => {
                    root.draw(&PathElement::new([(KEY_LEFT, y), (KEY_LEFT + 22, y)], color.stroke_width(5)))
                        .map_err(plot_error)?;
                    KEY_LEFT + 30
                }
                None => KEY_LEFT,
            };
            let style = placed(SMALL, HPos::Left, VPos::Center);
            root.draw(&Text::new(line, (text_left, y), style)).map_err(plot_error)?;
        }
        root.present().map_err(plot_error)?;
    }
    Ok(svg)
}
