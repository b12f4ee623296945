//! ZeRO-1 and ZeRO-2's optimizer step, rank by rank: each rank's whole
//! gradient, reduce-scattered to the averaged shard it owns, AdamW on that
//! shard with the moments only that rank keeps, and the updated shards
//! all-gathered into whole parameters on every rank. The bytes beside each
//! collective and each kept buffer are worked out from Ψ, N and the element
//! size below, never typed.

use anyhow::{bail, Result};
use plotters::prelude::*;
use plotters::style::text_anchor::VPos;

use crate::loss::plot_error;
use crate::style::{centred, font, BACKWARD, COMM, FORWARD, OTHER, REDUCE, SMALL, TEXT, TITLE, WIDTH};

type Area<'a> = DrawingArea<SVGBackend<'a>, plotters::coord::Shift>;

/// Bytes of one f32 element: the chapter's ZeRO runs in f32, where the
/// parameters are their own master copy.
const ELEMENT: f64 = 4.0;

/// Per-rank bytes, as multiples of Ψ, of what the step keeps and sends.
#[derive(Debug, PartialEq)]
struct Bytes {
    /// The whole gradient (ZeRO-1 keeps it until the step).
    gradient: f64,
    /// The rank's shard of the averaged gradient (all ZeRO-2 keeps).
    gradient_shard: f64,
    /// AdamW's two moments, for the rank's shard only.
    moments: f64,
    /// What a ring reduce-scatter or all-gather of the whole vector sends
    /// from each rank: (N − 1)/N of it.
    collective: f64,
    /// What the step's reduce-scatter and all-gather send together: DDP's
    /// all-reduce of the gradient, 2(N − 1)/N of it.
    all_reduce: f64,
}

impl Bytes {
    fn of(world: usize) -> Bytes {
        let n = world as f64;
        let collective = (n - 1.0) / n * ELEMENT;
        Bytes {
            gradient: ELEMENT,
            gradient_shard: ELEMENT / n,
            moments: 2.0 * ELEMENT / n,
            collective,
            all_reduce: 2.0 * collective,
        }
    }
}

/// `coefficient` times Ψ as the guide writes it: `Ψ`, `3Ψ`, `0.5Ψ`.
fn psi(coefficient: f64) -> String {
    if coefficient == 1.0 {
        return "Ψ".to_string();
    }
    let digits = format!("{coefficient:.2}");
    format!("{}Ψ", digits.trim_end_matches('0').trim_end_matches('.'))
}

/// Where the ranks' columns start, after the rows' names.
const LEFT: i32 = 176;
const TOP: i32 = 58;
/// One row of slots, or one band of a step between rows.
const ROW: i32 = 34;
const SLOT: i32 = 30;
const SLOT_H: i32 = 22;
const NOTE_LINE: i32 = 19;

/// A row of every rank's slots: the name beside it, and how rank `r` holds
/// shard `s`, if it does.
struct Row {
    name: [String; 2],
    held: fn(rank: usize, shard: usize) -> Option<Held>,
}

/// How a slot is drawn: its colour, faded when it holds one rank's share
/// or stale values, and its text.
struct Held {
    color: RGBColor,
    faded: bool,
    text: &'static str,
}

/// One step between two rows, across all ranks when it is a collective.
struct Band {
    text: String,
    color: RGBColor,
}

