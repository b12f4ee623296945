//! The launcher: starts one process per rank with the `env://` variables set,
//! as `torchrun` does, and ends the job as soon as one of them fails, or,
//! in an [elastic](elastic) job, starts the ranks again.
//!
//! ```text
//!   launch --nproc-per-node 2 -- train --model-size tiny
//!     ├── train ...   RANK=0 LOCAL_RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=41234
//!     └── train ...   RANK=1 LOCAL_RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=41234
//! ```
//!
//! On several machines, start one launcher per node with the same
//! `--nnodes`, `--master-addr` and `--master-port`, each with its own
//! `--node-rank`; node `k`'s processes are ranks `k · nproc_per_node ..`.
//! Every line a rank prints comes out prefixed with `[rank N]`.
//!
//! It uses only the standard library, so it runs wherever cargo does; on
//! Linux the ranks are also killed if the launcher itself is killed.

use std::convert::Infallible;
use std::ffi::OsString;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use candle_core::{bail, Error, Result};

use super::interrupt::{catch_interrupts, interrupted, Again, INTERRUPTED};
use crate::error::io_context;

mod elastic;
mod token;

pub use token::TOKEN_VARIABLE;

/// How a job is laid out over machines and processes (torchrun's flags).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchConfig {
    /// Ranks on this machine.
    pub nproc_per_node: usize,
    /// Machines in the job; in an elastic job, the most it admits.
    pub nnodes: usize,
    /// The fewest machines an elastic job goes on with (torchrun's `--nnodes
    /// MIN:MAX`); `nnodes` when the membership is fixed.
    pub min_nnodes: usize,
    /// This machine's number, in `0..nnodes`; node 0 runs rank 0, which hosts
    /// the store (in an elastic job node 0's launcher hosts the rendezvous,
    /// and the other nodes are numbered in the order they join each round).
    pub node_rank: usize,
    /// The address of node 0 as the other nodes reach it.
    pub master_addr: String,
    /// The store's port; with one node, `None` picks a free one.
    pub master_port: Option<u16>,
    /// Seconds a rank waits for another (`WORKBOOK_TIMEOUT_S`); `None` keeps the default.
    pub timeout_s: Option<u64>,
    /// How many times a job starts its ranks again after one fails
    /// (torchrun's `--max-restarts`); 0 ends the job at the first failure.
    pub max_restarts: usize,
    /// How long an elastic rendezvous waits for more machines once
    /// `min_nnodes` have joined.
    pub last_call: Duration,
    /// Where the job's secret is kept when it spans machines (see
    /// [`token`]); node 0 writes a fresh one there if there is none.
    pub token_file: Option<PathBuf>,
}

impl Default for LaunchConfig {
    fn default() -> Self {
        Self {
            nproc_per_node: 1,
            nnodes: 1,
            min_nnodes: 1,
            node_rank: 0,
            master_addr: "127.0.0.1".to_string(),
            master_port: None,
            timeout_s: None,
            max_restarts: 0,
            last_call: Duration::from_secs(10),
            token_file: None,
        }
    }
}

impl LaunchConfig {
    /// Ranks in the whole job (the most, in an elastic job).
    pub fn world_size(&self) -> usize {
        self.nproc_per_node * self.nnodes
    }

    /// Whether the job outlives a failed rank or a lost machine: it restarts,
    /// or its membership may change.
    pub fn is_elastic(&self) -> bool {
        self.max_restarts > 0 || self.min_nnodes < self.nnodes
    }

    /// The `env://` variables of this node's rank `local_rank`, for a job
    /// whose store is at `port` and whose secret is `token`.
    pub fn rank_environment(&self, local_rank: usize, port: u16, token: &str) -> Vec<(&'static str, String)> {
        let rank = self.node_rank * self.nproc_per_node + local_rank;
        let timeout = self.timeout_s.map(|s| ("WORKBOOK_TIMEOUT_S", s.to_string()));
        let mut env = vec![
            ("RANK", rank.to_string()),
            ("LOCAL_RANK", local_rank.to_string()),
            ("WORLD_SIZE", self.world_size().to_string()),
            ("LOCAL_WORLD_SIZE", self.nproc_per_node.to_string()),
            ("GROUP_RANK", self.node_rank.to_string()),
            ("MASTER_ADDR", self.master_addr.clone()),
            ("MASTER_PORT", port.to_string()),
            (TOKEN_VARIABLE, token.to_string()),
        ];
        env.extend(timeout);
        env
    }

