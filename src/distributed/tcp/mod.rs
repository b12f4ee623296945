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
//! which every rank waiting for it notices at once; a peer whose process
//! stops falls silent (no heartbeats) and trips the timeout, as does a live
//! peer that sends nothing for the call, unless it said it is busy
//! ([`ProcessGroup::set_busy`]), e.g. writing a checkpoint; a peer that issues a different collective, or passes a
//! different shape, sends a header this rank does not expect, and the error
//! names both calls.

mod mesh;
mod ring;
mod wire;

use std::cell::{Cell, RefCell};
use std::fmt;
use std::time::Duration;

use candle_core::{Result, Tensor};

use self::mesh::{local_address_towards, Mesh};
use self::ring::{chunks, Ring};
use self::wire::Header;
use super::collective::{check_peer, Call};
use super::reduce_op::finish;
use super::store::StoreServer;
use super::{Collective, CommStats, ProcessGroup, Properties, ReduceOp};
use crate::error::io_context;
use crate::kernels::buffers::Elements;

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
        let store = rv.join_store()?;
        let master = store.master;
        let host = local_address_towards(master)
            .map_err(|e| io_context(format!("rank {rank} finds no route to the store at {master}"), e))?;
        let mesh = Mesh::connect(&store.client, rank, world_size, host, &rv.token, rv.timeout)?;
        Ok(Self {
            rank,
            world_size,
            mesh,
            _store: store.server,
            issued: Cell::new(0),
            sent_to: RefCell::new(vec![0; world_size]),
            received_from: RefCell::new(vec![0; world_size]),
            stats: RefCell::default(),
        })
    }

    /// Runs `call` on `t` (none for a barrier): checks and counts it, then
    /// hands the ring the tensor's elements and returns what it made of them.
    fn collective(
        &self,
        call: Call,
        t: Option<&Tensor>,
        run: impl FnOnce(&mut Ring, Elements) -> Result<Elements>,
    ) -> Result<Elements> {
        call.check(t, self.world_size)?;
        let seq = self.issued.replace(self.issued.get() + 1);
        let elements = match t {
            Some(t) => Elements::of(t)?,
            None => Elements::U8(vec![]),
        };
        let mut ring = Ring {
            mesh: &self.mesh,
            rank: self.rank,
            world_size: self.world_size,
            header: Header::collective(seq, call, t, 0),
            sent: 0,
        };
        let result = if self.world_size > 1 { run(&mut ring, elements)? } else { elements };
        let mut stats = self.stats.borrow_mut();
        stats.record(call.kind(), call.payload_bytes(t, self.world_size));
        stats.record_wire(call.kind(), ring.sent);
        Ok(result)
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
        let sum = self.collective(Call::AllReduce(op), Some(t), |ring, mut buf| {
            let parts = chunks(t.elem_count(), ring.world_size, dtype.size_in_bytes());
            ring.reduce_scatter(buf.bytes_mut(), &parts, dtype)?;
            ring.all_gather(buf.bytes_mut(), &parts)?;
            Ok(buf)
        })?;
        finish(sum.into_tensor(t.dims(), t.device())?, op, self.world_size)
    }

    fn broadcast(&self, t: &Tensor, root: usize) -> Result<Tensor> {
        let buf = self.collective(Call::Broadcast { root }, Some(t), |ring, mut buf| {
            ring.broadcast(buf.bytes_mut(), root)?;
            Ok(buf)
        })?;
        buf.into_tensor(t.dims(), t.device())
    }

    fn all_gather(&self, t: &Tensor) -> Result<Tensor> {
        let n = self.world_size;
        let mut dims = t.dims().to_vec();
        match dims.first_mut() {
            Some(rows) => *rows *= n,
            None => dims.push(n), // a scalar gathers as shape [1] per rank
        }
        let buf = self.collective(Call::AllGather, Some(t), |ring, own| {
            let mut all = Elements::zeros(t.dtype(), t.elem_count() * n)?;
            let parts = chunks(own.bytes().len() * n, n, 1);
            all.bytes_mut()[parts[ring.rank].clone()].copy_from_slice(own.bytes());
            ring.all_gather(all.bytes_mut(), &parts)?;
            Ok(all)
        })?;
        buf.into_tensor(&dims, t.device())
    }

    fn reduce_scatter(&self, t: &Tensor, op: ReduceOp) -> Result<Tensor> {
        let (n, dtype) = (self.world_size, t.dtype());
        let mut dims = t.dims().to_vec();
        dims[0] /= n; // checked to divide
        let mine = self.collective(Call::ReduceScatter(op), Some(t), |ring, mut buf| {
            let parts = chunks(t.elem_count(), n, dtype.size_in_bytes());
            ring.reduce_scatter(buf.bytes_mut(), &parts, dtype)?;
            let mut mine = Elements::zeros(dtype, t.elem_count() / n)?;
            mine.bytes_mut().copy_from_slice(&buf.bytes()[parts[ring.rank].clone()]);
            Ok(mine)
        })?;
        finish(mine.into_tensor(&dims, t.device())?, op, n)
    }

    fn barrier(&self) -> Result<()> {
        self.collective(Call::Barrier, None, |ring, nothing| {
            ring.barrier()?;
            Ok(nothing)
        })
        .map(drop)
    }

    fn send(&self, t: &Tensor, dst: usize) -> Result<()> {
        check_peer(Collective::Send, dst, self.rank, self.world_size)?;
        let elements = Elements::of(t)?;
        let bytes = elements.bytes();
        let seq = next(&self.sent_to, dst);
        self.mesh.send(dst, &Header::point_to_point(seq, t, bytes.len()), bytes)?;
        let mut stats = self.stats.borrow_mut();
        stats.record(Collective::Send, bytes.len() as u64);
        stats.record_wire(Collective::Send, bytes.len() as u64);
        Ok(())
    }

    fn recv(&self, like: &Tensor, src: usize) -> Result<Tensor> {
        check_peer(Collective::Recv, src, self.rank, self.world_size)?;
        let mut buf = Elements::zeros(like.dtype(), like.elem_count())?;
        let len = buf.bytes().len();
        let seq = next(&self.received_from, src);
        self.mesh.recv(src, &Header::point_to_point(seq, like, len), buf.bytes_mut())?;
        self.stats.borrow_mut().record(Collective::Recv, len as u64);
        buf.into_tensor(like.dims(), like.device())
    }

    fn set_busy(&self, what: Option<&str>) {
        self.mesh.set_busy(what);
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
