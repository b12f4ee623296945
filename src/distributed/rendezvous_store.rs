//! How every process backend starts: rank 0 hosts the [store](super::store)
//! at the rendezvous address, every rank connects to it, and each checks that
//! it was started with the same world size as rank 0. What a backend then
//! trades through the store (TCP addresses, an NCCL unique id) is its own.

use std::net::{SocketAddr, ToSocketAddrs};
use std::time::Duration;

use candle_core::{bail, Error, Result};

use super::store::{StoreClient, StoreServer};
use super::Rendezvous;

/// This rank's connection to the job's store.
pub(crate) struct JoinedStore {
    /// The store's address, resolved.
    pub(crate) master: SocketAddr,
    pub(crate) client: StoreClient,
    /// Rank 0's server: the store serves for as long as this is kept.
    pub(crate) server: Option<StoreServer>,
}

impl Rendezvous {
    /// Hosts the store (rank 0) or connects to it (every rank), then checks
    /// the world size. Returns once rank 0 has published its world size.
    pub(crate) fn join_store(&self) -> Result<JoinedStore> {
        let Rendezvous { rank, world_size, .. } = *self;
        if world_size == 0 || rank >= world_size {
            bail!("rank {rank} is not a rank of a group of {world_size}: check RANK and WORLD_SIZE");
        }
        let master = resolve(&self.master)?;
        let server = match rank {
            0 => Some(StoreServer::bind(&master.to_string(), &self.token)?),
            _ => None,
        };
        let client = StoreClient::connect(&master.to_string(), &self.token, self.timeout)?;
        check_world_size(&client, rank, world_size, self.timeout)?;
        Ok(JoinedStore { master, client, server })
    }
}

fn resolve(master: &str) -> Result<SocketAddr> {
    master.to_socket_addrs().ok().and_then(|mut addrs| addrs.next()).ok_or_else(|| {
        Error::Msg(format!("cannot resolve the store address `{master}`: check MASTER_ADDR and MASTER_PORT"))
    })
}

/// Every rank must have been started with the same WORLD_SIZE.
fn check_world_size(store: &StoreClient, rank: usize, world_size: usize, timeout: Duration) -> Result<()> {
    if rank == 0 {
        store.set("world_size", world_size.to_string().as_bytes())?;
        return Ok(());
    }
    let theirs = store.get("world_size", timeout)?;
    let theirs = String::from_utf8_lossy(&theirs);
    if theirs != world_size.to_string() {
        bail!("rank {rank} was started with WORLD_SIZE {world_size}, rank 0 with {theirs}: start every rank of a job with the same world size");
    }
    Ok(())
}
