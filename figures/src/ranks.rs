//! One step of a data-parallel run, rank by rank: the blocks computing on
//! the rank's own thread (forward, then backward) and the collectives on its
//! communication thread. FSDP's gather/compute/reduce-scatter rhythm and
//! DDP's buckets overlapping backward are both drawn with it.

use anyhow::{bail, Result};

use crate::lanes::{Bar, Lane, Panel};
use crate::style::{BACKWARD, COMM, FORWARD, OTHER, REDUCE};
use crate::trace::Span;

/// The panel called `title` of one step, from the trace's spans of that step.
pub fn panel(title: String, spans: &[Span]) -> Result<Panel> {
    let ranks = spans.iter().map(|s| s.rank + 1).max().unwrap_or(0);
    if ranks == 0 {
        bail!("the trace holds no span in its last step");
    }
    let mut lanes = vec![];
    for rank in 0..ranks {
        let of_rank = || spans.iter().filter(move |s| s.rank == rank);
        let compute = of_rank().filter(|s| s.category == "compute").filter_map(compute_bar).collect();
        let comm = of_rank().filter(|s| s.category == "comm").filter_map(comm_bar).collect();
        lanes.push(Lane { label: format!("rank {rank}: compute"), bars: compute });
        lanes.push(Lane { label: format!("rank {rank}: comm"), bars: comm });
    }
    Ok(Panel { title, lanes })
}

/// `forward, module 2` is block 2's forward (modules are the blocks).
fn compute_bar(span: &Span) -> Option<Bar> {
    let (kind, module) = span.name.split_once(", module ")?;
    let (label, color) = match kind {
        "forward" => (format!("F{module}"), FORWARD),
        "backward" => (format!("B{module}"), BACKWARD),
        _ => return None,
    };
    Some(Bar { start: span.start, end: span.end, label, color })
}

/// `all_gather #57, 803840 bytes` on the communication thread.
fn comm_bar(span: &Span) -> Option<Bar> {
    let (label, color) = match span.name.split(' ').next()? {
        "all_gather" => ("AG", COMM),
        "reduce_scatter" => ("RS", REDUCE),
        "all_reduce" => ("AR", REDUCE),
        _ => ("", OTHER),
    };
    Some(Bar { start: span.start, end: span.end, label: label.to_string(), color })
}
