//! The exercises a run calls, checked before it starts: an unfinished one
//! would otherwise panic at its `todo!()` in the middle of the run (the first
//! checkpoint save, twenty steps in), on every rank.

use std::collections::{BTreeMap, BTreeSet};

use anyhow::{bail, Result};
use workbook::exercise_bodies::{UNFINISHED, UNPARSABLE};

use workbook::parallel::pipeline::PipelineSchedule;
use workbook::parallel::DataAxis;

use crate::run::RunOptions;
use crate::strategy::Strategy;

/// The list's format, shared with the build script that reads it.
#[path = "../../build/lean_file.rs"]
mod lean_file;

/// Which body of an exercise this build runs, by the build script's own rule.
pub use workbook::exercise_bodies::{body, Body};

/// Each exercise the run calls, with why.
pub fn exercises_called(options: &RunOptions) -> BTreeMap<u32, &'static str> {
    let mut called = BTreeMap::new();
    for number in [1, 2, 3, 4, 5, 7] {
        called.insert(number, "the model's forward pass");
    }
    if options.init_from.is_none() {
        called.insert(6, "the weights' initialisation");
    }
    called.insert(8, "AdamW's parameter groups");
    called.insert(9, "the learning-rate schedule");
    match options.layout.strategy {
        Strategy::Ddp => {
            match options.layout.ddp_overlap {
                true => called.insert(19, "--ddp-overlap"),
                false => called.insert(10, "the train step"),
            };
            called.insert(11, "the checkpoint every run saves");
            if options.layout.powersgd_rank.is_some() {
                called.insert(18, "--powersgd-rank");
            }
        }
        Strategy::Mesh { stages, tp, schedule, sequence_parallel, data } => {
            let by_data_axis = match data {
                DataAxis::ShardOptimizer => Some((17, "--strategy zero1")),
                DataAxis::ShardGradients => Some((17, "--strategy zero2")),
                DataAxis::YourDdp => Some((26, "--own-ddp")),
                // Phase 3 runs FSDP before exercise 22 is reached: the
                // reference unit step stands in for it until it is started.
                DataAxis::ShardBlocks { .. } if stages == 1 && tp == 1 => None,
                DataAxis::ShardBlocks { .. } => Some((22, "--strategy fsdp with --pp or --tp")),
                DataAxis::Replicate => None,
            };
            called.extend(by_data_axis);
            if let DataAxis::ShardBlocks { .. } = data {
                called.insert(12, "--strategy fsdp (its sharding plan)");
                called.insert(13, "--strategy fsdp (its precision policy)");
                called.insert(14, "--strategy fsdp (its units)");
                called.insert(15, "the checkpoint every run saves");
            }
            if stages > 1 {
                match schedule {
                    PipelineSchedule::GPipe => called.insert(21, "--pipeline-schedule gpipe"),
                    PipelineSchedule::OneFOneB => called.insert(24, "--pipeline-schedule 1f1b"),
                };
            }
            if tp > 1 {
                called.insert(20, "--tp (the MLP's split)");
                match sequence_parallel {
                    true => called.insert(27, "--sequence-parallel"),
                    false => called.insert(23, "--tp"),
                };
            }
            if options.layout.powersgd_rank.is_some() {
                called.insert(18, "--powersgd-rank");
            }
            if options.layout.strategy.cuts_the_model() {
                called.insert(25, "the device mesh of --pp and --tp");
            }
        }
    }
    if options.layout.own_ring {
        called.insert(16, "--allreduce ring");
    }
    called
}

/// Refuses a run that would reach an unfinished exercise, naming each one
/// and the two ways on.
pub fn check_finished(options: &RunOptions) -> Result<()> {
    match unfinished_called(&exercises_called(options), UNFINISHED) {
        Some(problem) => bail!("{problem}"),
        None => Ok(()),
    }
}

/// What to say when some of `called` are `unfinished`: the missing exercises
/// by what calls them, and the `lean` command that skips them.
fn unfinished_called(called: &BTreeMap<u32, &str>, unfinished: &[u32]) -> Option<String> {
    let missing: BTreeMap<u32, &str> =
        called.iter().filter(|(number, _)| unfinished.contains(number)).map(|(n, why)| (*n, *why)).collect();
    if missing.is_empty() {
        return None;
    }
    let by_reason = lean_file::ranges_by(missing.iter().map(|(number, why)| (*number, *why)));
    let lines: Vec<String> = by_reason.iter().map(|(why, numbers)| format!("  {numbers} ({why})")).collect();
    Some(format!(
        "this run calls exercises whose `todo!()` is still there:\n{}\nfinish them (`cargo xtask next`), or run \
         their reference bodies in their place: `cargo xtask lean {}`",
        lines.join("\n"),
        lean_file::ranges(&missing.into_keys().collect()).replace(' ', "")
    ))
}

/// The lines that say whose body each exercise this run calls runs: yours,
/// the reference leaned on, or the reference in place of a file that does
/// not parse (none with `--features solutions`, where every one is the
/// reference); and a warning for each file that does not parse, with where
/// it stops.
pub fn body_notes(options: &RunOptions) -> Vec<String> {
    let called = exercises_called(options);
    let whose =
        |wanted: Body| -> BTreeSet<u32> { called.keys().copied().filter(|&number| body(number) == wanted).collect() };
    let [yours, leaned, unparsable] = [Body::Yours, Body::Leaned, Body::DoesNotParse].map(whose);
    let said = [
        ("yours", &yours),
        ("the reference leaned on (`cargo xtask lean`)", &leaned),
        ("the reference in place of your file, which does not parse (below)", &unparsable),
    ];
    let parts: Vec<String> = said
        .iter()
        .filter(|(_, numbers)| !numbers.is_empty())
        .map(|(said, numbers)| format!("{said}: {}", lean_file::ranges(numbers)))
        .collect();
    // The run does not grade your code: the checks do.
    let graded_by = if yours.is_empty() { "" } else { "; `cargo xtask check N` grades yours" };
    let notes = (!cfg!(feature = "solutions") && !parts.is_empty())
        .then(|| format!("exercises this run calls, {}{graded_by}", parts.join("; ")));
    notes.into_iter().chain(UNPARSABLE.iter().map(|(_, sentence)| format!("warning: {sentence}"))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unfinished_exercise_is_named_with_what_calls_it() {
        let called: BTreeMap<u32, &str> =
            [(1, "the forward pass"), (2, "the forward pass"), (3, "the forward pass"), (16, "--allreduce ring")]
                .into();
        let problem = unfinished_called(&called, &[1, 2, 16, 20]).expect("refused");
        assert!(problem.contains("  1-2 (the forward pass)\n  16 (--allreduce ring)"), "{problem}");
        assert!(problem.ends_with("`cargo xtask lean 1-2,16`"), "{problem}");
        assert_eq!(unfinished_called(&called, &[20]), None, "20 is not called");
    }
}
