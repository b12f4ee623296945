//! How a program becomes a multi-process job: the launcher's flags, shared by
//! `train` and `launch`, and the step where `train --nproc N` starts itself
//! again as N ranks.

use std::ffi::OsString;

use anyhow::Result;
use clap::ValueEnum;
use workbook::distributed::{launch, relaunch_self, DistEnv, LaunchConfig};

/// torchrun's flags.
#[derive(clap::Args, Debug, Clone)]
pub struct LaunchArgs {
    /// Ranks on this machine.
    #[arg(long = "nproc-per-node", visible_alias = "nproc", default_value_t = 1)]
    pub nproc_per_node: usize,
    /// Machines in the job, or MIN:MAX for an elastic job that goes on with as
    /// few as MIN; start one launcher per machine.
    #[arg(long, value_name = "N|MIN:MAX", default_value = "1", value_parser = node_range)]
    pub nnodes: NodeRange,
    /// This machine's number, in 0..nnodes (in an elastic job, 0 marks the
    /// machine that hosts the rendezvous; the others are numbered as they join).
    #[arg(long, default_value_t = 0)]
    pub node_rank: usize,
    /// Node 0's address, as every node reaches it.
    #[arg(long, default_value = "127.0.0.1")]
    pub master_addr: String,
    /// The port of the store rank 0 hosts (default: a free one; required with --nnodes > 1).
    #[arg(long, value_parser = port)]
    pub master_port: Option<u16>,
    /// Seconds a rank waits for another before the job fails (default 60).
    #[arg(long, value_parser = seconds)]
    pub timeout: Option<u64>,
    /// When a rank fails, start every rank again, up to this many times; the
    /// job continues from its newest checkpoint (torchrun's --max-restarts).
    #[arg(long, value_name = "K", default_value_t = 0)]
    pub max_restarts: usize,
    /// With --nnodes MIN:MAX: seconds the rendezvous waits for more machines
    /// once MIN have joined.
    #[arg(long, value_name = "SECONDS", default_value_t = 10)]
    pub last_call: u64,
    /// A file with the job's secret, for a job that spans machines (or set
    /// WORKBOOK_JOB_TOKEN on every node): node 0 writes a fresh one there,
    /// readable only by you, if the file does not exist; give the other
    /// nodes the same file.
    #[arg(long, value_name = "PATH")]
    pub token_file: Option<std::path::PathBuf>,
}

/// How many machines a job runs on: `min == max` unless it is elastic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeRange {
    pub min: usize,
    pub max: usize,
}

/// `N` or `MIN:MAX`, as torchrun's `--nnodes` takes it.
fn node_range(text: &str) -> Result<NodeRange, String> {
    let number = |part: &str| match part.trim().parse::<usize>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(format!("`{part}` is not a number of machines (1 or more)")),
    };
    let (min, max) = match text.split_once(':') {
        Some((min, max)) => (number(min)?, number(max)?),
        None => (number(text)?, number(text)?),
    };
    if min > max {
        return Err(format!("{min}:{max} asks for more machines at least ({min}) than at most ({max})"));
    }
    Ok(NodeRange { min, max })
}

/// A port other machines can reach: 0 would make every node pick its own.
fn port(text: &str) -> Result<u16, String> {
    match text.trim().parse::<u16>() {
        Ok(0) => Err("0 is not a port the other nodes can reach: give the port node 0's store listens on \
                      (1 to 65535), or leave --master-port out on one machine to pick a free one"
            .into()),
        Ok(port) => Ok(port),
        Err(_) => Err(format!("`{text}` is not a port number (1 to 65535)")),
    }
}

/// A wait of at least a second: with 0, every wait would fail at once.
fn seconds(text: &str) -> Result<u64, String> {
    match text.trim().parse::<u64>() {
        Ok(0) => Err("0 seconds would fail every wait for another rank at once: give at least 1".into()),
        Ok(seconds) => Ok(seconds),
        Err(_) => Err(format!("`{text}` is not a whole number of seconds")),
    }
}

/// What a rank is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum RankKind {
    /// One process per rank, over TCP, as on a cluster.
    Processes,
    /// Threads of one process: quicker to start, for small runs and tests.
    Threads,
}

impl LaunchArgs {
    pub fn config(&self) -> LaunchConfig {
        LaunchConfig {
            nproc_per_node: self.nproc_per_node,
            nnodes: self.nnodes.max,
            min_nnodes: self.nnodes.min,
            node_rank: self.node_rank,
            master_addr: self.master_addr.clone(),
            master_port: self.master_port,
            timeout_s: self.timeout,
            max_restarts: self.max_restarts,
            last_call: std::time::Duration::from_secs(self.last_call),
            token_file: self.token_file.clone(),
        }
    }

    /// Ranks in the whole job (the most, in an elastic job).
    pub fn world_size(&self) -> usize {
        self.nproc_per_node * self.nnodes.max
    }

    /// Every world size the job may run at: one, unless it is elastic.
    pub fn world_sizes(&self) -> impl Iterator<Item = usize> + '_ {
        (self.nnodes.min..=self.nnodes.max).map(|nodes| nodes * self.nproc_per_node)
    }

    /// Whether this process should start ranks of `kind` as processes rather
    /// than be one (or run them as threads): for a job of several ranks, or
    /// one a launcher restarts.
    pub fn starts_processes(&self, kind: RankKind) -> Result<bool> {
        let is_rank = DistEnv::from_env()?.is_some();
        Ok(!is_rank && (self.world_size() > 1 || self.config().is_elastic()) && kind == RankKind::Processes)
    }

    /// Starts `program args` as this node's ranks; returns the job's exit code.
    pub fn launch(&self, program: &std::path::Path, args: &[OsString]) -> Result<i32> {
        Ok(launch(&self.config(), program, args)?)
    }

    /// Starts this very program again, with the same arguments, as the ranks.
    pub fn relaunch_self(&self) -> Result<i32> {
        Ok(relaunch_self(&self.config())?)
    }
}
