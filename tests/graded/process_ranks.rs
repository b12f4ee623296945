//! The harness of multi-rank tests on real processes: this test binary
//! starts itself again once per rank, with only the running test selected
//! and the `env://` variables set, and each copy joins a [`TcpProcessGroup`]
//! (or, with `--features nccl`, an NCCL group on GPU `LOCAL_RANK`).
//!
//! [`on_processes`] is the harness: in the parent it starts the ranks and
//! returns what each rank's body returned (sent back as JSON); in a rank it
//! runs the body and exits. A failing rank's own output becomes the test's
//! failure message, once, followed by the output of any rank it says
//! explains its failure (one that left, one to look at).

use std::path::PathBuf;
use std::process::{Command, Output};
use std::sync::Mutex;

use serde::de::DeserializeOwned;
use serde::Serialize;
use workbook::distributed::launch::{free_port, run_keeping_output, KeptRun};
use workbook::distributed::{init_from_env, LaunchConfig, ProcessGroup, TcpProcessGroup};

use crate::support::without_backtrace;

/// Set in a rank's environment: the test it runs, and where its result goes.
pub const RANK_OF: &str = "WORKBOOK_TEST_RANK_OF";
const RESULT_DIR: &str = "WORKBOOK_TEST_RESULTS";

/// The collective timeout of most process tests: long, as a 2-core machine
/// running other tests beside them is slow.
const TIMEOUT_S: u64 = 30;

/// Process tests start several processes each; one at a time keeps a 2-core
/// machine from timing them out.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Runs `body` on `world` ranks, each a process of its own, and returns what
/// each returned, in rank order. Call it once per test: each rank runs the
/// calling test from its start (libtest names a test's thread after it,
/// which is how a rank finds the test to run).
pub fn on_processes<T: Serialize + DeserializeOwned>(
    world: usize,
    body: impl FnOnce(TcpProcessGroup) -> candle_core::Result<T>,
) -> Vec<T> {
    every_rank(on_processes_some_may_exit(world, body))
}

/// Every rank's result, where none may be missing.
pub fn every_rank<T>(results: Vec<Option<T>>) -> Vec<T> {
    let with_rank = results.into_iter().enumerate();
    with_rank.map(|(rank, r)| r.unwrap_or_else(|| panic!("rank {rank} exited without a result"))).collect()
}

/// [`on_processes`] for tests in which a rank exits on purpose: its result is `None`.
pub fn on_processes_some_may_exit<T: Serialize + DeserializeOwned>(
    world: usize,
    body: impl FnOnce(TcpProcessGroup) -> candle_core::Result<T>,
) -> Vec<Option<T>> {
    on_processes_timing_out_after(world, TIMEOUT_S, body)
}

/// [`on_processes_some_may_exit`] with a collective timeout of `seconds`.
pub fn on_processes_timing_out_after<T: Serialize + DeserializeOwned>(
    world: usize,
    seconds: u64,
    body: impl FnOnce(TcpProcessGroup) -> candle_core::Result<T>,
) -> Vec<Option<T>> {
    on_processes_joining(world, seconds, init_from_env, body)
}

/// [`on_processes`] with every rank on its own GPU (GPU `LOCAL_RANK`), its
/// collectives over NCCL.
#[cfg(feature = "nccl")]
pub fn on_gpu_processes<T: Serialize + DeserializeOwned>(
    world: usize,
    body: impl FnOnce(workbook::distributed::NcclProcessGroup) -> candle_core::Result<T>,
) -> Vec<T> {
    every_rank(on_processes_joining(world, TIMEOUT_S, workbook::distributed::NcclProcessGroup::init_from_env, body))
}

/// The harness itself: in a rank, `join` its group and run `body`; in the
/// test, start the ranks and collect their results.
fn on_processes_joining<G: ProcessGroup, T: Serialize + DeserializeOwned>(
    world: usize,
    seconds: u64,
    join: impl FnOnce() -> candle_core::Result<Option<G>>,
    body: impl FnOnce(G) -> candle_core::Result<T>,
) -> Vec<Option<T>> {
    let test = this_test();
    if std::env::var(RANK_OF).as_deref() == Ok(test.as_str()) {
        run_rank(join, body);
    }
    collect(start_ranks(world, &test, seconds), world, &test)
}

fn this_test() -> String {
    std::thread::current().name().expect("libtest names each test's thread").to_string()
}

/// The rank's side: join the group, run `body`, write its result, exit.
fn run_rank<G: ProcessGroup, T: Serialize>(
    join: impl FnOnce() -> candle_core::Result<Option<G>>,
    body: impl FnOnce(G) -> candle_core::Result<T>,
) -> ! {
    let pg = join()
        .and_then(|pg| pg.ok_or_else(|| candle_core::Error::Msg("RANK is not set".into())))
        .unwrap_or_else(|e| fail(&format!("joining the group: {e}")));
    let rank = pg.rank();
    match body(pg) {
        Ok(result) => {
            let path =
                PathBuf::from(std::env::var(RESULT_DIR).expect("set by the harness")).join(format!("rank{rank}.json"));
            std::fs::write(path, serde_json::to_vec(&result).expect("serialisable"))
                .expect("writable result directory");
            std::process::exit(0)
        }
        Err(e) => fail(&crate::support::explain_error(&e)),
    }
}