    fn check(&self) -> Result<()> {
        if self.nproc_per_node == 0 || self.min_nnodes == 0 {
            bail!("launch: --nproc-per-node and --nnodes must be at least 1");
        }
        if self.min_nnodes > self.nnodes {
            bail!("launch: --nnodes {}:{} asks for more machines at least than at most", self.min_nnodes, self.nnodes);
        }
        if self.node_rank >= self.nnodes {
            bail!("launch: --node-rank {} is not below --nnodes {}", self.node_rank, self.nnodes);
        }
        if self.nnodes > 1 && self.master_port.is_none() {
            bail!("launch: with --nnodes {} every node needs the same --master-port (and --master-addr: node 0's address)", self.nnodes);
        }
        Ok(())
    }

    /// How long a rank waits for another, and a launcher for the others to join.
    pub fn timeout(&self) -> Duration {
        self.timeout_s.map_or(crate::distributed::DEFAULT_TIMEOUT, Duration::from_secs)
    }
}

/// Runs `program args` as this node's ranks and waits for them. Returns the
/// exit code for the launcher to exit with: 0 when every rank succeeded,
/// [`INTERRUPTED`] when the launcher was told to stop (a SIGINT or SIGTERM,
/// which stops the ranks), otherwise the first
/// failing rank's, after the others were stopped.
pub fn launch(config: &LaunchConfig, program: &Path, args: &[OsString]) -> Result<i32> {
    config.check()?;
    let port = match config.master_port {
        Some(port) => port,
        None => free_port(&config.master_addr)?,
    };
    let token = token::job_token(config)?;
    if config.is_elastic() {
        return elastic::run(config, port, &token, &Job { program, args });
    }
    catch_interrupts(Again::Caught);
    let mut ranks = Job { program, args }.start(config, port, &token, &[])?;
    Ok(match supervise(&mut ranks, || interrupted().then_some(())) {
        Ended::Succeeded => 0,
        Ended::Failed { code, report, .. } if !interrupted() => {
            eprintln!("launch: {report}");
            code
        }
        // A Ctrl-C at a terminal reaches the ranks too, which may die of it first.
        Ended::Failed { .. } | Ended::Interrupted(()) => {
            eprintln!("launch: interrupted: stopped the ranks");
            INTERRUPTED
        }
    })
}

/// Runs this very program again, with the same arguments, as this node's
/// ranks (what `train --nproc N` does); returns as [`launch`] does. The ranks
/// see `RANK` in their environment, which is how they know not to launch again.
pub fn relaunch_self(config: &LaunchConfig) -> Result<i32> {
    let program =
        std::env::current_exe().map_err(|e| io_context("launch: cannot find this program to start its ranks", e))?;
    let args: Vec<OsString> = std::env::args_os().skip(1).collect();
    launch(config, &program, &args)
}

/// The program every rank runs.
struct Job<'a> {
    program: &'a Path,
    args: &'a [OsString],
}

impl Job<'_> {
    /// Starts this node's ranks of `config`'s job, whose store is at `port`,
    /// with `extra` variables beside the `env://` ones.
    fn start(&self, config: &LaunchConfig, port: u16, token: &str, extra: &[(&str, String)]) -> Result<Vec<Rank>> {
        let threads = kernel_threads(config.nproc_per_node);
        let commands = (0..config.nproc_per_node).map(|local_rank| {
            let rank = config.node_rank * config.nproc_per_node + local_rank;
            let mut command = Command::new(self.program);
            command
                .args(self.args)
                .envs(config.rank_environment(local_rank, port, token))
                .envs(extra.iter().map(|(name, value)| (name, value)));
            if let Some(threads) = &threads {
                command.env("RAYON_NUM_THREADS", threads);
            }
            (rank, command)
        });
        spawn_ranks(commands, Printed::Prefixed).map_err(|(rank, e)| {
            Error::Msg(format!("launch: cannot start {} for rank {rank}: {e}", self.program.display()))
        })
    }
}

/// Starts each `(rank, command)` as a rank whose output [`Rank`]'s copiers
/// take as `printed` says, and which dies with this process. If one cannot
/// start, stops those already started and says which rank and why.
fn spawn_ranks(
    commands: impl Iterator<Item = (usize, Command)>,
    printed: Printed,
) -> std::result::Result<Vec<Rank>, (usize, io::Error)> {
    let mut ranks = vec![];
    for (rank, mut command) in commands {
        command.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
        die_with_launcher(&mut command);
        match command.spawn() {
            Ok(child) => ranks.push(Rank::start(rank, child, printed)),
            Err(e) => {
                stop(&mut ranks);
                return Err((rank, e));
            }
        }
    }
    Ok(ranks)
}

