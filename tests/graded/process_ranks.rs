//! The harness of multi-rank tests on real processes: this test binary
//! starts itself again once per rank, with only the running test selected
//! and the `env://` variables set, and each copy joins a [`TcpProcessGroup`]
//! (or, with `--features nccl`, an NCCL group on GPU `LOCAL_RANK`).
//!
//! [`on_processes`] is the harness: in the parent it starts the ranks and
//! returns what each rank's body returned (sent back as JSON); in a rank it
//! runs the body and exits. A failing rank's own output becomes the test's
//! failure message, once.

use std::path::PathBuf;
use std::process::Command;
use std::sync::Mutex;

use serde::de::DeserializeOwned;
use serde::Serialize;
use workbook::distributed::launch::{free_port, run_keeping_output, KeptRun};
use workbook::distributed::{init_from_env, LaunchConfig, ProcessGroup, TcpProcessGroup};

/// Set in a rank's environment: the test it runs, and where its result goes.
const RANK_OF: &str = "WORKBOOK_TEST_RANK_OF";
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
fn every_rank<T>(results: Vec<Option<T>>) -> Vec<T> {
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
    collect(start_ranks(world, &test, seconds), world)
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
        Err(e) => fail(&e.to_string()),
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

/// Each rank's result, or a failure showing the first failing rank's output.
fn collect<T: DeserializeOwned>((dir, run): (tempdir::Dir, KeptRun), world: usize) -> Vec<Option<T>> {
    if let Some(rank) = run.first_failure {
        let out = &run.outputs[rank];
        let others = run.outputs.iter().filter(|o| !o.status.success()).count() - 1;
        panic!(
            "rank {rank} of {world} failed ({}; {others} other rank(s) failed or were stopped after it):\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
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
