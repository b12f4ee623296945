//! `cargo xtask`: the workbook's tool.
//!
//! Learners use `next`, `list`, `check`, `check-phase`, `hint`, `reset` and
//! `watch`; CI and authors use `verify`. Everything is driven by the one
//! metadata file, `exercises/info.toml`.

mod bench;
mod commands;
mod grading;
mod metadata;
mod progress;
mod render;
mod stub;
mod verify;
mod watch;
mod workspace;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::workspace::Workspace;

/// The workbook's tool: find your next exercise, grade it, get a hint.
#[derive(Parser)]
#[command(
    name = "cargo xtask",
    bin_name = "cargo xtask",
    arg_required_else_help = true
)]
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
    Next,
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
    /// Show the hint for an exercise and the mistakes its tests catch.
    Hint {
        /// The exercise number, e.g. 5.
        exercise: u32,
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
    /// Check the exercise set itself: metadata, solutions pass, stubs fail, guide builds (for CI).
    Verify,
    /// Measure the reference trainer's tokens/s beside PyTorch's and write benchmarks/results.md.
    Bench {
        /// A config in configs/: tiny, small or medium.
        #[arg(long, default_value = "tiny")]
        model_size: String,
        /// Timed optimizer steps per setup.
        #[arg(long, default_value_t = 20)]
        steps: usize,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(error) => {
            eprintln!("{} {error:#}", render::red("error:"));
            ExitCode::FAILURE
        }
    }
}

/// Runs one task; `Ok(false)` means it ran but something did not pass.
fn run(cli: Cli) -> anyhow::Result<bool> {
    let ws = Workspace::open(cli.solutions)?;
    match cli.command {
        Task::Next => commands::next(&ws).map(|_| true),
        Task::List { quick } => commands::list(&ws, quick),
        Task::Check { exercise } => commands::check(&ws, exercise),
        Task::CheckPhase { phase } => commands::check_phase(&ws, phase),
        Task::Hint { exercise } => commands::hint(&ws, exercise),
        Task::Reset { exercise, yes } => commands::reset(&ws, exercise, yes),
        Task::Watch => watch::watch(&ws),
        Task::Verify => verify::verify(&ws),
        Task::Bench { model_size, steps } => bench::bench(&ws, &model_size, steps),
    }
}
