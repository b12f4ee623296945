//! `env://` rendezvous: a rank learns who it is and where the others are from
//! its environment, as a program started by `torchrun` does.
//!
//! | variable           | meaning                                             |
//! |--------------------|-----------------------------------------------------|
//! | `RANK`             | this rank, in `0..WORLD_SIZE`                       |
//! | `LOCAL_RANK`       | this rank on its node, in `0..LOCAL_WORLD_SIZE` (picks the GPU) |
//! | `WORLD_SIZE`       | ranks in the job, over all nodes                    |
//! | `LOCAL_WORLD_SIZE` | ranks on this node                                  |
//! | `MASTER_ADDR`      | the host of rank 0, which hosts the store           |
//! | `MASTER_PORT`      | the store's port                                    |
//! | `WORKBOOK_JOB_TOKEN` | a secret shared by the job's ranks (the launcher makes one); required unless `MASTER_ADDR` is loopback |
//! | `WORKBOOK_TIMEOUT_S` | how long a rank waits for another (default 60; for an NCCL collective, 600, as PyTorch's) |
//! | `WORKBOOK_ELASTIC_ROUND` | in an [elastic](super::launch) job, its round: 0, then one more at every restart |
//!
//! A cluster scheduler's script sets the first six from its own variables
//! (Slurm: `SLURM_PROCID`, `SLURM_LOCALID`, `SLURM_NTASKS`, ...) and starts one
//! process per rank; the workbook's [launcher](super::launch) does the same on
//! one or more machines.

use std::env::{self, VarError};
use std::time::Duration;

use candle_core::{bail, Result};

use super::launch::TOKEN_VARIABLE;
use super::store;
use super::tcp::{Rendezvous, TcpProcessGroup};
use super::DEFAULT_TIMEOUT;

/// The variable in which an elastic job's launcher tells its ranks their round.
pub(crate) const ELASTIC_ROUND: &str = "WORKBOOK_ELASTIC_ROUND";

/// The token a rank uses when none is in its environment, allowed only when
/// the job meets on this machine's loopback: a job without a secret accepts
/// any process that knows the address.
const NO_TOKEN: &str = "workbook-no-token";

/// Who this rank is and where its job meets, read from the environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DistEnv {
    pub rank: usize,
    pub local_rank: usize,
    pub world_size: usize,
    pub local_world_size: usize,
    pub master_addr: String,
    pub master_port: u16,
    pub token: String,
    pub timeout: Duration,
    /// Whether `WORKBOOK_TIMEOUT_S` chose `timeout`, rather than the default.
    pub timeout_given: bool,
    /// In an elastic job, how many times its ranks have been started before
    /// this round: from 1 on, the program continues the job.
    pub elastic_round: Option<usize>,
}

impl DistEnv {
    /// The job this process was started in, or `None` when `RANK` is not set
    /// (a plain run: one process, or ranks as threads).
    pub fn from_env() -> Result<Option<Self>> {
        if env::var_os("RANK").is_none() {
            return Ok(None);
        }
        let rank = number("RANK")?;
        let world_size = number("WORLD_SIZE")?;
        if rank >= world_size {
            bail!("RANK {rank} is not below WORLD_SIZE {world_size}: ranks are numbered from 0");
        }
        let local_world_size = optional_number("LOCAL_WORLD_SIZE")?.unwrap_or(world_size);
        let local_rank = optional_number("LOCAL_RANK")?.unwrap_or(rank % local_world_size.max(1));
        let given = optional_number("WORKBOOK_TIMEOUT_S")?;
        let timeout = match given {
            Some(0) => {
                bail!("WORKBOOK_TIMEOUT_S is 0: every wait for another rank would fail at once; give at least 1")
            }
            seconds => seconds.map_or(DEFAULT_TIMEOUT, |s| Duration::from_secs(s as u64)),
        };
        let master_addr = text("MASTER_ADDR")?;
        let token = match env::var(TOKEN_VARIABLE) {
            Ok(token) => token,
            Err(_) if is_loopback(&master_addr) => NO_TOKEN.to_string(),
            Err(_) => bail!(
                "{TOKEN_VARIABLE} is not set, and the job meets at {master_addr}, which other machines can reach: \
                 set it to the same random secret on every rank (the launcher does this for its ranks)"
            ),
        };
        Ok(Some(Self {
            rank,
            local_rank,
            world_size,
            local_world_size,
            master_addr,
            master_port: number("MASTER_PORT")?
                .try_into()
                .ok()
                .filter(|&port| port != 0)
                .ok_or_else(|| candle_core::Error::Msg("MASTER_PORT must be a port number, from 1 to 65535".into()))?,
            token,
            timeout,
            timeout_given: given.is_some(),
            elastic_round: optional_number(ELASTIC_ROUND)?,
        }))
    }

    /// The rendezvous this environment describes.
    pub fn rendezvous(&self) -> Rendezvous {
        Rendezvous {
            rank: self.rank,
            world_size: self.world_size,
            master: store::address(&self.master_addr, self.master_port),
            token: self.token.clone(),
            timeout: self.timeout,
        }
    }

    /// The rendezvous for NCCL's collectives: without `WORKBOOK_TIMEOUT_S`,
    /// a call may wait [`NCCL_DEFAULT_TIMEOUT`] before the watchdog ends the
    /// rank, since a GPU collective also waits out its peers' host work.
    pub fn nccl_rendezvous(&self) -> Rendezvous {
        let timeout = if self.timeout_given { self.timeout } else { NCCL_DEFAULT_TIMEOUT };
        Rendezvous { timeout, ..self.rendezvous() }
    }
}

/// How long an NCCL call may wait when no timeout is given: PyTorch's
/// ProcessGroupNCCL default, ten minutes.
pub const NCCL_DEFAULT_TIMEOUT: Duration = Duration::from_secs(600);

/// Whether `host` names this machine's loopback, which no other machine reaches.
fn is_loopback(host: &str) -> bool {
    host == "localhost" || host.trim_matches(['[', ']']).parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// Joins the job this process was started in (`init_process_group("gloo",
/// init_method="env://")`), or returns `None` when it was not started as a rank.
pub fn init_from_env() -> Result<Option<TcpProcessGroup>> {
    DistEnv::from_env()?.map(|env| TcpProcessGroup::init(&env.rendezvous())).transpose()
}

fn text(name: &str) -> Result<String> {
    match env::var(name) {
        Ok(value) if !value.is_empty() => Ok(value),
        Ok(_) | Err(VarError::NotPresent) => {
            bail!("{name} is not set: a rank needs RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT (the launcher sets them)")
        }
        Err(VarError::NotUnicode(_)) => bail!("{name} is not valid text"),
    }
}

fn number(name: &str) -> Result<usize> {
    let value = text(name)?;
    value.trim().parse().map_err(|_| candle_core::Error::Msg(format!("{name}=`{value}` is not a whole number")))
}

fn optional_number(name: &str) -> Result<Option<usize>> {
    match env::var_os(name) {
        None => Ok(None),
        Some(_) => number(name).map(Some),
    }
}
