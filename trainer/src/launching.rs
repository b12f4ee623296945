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
    /// Machines in the job; start one launcher per machine.
    #[arg(long, default_value_t = 1)]
    pub nnodes: usize,
    /// This machine's number, in 0..nnodes.
    #[arg(long, default_value_t = 0)]
    pub node_rank: usize,
    /// Node 0's address, as every node reaches it.
    #[arg(long, default_value = "127.0.0.1")]
    pub master_addr: String,
    /// The port of the store rank 0 hosts (default: a free one; required with --nnodes > 1).
    #[arg(long)]
    pub master_port: Option<u16>,
    /// Seconds a rank waits for another before the job fails (default 60).
    #[arg(long)]
    pub timeout: Option<u64>,
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
            nnodes: self.nnodes,
            node_rank: self.node_rank,
            master_addr: self.master_addr.clone(),
            master_port: self.master_port,
            timeout_s: self.timeout,
        }
    }

    /// Ranks in the whole job.
    pub fn world_size(&self) -> usize {
        self.nproc_per_node * self.nnodes
    }

    /// Whether this process should start ranks of `kind` as processes rather
    /// than be one (or run them as threads).
    pub fn starts_processes(&self, kind: RankKind) -> Result<bool> {
        let is_rank = DistEnv::from_env()?.is_some();
        Ok(!is_rank && self.world_size() > 1 && kind == RankKind::Processes)
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
