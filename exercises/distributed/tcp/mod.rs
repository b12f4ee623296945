//! The process backend: every rank is a process, and the ranks exchange
//! tensors over TCP, as PyTorch's Gloo backend does on CPUs.
//!
//! A rank joins with [`TcpProcessGroup::init`], usually through
//! [`init_from_env`](crate::distributed::init_from_env) in a program started by
//! the [launcher](crate::distributed::launch). Rank 0 hosts the
//! [store](crate::distributed::store) at `MASTER_ADDR:MASTER_PORT`; every rank
//! publishes its address there and connects to every other rank. From then on
//! the store is idle, and collectives run over the direct connections with
//! the ring algorithms (see `ring.rs`): all-reduce as reduce-scatter followed
//! by all-gather, so each rank sends 2(N−1)/N of the buffer whatever N is.
//!
//! Failures end in errors, not hangs: a peer that exits closes its sockets,
//! which every rank waiting for it notices at once; a peer that stalls
//! trips the timeout; a peer that issues a different collective, or passes a
//! different shape, sends a header this rank does not expect, and the error
//! names both calls.

mod mesh;
mod ring;
mod wire;

use std::cell::{Cell, RefCell};
use std::fmt;
use std::net::{SocketAddr, ToSocketAddrs};
use std::time::Duration;

use candle_core::{bail, Error, Result, Tensor};

use self::mesh::{local_address_towards, Mesh};
use self::ring::{chunks, Ring};
use self::wire::Header;
use super::collective::{check_peer, Call};
use super::reduce_op::finish;
use super::store::{StoreClient, StoreServer};
use super::{Collective, CommStats, ProcessGroup, Properties, ReduceOp};
use crate::kernels::buffers::{from_bytes, to_bytes};

/// Where a rank finds the others, and who it is: what the launcher passes in
/// the environment (see [`DistEnv`](crate::distributed::DistEnv)).
#[derive(Debug, Clone)]
pub struct Rendezvous {
    pub rank: usize,
    pub world_size: usize,
    /// `host:port` of the store, hosted by rank 0.
    pub master: String,
    /// A secret shared by the job's ranks; connections without it are refused.
    pub token: String,
    /// The longest a rank waits for another, at start-up and in a collective.
    pub timeout: Duration,
}

/// One rank's handle on a group of processes connected over TCP.
pub struct TcpProcessGroup {
    rank: usize,
    world_size: usize,
    mesh: Mesh,
    /// Kept by rank 0 for as long as the group lives: the others may still be joining.
    _store: Option<StoreServer>,
    /// How many collectives this rank has issued: the number of its next one.
    issued: Cell<u64>,
    /// Point-to-point messages sent to and received from each rank so far.
    sent_to: RefCell<Vec<u64>>,
    received_from: RefCell<Vec<u64>>,
    stats: RefCell<CommStats>,
}

impl TcpProcessGroup {
    /// Joins the job described by `rv`: rank 0 hosts the store, every rank
    /// connects to every other one. Returns once all are connected.
    pub fn init(rv: &Rendezvous) -> Result<Self> {
        let Rendezvous { rank, world_size, .. } = *rv;
        if world_size == 0 || rank >= world_size {
            bail!("rank {rank} is not a rank of a group of {world_size}: check RANK and WORLD_SIZE");
        }
        let master = resolve(&rv.master)?;
        let store = match rank {
            0 => Some(StoreServer::bind(&master.to_string(), &rv.token).map_err(Error::wrap)?),
            _ => None,
        };
        let client = StoreClient::connect(&master.to_string(), &rv.token, rv.timeout).map_err(Error::wrap)?;
        check_world_size(&client, rank, world_size, rv.timeout)?;
        let host = local_address_towards(master).map_err(|e| {
            Error::Msg(format!("rank {rank} finds no route to the store at {master}: {e}"))
        })?;
        let mesh = Mesh::connect(&client, rank, world_size, host, &rv.token, rv.timeout)?;
        Ok(Self {
            rank,
            world_size,
            mesh,
            _store: store,
            issued: Cell::new(0),
            sent_to: RefCell::new(vec![0; world_size]),
            received_from: RefCell::new(vec![0; world_size]),
            stats: RefCell::default(),
        })
    }

    /// Runs `call` on `t` (none for a barrier): checks and counts it, then
    /// hands the ring its buffer.
    fn collective(&self, call: Call, t: Option<&Tensor>, run: impl FnOnce(&mut Ring, &mut Vec<u8>) -> Result<()>) -> Result<Vec<u8>> {
        call.check(t, self.world_size)?;
        let seq = self.issued.replace(self.issued.get() + 1);
        let mut buf = t.map(to_bytes).transpose()?.unwrap_or_default();
        let mut ring = Ring {
            mesh: &self.mesh,
            rank: self.rank,
            world_size: self.world_size,
            header: Header::collective(seq, call, t, 0),
            sent: 0,
        };
        if self.world_size > 1 {
            run(&mut ring, &mut buf)?;
        }
        let mut stats = self.stats.borrow_mut();
        stats.record(call.kind(), call.payload_bytes(t, self.world_size));
        stats.record_wire(call.kind(), ring.sent);
        Ok(buf)
    }
}

