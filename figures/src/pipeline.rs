//! GPipe against 1F1B: each stage's forwards and backwards of one step, as
//! the ranks ran them, with the bubble shaded and how many micro-batches'
//! activations each stage held at most.

use anyhow::{bail, Result};

use crate::lanes::{Bar, Lane, Panel};
use crate::style::{BACKWARD, FORWARD};
use crate::trace::Span;

/// The panel of one schedule's step, from its trace's spans (of that step).
pub fn panel(schedule: &str, spans: &[Span]) -> Result<Panel> {
    let stages = spans.iter().map(|s| s.rank + 1).max().unwrap_or(0);
    if stages == 0 {
        bail!("the {schedule} trace holds no stage's span");
    }
    let mut lanes = vec![];
    let mut micro_batches = 0;
    for rank in 0..stages {
        let (mut forwards, mut backwards, mut held, mut most_held) = (0, 0, 0usize, 0);
        let mut bars = vec![];
        for span in spans.iter().filter(|s| s.rank == rank) {
            // Each stage runs its micro-batches' forwards in order, and their
            // backwards in order: the k-th of either is micro-batch k.
            let (label, color) = if span.name.starts_with("forward") {
                forwards += 1;
                held += 1;
                (format!("F{}", forwards - 1), FORWARD)
            } else if span.name.starts_with("backward") {
                backwards += 1;
                held = held.saturating_sub(1);
                (format!("B{}", backwards - 1), BACKWARD)
            } else {
                continue;
            };
            most_held = most_held.max(held);
            bars.push(Bar { start: span.start, end: span.end, label, color });
        }
        micro_batches = micro_batches.max(forwards);
        lanes.push(Lane { label: format!("stage {rank}: ≤ {most_held} held"), bars });
    }
    Ok(Panel { title: format!("{schedule}: {stages} stages, {micro_batches} micro-batches, one step"), lanes })
}