/// Draws the step on `world` ranks.
pub fn draw(world: usize) -> Result<String> {
    if !(2..=4).contains(&world) {
        bail!("the ZeRO step is drawn for 2 to 4 ranks, not {world}");
    }
    let bytes = Bytes::of(world);
    let (whole, shard, moments) = (psi(bytes.gradient), psi(bytes.gradient_shard), psi(bytes.moments));
    let rows = [
        Row {
            name: ["gradient, whole".into(), format!("ZeRO-1 keeps {whole}")],
            held: |_, _| Some(Held { color: BACKWARD, faded: true, text: "g" }),
        },
        Row {
            name: ["gradient, its shard".into(), format!("ZeRO-2 keeps {whole}/N = {shard}")],
            held: |rank, shard| (rank == shard).then_some(Held { color: BACKWARD, faded: false, text: "avg" }),
        },
        Row {
            name: ["moments m, v".into(), format!("{}/N = {moments}, kept", psi(2.0 * bytes.gradient))],
            held: |rank, shard| (rank == shard).then_some(Held { color: OTHER, faded: false, text: "m v" }),
        },
        Row {
            name: ["parameters".into(), "its shard updated".into()],
            held: |rank, shard| {
                Some(if rank == shard {
                    Held { color: FORWARD, faded: false, text: "new" }
                } else {
                    Held { color: FORWARD, faded: true, text: "old" }
                })
            },
        },
        Row {
            name: ["parameters, whole".into(), "the same on every rank".into()],
            held: |_, _| Some(Held { color: FORWARD, faded: false, text: "new" }),
        },
    ];
    let ring = format!("(N−1)/N · {} = {} bytes sent by each rank", psi(bytes.gradient), psi(bytes.collective));
    let bands = [
        Band { text: format!("reduce-scatter, average: {ring}"), color: REDUCE },
        Band { text: "AdamW: each rank updates its shard alone, with its moments".to_string(), color: OTHER },
        Band { text: format!("all-gather of the updated shards: {ring}"), color: COMM },
    ];
    // Which band comes after which row: the moments sit beside the averaged shard.
    let band_after = |row: usize| match row {
        0 => Some(&bands[0]),
        2 => Some(&bands[1]),
        3 => Some(&bands[2]),
        _ => None,
    };
    let notes = [
        "ZeRO-1 keeps each rank's whole gradient until the step and reduce-scatters it there;".to_string(),
        "ZeRO-2 reduce-scatters each gradient as backward produces it and keeps only its shard.".to_string(),
        format!(
            "The two collectives send {} per rank: what DDP's all-reduce of the gradient sends.",
            psi(bytes.all_reduce)
        ),
    ];
    let lines = rows.len() + bands.len();
    let notes_top = TOP + ROW * lines as i32 + 12;
    let height = (notes_top + NOTE_LINE * notes.len() as i32 + 6) as u32;
    let column = (WIDTH as i32 - LEFT - 6) / world as i32;
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (WIDTH, height)).into_drawing_area();
        root.fill(&WHITE).map_err(plot_error)?;
        let title = format!("ZeRO-1 and ZeRO-2 on N = {world} ranks: one optimizer step over Ψ f32 parameters");
        root.draw(&Text::new(title, (WIDTH as i32 / 2, 16), centred(TITLE, VPos::Center))).map_err(plot_error)?;
        for rank in 0..world {
            let middle = LEFT + column * rank as i32 + column / 2;
            root.draw(&Text::new(format!("rank {rank}"), (middle, TOP - 14), centred(TEXT, VPos::Center)))
                .map_err(plot_error)?;
        }
        let mut y = TOP;
        for (r, row) in rows.iter().enumerate() {
            draw_row(&root, row, y, world, column)?;
            y += ROW;
            if let Some(band) = band_after(r) {
                draw_band(&root, band, y)?;
                y += ROW;
            }
        }
        for (k, note) in notes.iter().enumerate() {
            let at = (12, notes_top + NOTE_LINE * k as i32);
            root.draw(&Text::new(note.clone(), at, font(SMALL))).map_err(plot_error)?;
        }
        root.present().map_err(plot_error)?;
    }
    Ok(svg)
}

/// The row's name on the left and, in each rank's column, one slot per shard.
fn draw_row(root: &Area, row: &Row, top: i32, world: usize, column: i32) -> Result<()> {
    for (k, line) in row.name.iter().enumerate() {
        let size = if k == 0 { TEXT } else { SMALL };
        root.draw(&Text::new(line.clone(), (8, top + 1 + 15 * k as i32), font(size))).map_err(plot_error)?;
    }
    for rank in 0..world {
        let left = LEFT + column * rank as i32 + (column - SLOT * world as i32) / 2;
        for shard in 0..world {
            let corner = (left + SLOT * shard as i32, top + (ROW - SLOT_H) / 2 - 4);
            let far = (corner.0 + SLOT - 2, corner.1 + SLOT_H);
            let Some(held) = (row.held)(rank, shard) else {
                root.draw(&Rectangle::new([corner, far], BLACK.mix(0.25).stroke_width(1))).map_err(plot_error)?;
                continue;
            };
            let fill = if held.faded { held.color.mix(0.3) } else { held.color.mix(1.0) };
            root.draw(&Rectangle::new([corner, far], fill.filled())).map_err(plot_error)?;
            let ink = if held.faded { BLACK } else { WHITE };
            let centre = ((corner.0 + far.0) / 2, (corner.1 + far.1) / 2);
            root.draw(&Text::new(held.text, centre, centred(SMALL, VPos::Center).color(&ink))).map_err(plot_error)?;
        }
    }
    Ok(())
}

/// A step between two rows: a pale bar across every rank's column, its text on it.
fn draw_band(root: &Area, band: &Band, top: i32) -> Result<()> {
    let (corner, far) = ((LEFT - 4, top - 2), (WIDTH as i32 - 6, top + ROW - 12));
    root.draw(&Rectangle::new([corner, far], band.color.mix(0.15).filled())).map_err(plot_error)?;
    root.draw(&Rectangle::new([corner, far], band.color.stroke_width(1))).map_err(plot_error)?;
    let centre = ((corner.0 + far.0) / 2, (corner.1 + far.1) / 2);
    root.draw(&Text::new(band.text.clone(), centre, centred(SMALL, VPos::Center))).map_err(plot_error)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn psi_is_written_as_the_guide_writes_it() {
        assert_eq!([psi(1.0), psi(3.0), psi(0.5), psi(2.0 / 3.0)], ["Ψ", "3Ψ", "0.5Ψ", "0.67Ψ"]);
    }

    #[test]
    fn the_two_collectives_send_what_one_all_reduce_sends() {
        let bytes = Bytes::of(4);
        assert_eq!(bytes, Bytes { gradient: 4.0, gradient_shard: 1.0, moments: 2.0, collective: 3.0, all_reduce: 6.0 });
        assert_eq!(Bytes::of(2).collective, 2.0, "on 2 ranks each sends half of 4Ψ");
    }
}
