//! GPipe against 1F1B: each stage's forwards and backwards of one step, as
//! the ranks ran them or as the schedules' rules place them, with the bubble
//! shaded and how many micro-batches' activations each stage held at most.

use anyhow::{bail, Result};

use crate::lanes::{Bar, Lane, Panel};
use crate::schedule::{self, Pass, Schedule};
use crate::style::{BACKWARD, FORWARD};
use crate::trace::Span;

/// The panel of one schedule's step, from its trace's spans (of that step).
/// Each stage's k-th pass is the k-th of its order under `schedule`, which
/// says which micro-batch it ran.
pub fn panel(schedule: Schedule, spans: &[Span]) -> Result<Panel> {
    let stages = spans.iter().map(|s| s.rank + 1).max().unwrap_or(0);
    if stages == 0 {
        bail!("the {schedule} trace holds no stage's span");
    }
    let mut lanes = vec![];
    let mut micro_batches = 0;
    for rank in 0..stages {
        let passes: Vec<(&Span, Pass)> = spans
            .iter()
            .filter(|s| s.rank == rank)
            .filter_map(|span| match span.name.split(',').next() {
                Some("forward") => Some((span, Pass::Forward)),
                Some("backward") => Some((span, Pass::Backward)),
                _ => None,
            })
            .collect();
        let forwards = passes.iter().filter(|(_, pass)| *pass == Pass::Forward).count();
        let order = schedule.order(rank, stages, forwards);
        let (mut held, mut most_held) = (0usize, 0);
        let mut bars = vec![];
        for (k, ((span, pass), op)) in passes.iter().zip(&order).enumerate() {
            if *pass != op.pass {
                bail!("stage {rank}'s pass {k} is a {pass:?} where {schedule} runs a {:?}", op.pass);
            }
            let (label, color) = match pass {
                Pass::Forward => {
                    held += 1;
                    (format!("F{}", op.micro_batch), FORWARD)
                }
                Pass::Backward => {
                    held = held.saturating_sub(1);
                    (format!("B{}", op.micro_batch), BACKWARD)
                }
            };
            most_held = most_held.max(held);
            bars.push(Bar { start: span.start, end: span.end, label, color });
        }
        micro_batches = micro_batches.max(forwards);
        lanes.push(Lane { label: format!("stage {rank}: ≤ {most_held} held"), bars });
    }
    Ok(Panel { title: format!("{schedule}: {stages} stages, {micro_batches} micro-batches, one step"), lanes })
}

/// The panel of one step under `schedule` by its rules alone: every pass
/// one slot long, each as early as its input allows, and the bubble that
/// leaves.
pub fn ideal_panel(schedule: Schedule, stages: usize, micro_batches: usize) -> Result<Panel> {
    let slots = schedule.slots(stages, micro_batches);
    let spans: Vec<Span> = slots
        .iter()
        .enumerate()
        .flat_map(|(rank, ops)| {
            ops.iter().map(move |(start, op)| Span {
                rank,
                name: if op.pass == Pass::Forward { "forward" } else { "backward" }.to_string(),
                category: "compute".to_string(),
                start: *start as f64,
                end: (start + 1) as f64,
            })
        })
        .collect();
    let mut panel = panel(schedule, &spans)?;
    // S and M, as the chapters write them.
    let (s, m) = (stages, micro_batches);
    panel.title = format!(
        "{schedule} by its rules: S = {s}, M = {m}, bubble (S−1)/(M+S−1) = {}/{} = {:.0}%",
        s - 1,
        m + s - 1,
        100.0 * schedule::bubble(&slots)
    );
    Ok(panel)
}