fn fail(message: &str) -> ! {
    eprintln!("{message}");
    std::process::exit(1)
}

/// Starts `world` copies of this binary running `test` under the launcher's
/// supervision (each dies with this process; the first to fail stops the
/// others, so a rank stuck in a collective cannot hang the test) and waits.
fn start_ranks(world: usize, test: &str, timeout_s: u64) -> (tempdir::Dir, KeptRun) {
    let _serial = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempdir::Dir::new();
    let config = LaunchConfig { nproc_per_node: world, ..LaunchConfig::default() };
    let port = free_port(&config.master_addr).expect("a free port");
    let exe = std::env::current_exe().expect("the test binary");
    let ranks = (0..world).map(|local_rank| {
        let mut rank = Command::new(&exe);
        rank.args([test, "--exact", "--nocapture", "--test-threads", "1"])
            .envs(config.rank_environment(local_rank, port, "test-token"))
            .env(RANK_OF, test)
            .env(RESULT_DIR, dir.path())
            .env("RAYON_NUM_THREADS", "1")
            .env("WORKBOOK_TIMEOUT_S", timeout_s.to_string());
        rank
    });
    let run = run_keeping_output(ranks.collect()).expect("starting the ranks");
    (dir, run)
}

/// Each rank's result, or a failure showing the first failing rank's output
/// (see [`failure_report`]).
fn collect<T: DeserializeOwned>((dir, run): (tempdir::Dir, KeptRun), world: usize, test: &str) -> Vec<Option<T>> {
    if let Some(rank) = run.first_failure {
        panic!("{}", failure_report(&run.outputs, rank, test));
    }
    (0..world)
        .map(|rank| {
            let bytes = std::fs::read(dir.path().join(format!("rank{rank}.json"))).ok()?;
            let read = serde_json::from_slice(&bytes);
            Some(read.unwrap_or_else(|e| {
                // JSON has no NaN or infinity: serde writes them as null, and a float reads null so.
                let non_finite = e.to_string().starts_with("invalid type: null, expected f");
                match non_finite {
                    true => panic!("rank {rank} of {world} returned a non-finite number (NaN or infinity)"),
                    false => panic!("rank {rank} of {world}'s result does not read back: {e}"),
                }
            }))
        })
        .collect()
}

/// How many of a rank's last lines a failure shows, of each of its streams.
const SHOWN_LINES: usize = 40;

/// The failure of a run whose rank `first` failed first: its status and
/// output, then the output of each rank that output says explains it (one
/// that closed its connection, one to look at), and so on down the chain.
fn failure_report(outputs: &[Output], first: usize, test: &str) -> String {
    let (world, others) = (outputs.len(), outputs.iter().filter(|o| !o.status.success()).count() - 1);
    let mut report = format!(
        "rank {first} of {world} failed ({}; {others} other rank(s) failed or were stopped after it):\n{}",
        outputs[first].status,
        own_output(&outputs[first], test)
    );
    let mut shown = vec![first];
    let mut rank = first;
    while let Some(blamed) = blamed_rank(&String::from_utf8_lossy(&outputs[rank].stderr)) {
        if blamed >= world || shown.contains(&blamed) {
            break;
        }
        let output = &outputs[blamed];
        report += &format!("\nrank {blamed}'s own output ({}):\n{}", output.status, own_output(output, test));
        shown.push(blamed);
        rank = blamed;
    }
    report
}

/// The rank a failing rank's output names as the one to look at: `look at
/// rank N`, or else `rank N closed its connection`.
fn blamed_rank(output: &str) -> Option<usize> {
    let words: Vec<&str> = output.split_whitespace().collect();
    let number = |word: &str| word.trim_end_matches([',', ':', ';', '.', ')']).parse::<usize>().ok();
    let look_at = words.windows(4).find(|w| w[..3] == ["look", "at", "rank"]).and_then(|w| number(w[3]));
    let closed = || {
        words
            .windows(5)
            .find(|w| w[0] == "rank" && w[2..] == ["closed", "its", "connection"])
            .and_then(|w| number(w[1]))
    };
    look_at.or_else(closed)
}

/// What a rank printed, for a failure: the last [`SHOWN_LINES`] lines of its
/// standard error without the backtraces candle folds into its errors (the
/// message stays, and where in an exercise it was raised), then of what the
/// one test it runs, `test`, printed on its standard output.
fn own_output(output: &Output, test: &str) -> String {
    let stderr = without_backtrace(&String::from_utf8_lossy(&output.stderr));
    let stdout = String::from_utf8_lossy(&output.stdout);
    let mut shown = match stderr.trim().is_empty() {
        true => "(nothing on its standard error)".to_string(),
        false => last_lines(&stderr.lines().collect::<Vec<_>>()),
    };
    let printed = printed_by_the_test(&stdout, test);
    if !printed.is_empty() {
        shown += &format!("\nits standard output:\n{}", last_lines(&printed.lines().collect::<Vec<_>>()));
    }
    shown
}

