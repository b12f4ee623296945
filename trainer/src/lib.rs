//! The workbook as a trainer: with the exercises done (or `--features
//! solutions`), it trains a GPT on text, single-process or data-parallel over
//! CPU ranks, saves and resumes checkpoints, and generates from them.
//!
//! `train` and `infer` (in `src/bin/`) are thin command lines over this library.

pub mod checkpoints;
pub mod compute;
pub mod config;
pub mod eval;
pub mod generate;
pub mod launching;
pub mod metrics;
pub mod model_dir;
pub mod needs;
pub mod run;
pub mod strategy;
pub mod tensorboard;

/// The `main` of each program: runs `run`, and turns an error into one line
/// on stderr and a failing exit code instead of a panic.
pub fn main_with(run: impl FnOnce() -> anyhow::Result<()>) -> std::process::ExitCode {
    quiet_error_backtraces();
    workbook::memory::keep_freed_memory();
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Gives each of `nproc` ranks `cores / nproc` threads for its tensor kernels,
/// unless `RAYON_NUM_THREADS` was set by the user (`user_set`).
///
/// candle reads `RAYON_NUM_THREADS` at every matrix product. At the tiny
/// config's sizes its kernels gain little from a second thread, so on 2 cores
/// two single-threaded DDP ranks train about 1.6 times faster than one rank
/// with two threads each competing for the cores. Call it from `main` before
/// ranks start: setting the environment races with threads that read it.
pub fn set_kernel_threads(nproc: usize, user_set: bool) {
    if user_set {
        return;
    }
    std::env::set_var("RAYON_NUM_THREADS", (cores() / nproc.max(1)).max(1).to_string());
}

/// The kernel threads each rank runs with (what [`set_kernel_threads`] chose).
pub fn kernel_threads() -> usize {
    std::env::var("RAYON_NUM_THREADS").ok().and_then(|n| n.parse().ok()).unwrap_or_else(cores)
}

fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Keeps candle from folding a backtrace into every error message when
/// `RUST_BACKTRACE` is set: a user error should read as one line. Panics still
/// print their backtrace; set `RUST_LIB_BACKTRACE=1` to get them in errors too.
fn quiet_error_backtraces() {
    if std::env::var_os("RUST_LIB_BACKTRACE").is_none() {
        std::env::set_var("RUST_LIB_BACKTRACE", "0");
    }
}