impl ProcessGroup for TcpProcessGroup {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.world_size
    }

    fn properties(&self) -> Properties {
        Properties {
            // With two ranks every chunk is a + b, and a + b = b + a exactly.
            rank_order_reduction: self.world_size <= 2,
            detects_dead_peers: true,
        }
    }

    fn all_reduce(&self, t: &Tensor, op: ReduceOp) -> Result<Tensor> {
        let dtype = t.dtype();
        let elem = dtype.size_in_bytes();
        let buf = self.collective(Call::AllReduce(op), Some(t), |ring, buf| {
            let parts = chunks(t.elem_count(), ring.world_size, elem);
            ring.reduce_scatter(buf, &parts, dtype)?;
            ring.all_gather(buf, &parts)
        })?;
        finish(from_bytes(&buf, dtype, t.dims(), t.device())?, op, self.world_size)
    }

    fn broadcast(&self, t: &Tensor, root: usize) -> Result<Tensor> {
        let buf = self.collective(Call::Broadcast { root }, Some(t), |ring, buf| ring.broadcast(buf, root))?;
        from_bytes(&buf, t.dtype(), t.dims(), t.device())
    }

    fn all_gather(&self, t: &Tensor) -> Result<Tensor> {
        let n = self.world_size;
        let mut dims = t.dims().to_vec();
        match dims.first_mut() {
            Some(rows) => *rows *= n,
            None => dims.push(n), // a scalar gathers as shape [1] per rank
        }
        let buf = self.collective(Call::AllGather, Some(t), |ring, buf| {
            let own = std::mem::take(buf);
            let parts = chunks(own.len() * n, n, 1);
            buf.resize(own.len() * n, 0);
            buf[parts[ring.rank].clone()].copy_from_slice(&own);
            ring.all_gather(buf, &parts)
        })?;
        from_bytes(&buf, t.dtype(), &dims, t.device())
    }

    fn reduce_scatter(&self, t: &Tensor, op: ReduceOp) -> Result<Tensor> {
        let (n, dtype) = (self.world_size, t.dtype());
        let buf = self.collective(Call::ReduceScatter(op), Some(t), |ring, buf| {
            let parts = chunks(t.elem_count(), n, dtype.size_in_bytes());
            ring.reduce_scatter(buf, &parts, dtype)?;
            *buf = buf[parts[ring.rank].clone()].to_vec();
            Ok(())
        })?;
        let mut dims = t.dims().to_vec();
        dims[0] /= n; // checked to divide
        finish(from_bytes(&buf, dtype, &dims, t.device())?, op, n)
    }

    fn barrier(&self) -> Result<()> {
        self.collective(Call::Barrier, None, |ring, _| ring.barrier()).map(drop)
    }

    fn send(&self, t: &Tensor, dst: usize) -> Result<()> {
        check_peer(Collective::Send, dst, self.rank, self.world_size)?;
        let bytes = to_bytes(t)?;
        let seq = next(&self.sent_to, dst);
        self.mesh.send(dst, &Header::point_to_point(seq, t, bytes.len()), &bytes)?;
        let mut stats = self.stats.borrow_mut();
        stats.record(Collective::Send, bytes.len() as u64);
        stats.record_wire(Collective::Send, bytes.len() as u64);
        Ok(())
    }

    fn recv(&self, like: &Tensor, src: usize) -> Result<Tensor> {
        check_peer(Collective::Recv, src, self.rank, self.world_size)?;
        let len = like.elem_count() * like.dtype().size_in_bytes();
        let seq = next(&self.received_from, src);
        let mut buf = vec![0u8; len];
        self.mesh.recv(src, &Header::point_to_point(seq, like, len), &mut buf)?;
        self.stats.borrow_mut().record(Collective::Recv, len as u64);
        from_bytes(&buf, like.dtype(), like.dims(), like.device())
    }

    fn stats(&self) -> CommStats {
        self.stats.borrow().clone()
    }
}

impl fmt::Debug for TcpProcessGroup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TcpProcessGroup(rank {} of {}, timeout {:?})", self.rank, self.world_size, self.mesh.timeout())
    }
}

/// The number of the next message in `counters[peer]`, counting it.
fn next(counters: &RefCell<Vec<u64>>, peer: usize) -> u64 {
    let mut counters = counters.borrow_mut();
    let seq = counters[peer];
    counters[peer] += 1;
    seq
}

fn resolve(master: &str) -> Result<SocketAddr> {
    master
        .to_socket_addrs()
        .ok()
        .and_then(|mut addrs| addrs.next())
        .ok_or_else(|| Error::Msg(format!("cannot resolve the store address `{master}`: check MASTER_ADDR and MASTER_PORT")))
}

/// Every rank must have been started with the same WORLD_SIZE.
fn check_world_size(store: &StoreClient, rank: usize, world_size: usize, timeout: Duration) -> Result<()> {
    if rank == 0 {
        store.set("world_size", world_size.to_string().as_bytes()).map_err(Error::wrap)?;
        return Ok(());
    }
    let theirs = store.get("world_size", timeout).map_err(Error::wrap)?;
    let theirs = String::from_utf8_lossy(&theirs);
    if theirs != world_size.to_string() {
        bail!("rank {rank} was started with WORLD_SIZE {world_size}, rank 0 with {theirs}: start every rank of a job with the same world size");
    }
    Ok(())
}