/// How a job run by [`run_keeping_output`] went.
pub struct KeptRun {
    /// Each rank's exit status and output, in rank order.
    pub outputs: Vec<Output>,
    /// The rank whose failure stopped the others, if one failed.
    pub first_failure: Option<usize>,
}

/// Runs `commands` as the ranks of a job (rank `i` is `commands[i]`) under
/// the launcher's supervision: each dies with this process, and the first
/// failure stops the others at once. Their output is kept, not printed, for
/// a harness that shows a failing rank's output its own way.
pub fn run_keeping_output(commands: Vec<Command>) -> Result<KeptRun> {
    let mut ranks = spawn_ranks(commands.into_iter().enumerate(), Printed::Kept)
        .map_err(|(rank, e)| Error::Msg(format!("cannot start rank {rank}: {e}")))?;
    let first_failure = match supervise(&mut ranks, || None::<Infallible>) {
        Ended::Failed { first, .. } => Some(first),
        Ended::Succeeded => None,
        Ended::Interrupted(never) => match never {},
    };
    let outputs = ranks.into_iter().map(|rank| rank.into_output().map_err(|e| io_context("waiting for a rank", e)));
    Ok(KeptRun { outputs: outputs.collect::<Result<_>>()?, first_failure })
}

/// What becomes of a rank's output.
#[derive(Clone, Copy)]
enum Printed {
    /// Copied to this process's, each line prefixed `[rank N]`.
    Prefixed,
    /// Kept in memory, for [`Rank::into_output`].
    Kept,
}

/// One running rank and the threads that copy its output.
struct Rank {
    rank: usize,
    child: Child,
    copiers: Vec<JoinHandle<()>>,
    status: Option<ExitStatus>,
    /// Its stdout and stderr so far, when they are kept.
    kept: [Arc<Mutex<Vec<u8>>>; 2],
}

impl Rank {
    fn start(rank: usize, mut child: Child, printed: Printed) -> Self {
        let kept: [Arc<Mutex<Vec<u8>>>; 2] = Default::default();
        let mut copiers = vec![];
        if let Some(out) = child.stdout.take() {
            copiers.push(match printed {
                Printed::Prefixed => copy_lines(out, rank, io::stdout),
                Printed::Kept => keep(out, Arc::clone(&kept[0])),
            });
        }
        if let Some(err) = child.stderr.take() {
            copiers.push(match printed {
                Printed::Prefixed => copy_lines(err, rank, io::stderr),
                Printed::Kept => keep(err, Arc::clone(&kept[1])),
            });
        }
        Self { rank, child, copiers, status: None, kept }
    }

    /// How it ended and what it printed, once [`supervise`] has returned.
    fn into_output(mut self) -> io::Result<Output> {
        let take =
            |kept: &Arc<Mutex<Vec<u8>>>| std::mem::take(&mut *kept.lock().unwrap_or_else(PoisonError::into_inner));
        let status = match self.status {
            Some(status) => status,
            None => self.child.wait()?,
        };
        let [stdout, stderr] = &self.kept;
        Ok(Output { status, stdout: take(stdout), stderr: take(stderr) })
    }
}

/// How this node's ranks ended.
enum Ended<Why> {
    /// Every one exited with 0.
    Succeeded,
    /// One failed and the others were stopped: the rank that failed first,
    /// the code to exit with, and what happened (which ranks failed how), for
    /// a line of the launcher's.
    Failed { first: usize, code: i32, report: String },
    /// They were stopped from outside, for this reason.
    Interrupted(Why),
}

/// Waits for every rank; at the first failure, or as soon as `interrupt`
/// gives a reason, stops the others.
fn supervise<Why>(ranks: &mut [Rank], mut interrupt: impl FnMut() -> Option<Why>) -> Ended<Why> {
    loop {
        for rank in ranks.iter_mut().filter(|r| r.status.is_none()) {
            rank.status = rank.child.try_wait().unwrap_or(None);
        }
        let mut failed: Vec<(usize, ExitStatus)> =
            ranks.iter().filter_map(|r| Some((r.rank, r.status.filter(|s| !s.success())?))).collect();
        if !failed.is_empty() {
            // Ranks that failed since the last look: one killed by a signal
            // is the likelier cause of the others' errors.
            failed.sort_by_key(|&(rank, status)| (signal(status).is_none(), rank));
            let running = ranks.iter().filter(|r| r.status.is_none()).count();
            stop(ranks);
            let (who, status) = failed[0];
            let mut report = format!("rank {who} {}", describe(status));
            for &(rank, status) in &failed[1..] {
                report += &format!("; rank {rank} {}", describe(status));
            }
            if running > 0 {
                report += &format!("; stopped the {running} rank(s) still running");
            }
            return Ended::Failed { first: who, code: exit_code(status), report };
        }
        if ranks.iter().all(|r| r.status.is_some()) {
            finish_output(ranks);
            return Ended::Succeeded;
        }
        if let Some(why) = interrupt() {
            stop(ranks);
            return Ended::Interrupted(why);
        }
        thread::sleep(Duration::from_millis(20));
    }
}

