//! `cargo xtask`: the workbook's tool.
//!
//! Learners use `next`, `list`, `check`, `check-phase`, `hint`, `reset`,
//! `watch` and `lean`. Everything is driven by the one metadata file,
//! `exercises/info.toml`.
//!
//! The commands of CI, the authors and the benchmarks (`verify`, `update`,
//! `doctor`, `figures`, `sample-stories`, `estimate`, `interop`, `matrix`,
//! `bench`) live in the `tools` program (tools/): `cargo xtask` hands them
//! on, and lends that program, through this library, what both need: the
//! workspace and its metadata, the graded tests' runner, the stubs, the
//! terminal styles and the machine probe.

mod commands;
pub mod grading;
mod lean;
pub mod machine;
pub mod metadata;
mod migrate;
mod progress;
pub mod render;
mod standing;
pub mod stub;
mod watch;
pub mod workspace;

use std::ffi::OsString;
use std::path::Path;
use std::process::ExitCode;

use anyhow::Context;
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

pub use crate::lean::{LEAN_FILE, LEAN_VARIABLE};
use crate::workspace::Workspace;

/// The workbook's tool: find your next exercise, grade it, get a hint.
#[derive(Parser)]
#[command(name = "cargo xtask", bin_name = "cargo xtask", arg_required_else_help = true)]
struct Cli {
    /// Grade the reference bodies in solutions/ instead of your exercises (for instructors).
    #[arg(long, global = true)]
    solutions: bool,

    #[command(subcommand)]
    command: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Show the first exercise that does not pass yet: what to write, where, and how to test it.
    Next {
        /// Show this exercise's card instead, e.g. 16.
        #[arg(conflicts_with = "phase")]
        exercise: Option<u32>,
        /// Start looking at this phase, e.g. 4 (lean on the reference for what you skip: `lean`).
        #[arg(long)]
        phase: Option<u32>,
    },
    /// List every exercise by phase: done, failing or not started.
    List {
        /// Show the last known states from the progress file instead of running the tests.
        #[arg(long)]
        quick: bool,
    },
    /// Grade one exercise: each check's verdict and why the failing ones fail.
    Check {
        /// The exercise number, e.g. 5.
        exercise: u32,
    },
    /// Grade every exercise of one phase.
    CheckPhase {
        /// The phase number, e.g. 1.
        phase: u32,
    },
    /// Show the hint tiers of an exercise read so far (the idea first); each `--more` adds one: the
    /// pieces, then the recipe with the mistakes its tests catch.
    Hint {
        /// The exercise number, e.g. 5.
        exercise: u32,
        /// One tier past those already read, for each time it is given: the pieces after the idea,
        /// then the recipe.
        #[arg(long, action = clap::ArgAction::Count)]
        more: u8,
    },
    /// Put an exercise's shipped `todo!` stub back (your code in its functions is lost).
    Reset {
        /// The exercise number, e.g. 5.
        exercise: u32,
        /// Do not ask for confirmation.
        #[arg(long)]
        yes: bool,
    },
    /// Grade the current exercise again whenever a file under exercises/ changes.
    Watch,
    /// Run the reference body of exercises you skip (e.g. `lean 1-15` to start at Phase 4);
    /// without a list, show which are leaned on.
    Lean {
        /// Exercises, like 6, 1-15 or 1-7,9 (`all` with --off); several may be
        /// given apart too: 1-7 9.
        exercises: Vec<String>,
        /// Stop leaning on them: compile your code again.
        #[arg(long)]
        off: bool,
    },
    /// Say what this machine has (cores, CUDA devices, GPU libraries) and where each kind of check runs.
    Doctor(Forwarded),
    /// Check the exercise set itself: metadata, solutions pass, stubs fail, guide builds (for CI).
    Verify(Forwarded),
    /// Write the lists that follow from exercises/info.toml: src/exercises.rs, the graded
    /// tests' module list and the guide's SUMMARY.md (for whoever adds an exercise).
    Update(Forwarded),
    /// Draw the guide's figures and write the numbers its chapters quote (`--record`: record their runs first).
    Figures(Forwarded),
    /// Write datasets/tinystories_sample.txt again from its generator (after changing the grammar).
    SampleStories(Forwarded),
    /// Estimate training memory per GPU by component, for a model, precision, strategy and GPU count.
    Estimate(Forwarded),
    /// Check checkpoints against Hugging Face transformers both ways (needs torch and transformers).
    Interop(Forwarded),
    /// Train every data-parallel axis on every small mesh, each beside one process: benchmarks/matrix.md.
    Matrix(Forwarded),
    /// Measure the trainer (throughput, fsdp, phase4, mesh, allreduce or loop): benchmarks/results.md.
    Bench(Forwarded),
}

