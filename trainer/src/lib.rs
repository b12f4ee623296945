//! The workbook as a trainer: with the exercises done (or `--features
//! solutions`), it trains a GPT on text, single-process or data-parallel over
//! CPU ranks, saves and resumes checkpoints, and generates from them.
//!
//! `train` and `infer` (in `src/bin/`) are thin command lines over this library.

mod banner;
pub mod checkpoints;
pub mod compute;
pub mod config;
pub mod eval;
pub mod flag_conflicts;
pub mod generate;
pub mod launching;
pub mod layout_flags;
pub mod metrics;
pub mod model_dir;
pub mod needs;
pub mod run;
pub mod strategy;
pub mod tensorboard;

/// `println!` for what a program reports on standard output, except that a
/// closed output (`train | head -1`) ends the printing, not the program: a
/// run goes on training, logging metrics and saving checkpoints.
#[macro_export]
macro_rules! report {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout().lock(), $($arg)*);
    }};
}

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

/// How one rank uses its share of the cores: each micro-batch's rows split
/// across `batch` threads, each part's tensor operations on `kernel` threads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RankThreads {
    pub batch: usize,
    pub kernel: usize,
}

impl RankThreads {
    /// Shares `threads` per rank (default: the cores / `nproc`) for a run
    /// whose micro-batches can be split into `rows` parts per rank (1 where
    /// the run cannot split them): as many parts as threads and rows allow,
    /// the rest of the threads to each part's kernels. A kernel thread count
    /// the user set in `RAYON_NUM_THREADS` is kept, and the parts are the
    /// threads left for it.
    ///
    /// Why split: candle's matrix products use every kernel thread, but at
    /// these sizes most of its other operations run on one, so on 2 cores
    /// the tiny config trained about 1.6 times as fast with the batch split
    /// across two single-threaded parts as with one part on two threads
    /// (`benchmarks/README.md`).
    pub fn share(nproc: usize, threads: Option<usize>, rows: usize) -> Self {
        let threads = threads.unwrap_or(cores() / nproc.max(1));
        Self::of(threads, rows, user_kernel_threads())
    }

    /// `threads` shared for `rows` parts at most, `kernel` threads each when given.
    fn of(threads: usize, rows: usize, kernel: Option<usize>) -> Self {
        let (threads, rows) = (threads.max(1), rows.max(1));
        match kernel {
            Some(kernel) => Self { batch: (threads / kernel).clamp(1, rows), kernel },
            None => {
                let batch = threads.min(rows);
                Self { batch, kernel: threads / batch }
            }
        }
    }

    /// Sets the kernel threads for the whole process. candle reads
    /// `RAYON_NUM_THREADS` at every matrix product and sizes its elementwise
    /// pool from `CANDLE_NUM_THREADS` once: parts on threads of their own
    /// run their elementwise operations themselves, since that pool serves
    /// one caller at a time. The passes over whole gradients and parameters
    /// between the model's passes (summing the parts' gradients, the
    /// optimizer's update) get every thread of the rank. Call it from `main`
    /// before any thread starts: setting the environment races with threads
    /// that read it.
    pub fn apply(self) -> anyhow::Result<()> {
        std::env::set_var("RAYON_NUM_THREADS", self.kernel.to_string());
        if self.batch > 1 {
            if std::env::var_os("CANDLE_NUM_THREADS").is_none() {
                std::env::set_var("CANDLE_NUM_THREADS", "1");
            }
            workbook::kernels::set_threads_between_passes(self.total())?;
        }
        Ok(())
    }

    /// Every thread the rank uses.
    pub fn total(self) -> usize {
        self.batch * self.kernel
    }
}

fn user_kernel_threads() -> Option<usize> {
    std::env::var("RAYON_NUM_THREADS").ok()?.parse().ok().filter(|&n| n > 0)
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

#[cfg(test)]
mod tests {
    use super::RankThreads;

    #[test]
    fn a_ranks_threads_go_to_parts_of_the_batch_first_then_to_their_kernels() {
        let of = |threads, rows, kernel| {
            let RankThreads { batch, kernel } = RankThreads::of(threads, rows, kernel);
            (batch, kernel)
        };
        assert_eq!(of(2, 16, None), (2, 1));
        assert_eq!(of(16, 2, None), (2, 8));
        assert_eq!(of(6, 4, None), (4, 1), "a part per row at most, a whole thread per kernel");
        assert_eq!(of(8, 1, None), (1, 8), "a run that cannot split gives its threads to the kernels");
        assert_eq!(of(8, 16, Some(2)), (4, 2), "RAYON_NUM_THREADS keeps its kernel threads");
        assert_eq!(of(1, 16, Some(4)), (1, 4));
    }
}