/// A rank's standard output without libtest's: its test's line, which the
/// test's own output continues (`--nocapture`), and after a panic the report
/// from `FAILED` on (a rank that returns exits before libtest says more).
fn printed_by_the_test<'a>(stdout: &'a str, test: &str) -> &'a str {
    let body = stdout.split_once(&format!("test {test} ... ")).map_or(stdout, |(_, body)| body);
    let end = body.rfind("FAILED\n\nfailures:").unwrap_or(body.len());
    body[..end].trim()
}

/// The last [`SHOWN_LINES`] of `lines`, saying how many came before.
fn last_lines(lines: &[&str]) -> String {
    let lines: Vec<&str> = lines.iter().copied().skip_while(|line| line.trim().is_empty()).collect();
    let cut = lines.len().saturating_sub(SHOWN_LINES);
    let earlier = match cut {
        0 => String::new(),
        n => format!("({n} earlier line(s) not shown)\n"),
    };
    format!("{earlier}{}", lines[cut..].join("\n").trim_end())
}

#[cfg(test)]
mod tests {
    use std::process::ExitStatus;

    use super::*;

    #[test]
    fn the_rank_a_failure_blames_is_the_one_to_look_at_or_the_one_that_left() {
        let closed = "error: rank 2 closed its connection while rank 0 waited in recv #3: rank 2 exited or crashed \
                      (its own output says why)";
        assert_eq!(blamed_rank(closed), Some(2));
        let waits = "all_reduce timed out after 30s on rank 0: rank 1 is alive but has itself waited on rank 3 all \
                     this time; look at rank 3: it is stuck in its own work, or the ranks wait for each other";
        assert_eq!(blamed_rank(waits), Some(3));
        assert_eq!(blamed_rank("ring_all_reduce failed: rank 0 failed: panicked: attempt to subtract"), None);
    }

    #[test]
    fn a_ranks_output_is_cut_to_its_last_lines_without_libtests() {
        let many: Vec<String> = (0..SHOWN_LINES + 5).map(|i| format!("line {i}")).collect();
        let output = Output {
            status: ExitStatus::default(),
            stderr: many.join("\n").into_bytes(),
            stdout: b"\nrunning 1 test\ntest exercise_16::it_runs ... my debug print\nFAILED\n\nfailures:\n\nfailures:\n    \
                      exercise_16::it_runs\n\ntest result: FAILED. 0 passed; 1 failed\n"
                .to_vec(),
        };
        let shown = own_output(&output, "exercise_16::it_runs");
        assert!(shown.starts_with("(5 earlier line(s) not shown)\nline 5\n"), "{shown}");
        assert!(shown.ends_with(&format!("line {}\nits standard output:\nmy debug print", SHOWN_LINES + 4)), "{shown}");
    }

    #[test]
    fn a_ranks_error_keeps_its_message_above_a_long_backtrace() {
        let frames: Vec<String> =
            (0..2 * SHOWN_LINES).map(|i| format!("  {i}: candle_core::f\n      at src/x.rs:{i}:1")).collect();
        let stderr = format!("rank 1 fails on purpose\n{}", frames.join("\n"));
        let output = Output { status: ExitStatus::default(), stderr: stderr.into_bytes(), stdout: Vec::new() };
        assert_eq!(own_output(&output, "processes::it"), "rank 1 fails on purpose");
    }

    #[test]
    fn a_failure_shows_the_output_of_the_rank_it_blames() {
        let output = |code: i32, stderr: &str| Output {
            status: exit_status(code),
            stdout: Vec::new(),
            stderr: stderr.as_bytes().to_vec(),
        };
        let outputs = [
            output(1, "rank 1 closed its connection while rank 0 waited in recv #1: rank 1 exited or crashed"),
            output(
                101,
                "exercises/phase4_under_the_hood/ex16_ring_all_reduce.rs:59:42: attempt to subtract with overflow",
            ),
        ];
        let report = failure_report(&outputs, 0, "exercise_16::it_runs");
        assert!(report.starts_with("rank 0 of 2 failed (exit status: 1; 1 other rank(s)"), "{report}");
        assert!(
            report.contains("\nrank 1's own output (exit status: 101):\nexercises/phase4_under_the_hood/ex16"),
            "{report}"
        );
    }

    #[cfg(unix)]
    fn exit_status(code: i32) -> ExitStatus {
        std::os::unix::process::ExitStatusExt::from_raw(code << 8)
    }

    #[cfg(windows)]
    fn exit_status(code: i32) -> ExitStatus {
        std::os::windows::process::ExitStatusExt::from_raw(code as u32)
    }
}

/// A temporary directory removed when dropped.
mod tempdir {
    use std::path::{Path, PathBuf};
    use std::sync::atomic::{AtomicUsize, Ordering};

    pub struct Dir(PathBuf);

    impl Dir {
        pub fn new() -> Self {
            static N: AtomicUsize = AtomicUsize::new(0);
            let name = format!("workbook-ranks-{}-{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed));
            let path = std::env::temp_dir().join(name);
            std::fs::create_dir_all(&path).expect("temp dir");
            Self(path)
        }

        pub fn path(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}