/// A command of the authors' tools (tools/): this runner hands it, with its
/// arguments untouched (`--help` too), to the `tools` program.
#[derive(clap::Args)]
#[command(disable_help_flag = true)]
struct Forwarded {
    /// The command's own options and arguments: `--help` lists them.
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    args: Vec<OsString>,
}

/// Parses the command line and runs its task: the whole of the `xtask` binary.
pub fn main() -> ExitCode {
    let matches = Cli::command().get_matches();
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|error| error.exit());
    match run(cli, matches.subcommand_name().unwrap_or_default()) {
        Ok(code) => code,
        Err(error) => {
            eprintln!("{} {error:#}", render::red("error:"));
            ExitCode::FAILURE
        }
    }
}

/// Runs one task, named `command` on the command line: success, or failure
/// when it ran but something did not pass (a tool's own exit code).
fn run(cli: Cli, command: &str) -> anyhow::Result<ExitCode> {
    let ws = Workspace::open(cli.solutions)?;
    migrate::carry_over(&ws)?;
    let passed = match cli.command {
        Task::Doctor(tool)
        | Task::Verify(tool)
        | Task::Update(tool)
        | Task::Figures(tool)
        | Task::SampleStories(tool)
        | Task::Estimate(tool)
        | Task::Interop(tool)
        | Task::Matrix(tool)
        | Task::Bench(tool) => return forward(&ws.root, command, &tool.args),
        Task::Next { exercise, phase } => {
            let start = match (exercise, phase) {
                (Some(number), _) => commands::Start::Exercise(number),
                (None, Some(phase)) => commands::Start::Phase(phase),
                (None, None) => commands::Start::First,
            };
            commands::next(&ws, start).map(|_| true)
        }
        Task::List { quick } => commands::list(&ws, quick),
        Task::Check { exercise } => commands::check(&ws, exercise),
        Task::CheckPhase { phase } => commands::check_phase(&ws, phase),
        Task::Hint { exercise, more } => commands::hint(&ws, exercise, more),
        Task::Reset { exercise, yes } => commands::reset(&ws, exercise, yes),
        Task::Watch => watch::watch(ws),
        Task::Lean { exercises, off } => {
            let list = (!exercises.is_empty()).then(|| exercises.join(","));
            lean::lean(&ws, list.as_deref(), off)
        }
    }?;
    Ok(if passed { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

/// Runs the tools program's `command` with `args`, as cargo builds it beside
/// this runner, and passes its exit code on.
fn forward(root: &Path, command: &str, args: &[OsString]) -> anyhow::Result<ExitCode> {
    let status = workspace::cargo(root)
        .args(["run", "--quiet", "--package", "workbook-tools", "--", command])
        .args(args)
        .status()
        .context("cannot run cargo")?;
    Ok(status.code().and_then(|code| u8::try_from(code).ok()).map_or(ExitCode::FAILURE, ExitCode::from))
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::{Cli, Task};

    /// `--more` may be given again: each one is a tier further.
    #[test]
    fn more_counts_its_repeats() {
        let cli = Cli::try_parse_from(["xtask", "hint", "12", "--more", "--more"]).expect("parses");
        assert!(matches!(cli.command, Task::Hint { exercise: 12, more: 2 }));
    }

    /// The tools program parses a handed-on command's flags, `--help` too: they reach it as typed.
    #[test]
    fn a_tools_command_gets_its_arguments_as_typed() {
        for args in [&["--exercise", "16", "--exercise", "17"][..], &["--natural"], &["--help"], &[]] {
            let cli = Cli::try_parse_from(["xtask", "verify"].iter().chain(args)).expect("parses");
            let Task::Verify(tool) = cli.command else { panic!("`verify {args:?}` is not handed on") };
            assert_eq!(tool.args, args, "verify {args:?}");
        }
    }
}