/// Kills the ranks still running and copies what is left of their output.
fn stop(ranks: &mut [Rank]) {
    for rank in ranks.iter_mut().filter(|r| r.status.is_none()) {
        let _ = rank.child.kill();
        rank.status = rank.child.wait().ok();
    }
    // A killed rank's own children (a shell's, say) may hold its output
    // open: copy for a moment, then leave them.
    let deadline = std::time::Instant::now() + Duration::from_millis(500);
    while std::time::Instant::now() < deadline && ranks.iter().any(|r| r.copiers.iter().any(|c| !c.is_finished())) {
        thread::sleep(Duration::from_millis(10));
    }
    for rank in ranks.iter_mut() {
        rank.copiers.clear(); // detaches the copiers still blocked
    }
}

/// Waits until every rank's output has been copied.
fn finish_output(ranks: &mut [Rank]) {
    for rank in ranks {
        for copier in rank.copiers.drain(..) {
            let _ = copier.join();
        }
    }
}

/// Copies `from` line by line to `to`, each line prefixed with the rank.
fn copy_lines<W: Write + 'static>(from: impl Read + Send + 'static, rank: usize, to: fn() -> W) -> JoinHandle<()> {
    thread::spawn(move || {
        let mut reader = BufReader::new(from);
        let prefix = format!("[rank {rank}] ");
        let mut line = prefix.clone().into_bytes();
        while matches!(reader.read_until(b'\n', &mut line), Ok(n) if n > 0) {
            if !line.ends_with(b"\n") {
                line.push(b'\n');
            }
            // One write per line: the standard streams lock for each write,
            // so two ranks' lines never interleave.
            let mut out = to();
            let _ = out.write_all(&line);
            let _ = out.flush();
            line.truncate(prefix.len());
        }
    })
}

/// Reads `from` to its end into `into`.
fn keep(mut from: impl Read + Send + 'static, into: Arc<Mutex<Vec<u8>>>) -> JoinHandle<()> {
    thread::spawn(move || {
        let mut buffer = [0u8; 8192];
        while let Ok(n @ 1..) = from.read(&mut buffer) {
            into.lock().unwrap_or_else(PoisonError::into_inner).extend_from_slice(&buffer[..n]);
        }
    })
}

fn describe(status: ExitStatus) -> String {
    match signal(status) {
        Some(signal) => format!("was killed by signal {signal}"),
        None => format!("exited with code {}", status.code().unwrap_or(1)),
    }
}

/// The shell's convention: a rank killed by signal `s` makes the job exit with 128 + s.
fn exit_code(status: ExitStatus) -> i32 {
    signal(status).map_or(status.code().unwrap_or(1), |s| 128 + s)
}

/// The signal that killed a process, where the platform has signals.
fn signal(status: ExitStatus) -> Option<i32> {
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        status.signal()
    }
    #[cfg(not(unix))]
    {
        let _ = status;
        None
    }
}

/// A port on `addr` that nothing listens on now (the launcher's choice of
/// `MASTER_PORT` on one node). Rank 0 binds it a moment
/// later; on one node nobody else is expected to take it in between.
pub fn free_port(addr: &str) -> Result<u16> {
    let listener = TcpListener::bind((addr, 0))
        .map_err(|e| io_context(format!("launch: cannot find a free port on {addr}"), e))?;
    Ok(listener.local_addr()?.port())
}

/// `cores / nproc_per_node` kernel threads per rank, unless the user chose
/// (`RAYON_NUM_THREADS` set) .
fn kernel_threads(nproc_per_node: usize) -> Option<String> {
    if std::env::var_os("RAYON_NUM_THREADS").is_some() {
        return None;
    }
    let cores = thread::available_parallelism().map_or(1, |n| n.get());
    Some((cores / nproc_per_node).max(1).to_string())
}

/// On Linux, asks the kernel to kill the rank if the launcher dies, so that a
/// killed launcher leaves no ranks behind.
fn die_with_launcher(command: &mut Command) {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        use std::os::unix::process::CommandExt;
        // SAFETY: the closure runs in the child between fork and exec, where
        // only async-signal-safe calls are allowed; prctl is one, and it
        // touches no memory of the parent.
        unsafe {
            command.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    let _ = command;
}
