//! The workbook as a trainer: with the exercises done (or `--features
//! solutions`), it trains a GPT on text, single-process or data-parallel over
//! CPU ranks, saves and resumes checkpoints, and generates from them.
//!
//! `train` and `infer` (in `src/bin/`) are thin command lines over this library.

pub mod checkpoints;
pub mod config;
pub mod generate;
pub mod metrics;
pub mod run;

/// The `main` of each program: runs `run`, and turns an error into one line
/// on stderr and a failing exit code instead of a panic.
pub fn main_with(run: impl FnOnce() -> anyhow::Result<()>) -> std::process::ExitCode {
    quiet_error_backtraces();
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Keeps candle from folding a backtrace into every error message when
/// `RUST_BACKTRACE` is set: a user error should read as one line. Panics still
/// print their backtrace; set `RUST_LIB_BACKTRACE=1` to get them in errors too.
fn quiet_error_backtraces() {
    if std::env::var_os("RUST_LIB_BACKTRACE").is_none() {
        std::env::set_var("RUST_LIB_BACKTRACE", "0");
    }
}
