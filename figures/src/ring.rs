//! The ring all-reduce, step by step: what each rank holds after each step,
//! drawn from a recorded run of exercise 16 (`record_ring`). Every element
//! is a box with the number of ranks whose values it sums; the boxes a rank
//! just received are outlined.

use anyhow::{bail, Context, Result};
use plotters::prelude::*;
use plotters::style::text_anchor::VPos;
use serde::Deserialize;

use crate::loss::plot_error;
use crate::style::{centred, FORWARD, SMALL, TITLE, WIDTH};

/// What `record_ring` printed.
#[derive(Deserialize)]
pub struct RingRecord {
    /// Each rank's tensor.
    inputs: Vec<Vec<f32>>,
    /// What each rank received, one payload per step, in order.
    received: Vec<Vec<Vec<f32>>>,
}

/// Which ranks' values (a bit per rank) each element of each rank holds.
type Holdings = Vec<Vec<u32>>;

impl RingRecord {
    /// The holdings at the start and after every step.
    fn steps(&self) -> Result<Vec<(Holdings, Vec<Vec<bool>>)>> {
        let (world, len) = (self.inputs.len(), self.inputs.first().map_or(0, Vec::len));
        if world < 2 || self.received.len() != world {
            bail!("the record holds {} inputs and {} ranks' receipts", world, self.received.len());
        }
        let mut holdings: Holdings = (0..world).map(|r| vec![1 << r; len]).collect();
        let mut steps = vec![(holdings.clone(), vec![vec![false; len]; world])];
        let count = self.received.iter().map(Vec::len).max().unwrap_or(0);
        for step in 0..count {
            let mut fresh = vec![vec![false; len]; world];
            let before = holdings.clone();
            for (rank, payloads) in self.received.iter().enumerate() {
                let Some(payload) = payloads.get(step) else { continue };
                let (offset, masks) = self.decode(payload).with_context(|| format!("rank {rank}'s receipt {step}"))?;
                for (j, mask) in masks.into_iter().enumerate() {
                    holdings[rank][offset + j] = before[rank][offset + j] | mask;
                    fresh[rank][offset + j] = true;
                }
            }
            steps.push((holdings.clone(), fresh));
        }
        Ok(steps)
    }

    /// Where `payload` sits in the tensor, and which ranks each of its
    /// elements sums: the offset at which every value is a sum of one subset.
    fn decode(&self, payload: &[f32]) -> Result<(usize, Vec<u32>)> {
        let (world, len) = (self.inputs.len(), self.inputs[0].len());
        let subset = |i: usize, value: f32| {
            (1..1u32 << world).find(|mask| {
                let sum: f32 = (0..world).filter(|r| mask & (1 << r) != 0).map(|r| self.inputs[r][i]).sum();
                sum == value
            })
        };
        (0..=len.saturating_sub(payload.len()))
            .find_map(|offset| {
                let masks: Option<Vec<u32>> = payload.iter().enumerate().map(|(j, &v)| subset(offset + j, v)).collect();
                masks.map(|m| (offset, m))
            })
            .context("no offset makes every received value a sum of the ranks' inputs")
    }
}

const LEFT: i32 = 70;
const TOP: i32 = 56;
const ROW: i32 = 54;
const BOX_H: i32 = 24;

/// Draws the steps of `record`.
pub fn draw(record: &RingRecord) -> Result<String> {
    let steps = record.steps()?;
    let (world, len) = (record.inputs.len(), record.inputs[0].len());
    let column = (WIDTH as i32 - LEFT - 10) / steps.len() as i32;
    let box_w = ((column - 14) / len as i32).min(20);
    let height = (TOP + ROW * world as i32 + 40) as u32;
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (WIDTH, height)).into_drawing_area();
        root.fill(&WHITE).map_err(plot_error)?;
        root.draw(&Text::new(
            format!("Ring all-reduce of {len} elements on {world} ranks: what each rank holds"),
            (WIDTH as i32 / 2, 14),
            centred(TITLE, VPos::Center),
        ))
        .map_err(plot_error)?;
        for (s, (holdings, fresh)) in steps.iter().enumerate() {
            let x0 = LEFT + column * s as i32;
            let title = match s {
                0 => "start".to_string(),
                s if s < world => format!("reduce-scatter {s}"),
                s => format!("all-gather {}", s + 1 - world),
            };
            root.draw(&Text::new(title, (x0 + column / 2, TOP - 16), centred(SMALL, VPos::Center)))
                .map_err(plot_error)?;
            for rank in 0..world {
                let y0 = TOP + ROW * rank as i32;
                if s == 0 {
                    root.draw(&Text::new(
                        format!("rank {rank}"),
                        (LEFT / 2, y0 + BOX_H / 2),
                        centred(SMALL, VPos::Center),
                    ))
                    .map_err(plot_error)?;
                }
                let left = x0 + (column - box_w * len as i32) / 2;
                for i in 0..len {
                    let sums = holdings[rank][i].count_ones();
                    let shade = FORWARD.mix(0.15 + 0.85 * f64::from(sums) / world as f64);
                    let corner = (left + box_w * i as i32, y0);
                    let far = (corner.0 + box_w - 2, y0 + BOX_H);
                    root.draw(&Rectangle::new([corner, far], shade.filled())).map_err(plot_error)?;
                    if fresh[rank][i] {
                        root.draw(&Rectangle::new([corner, far], BLACK.stroke_width(2))).map_err(plot_error)?;
                    }
                    let text = if sums as usize == world { WHITE } else { BLACK };
                    root.draw(&Text::new(
                        sums.to_string(),
                        ((corner.0 + far.0) / 2, y0 + BOX_H / 2),
                        centred(SMALL, VPos::Center).color(&text),
                    ))
                    .map_err(plot_error)?;
                }
            }
        }
        root.draw(&Text::new(
            "each box is one element: the number of ranks whose values it sums; outlined: received at this step",
            (WIDTH as i32 / 2, height as i32 - 18),
            centred(SMALL, VPos::Center),
        ))
        .map_err(plot_error)?;
        root.present().map_err(plot_error)?;
    }
    Ok(svg)
}
