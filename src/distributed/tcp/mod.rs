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
//! stops falls silent (no heartbeats) and trips the timeout (a rank sending
//! to it learns the same when it reads nothing for the timeout), as does a live
//! peer that sends nothing for the call, unless it said it is busy
//! ([`ProcessGroup::set_busy`]), e.g. writing a checkpoint; a peer that issues a different collective, or passes a
//! different shape, sends a header this rank does not expect, and the error
//! names both calls.

mod mesh;
mod ring;
mod wire;

use std::cell::{Cell, RefCell};
use std::fmt;
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use candle_core::{DType, Error, Result, Tensor};

use self::mesh::{local_address_towards, Mesh};
use self::ring::{chunks, Contribution, Ring};
use self::wire::{subgroup_tag, Header};
use super::collective::{check_peer, Call};
use super::process_group::members_of_color;
use super::store::StoreServer;
use super::{Collective, CommStats, ProcessGroup, Properties, ReduceOp, Work};
use crate::error::io_context;
use crate::kernels::buffers::{reducible_bytes, Elements};
use crate::timeline;

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
///
/// Its connections belong to a communication thread of its own (the
/// [`Lane`]), which runs the rank's calls one at a time in the order they
/// were issued. A blocking call hands its work over and waits; an `_async`
/// one returns at once with a [`Work`] to wait on, and the ring runs while
/// the caller computes.
pub struct TcpProcessGroup {
    /// This rank's place in the group, and the group's size.
    rank: usize,
    world_size: usize,
    /// The group's ranks as the job numbers them (the mesh's numbers), in order.
    members: Arc<Vec<usize>>,
    /// What the group's messages carry to tell them from other groups' (0: the job).
    tag: u64,
    timeout: Duration,
    /// Shared with the groups split off this one; the last one dropped lets
    /// its thread send what is queued before the sockets close.
    lane: Arc<Lane>,
    /// Kept by the job's rank 0 for as long as the group lives: the others may still be joining.
    _store: Option<StoreServer>,
    /// How many collectives this rank has issued: the number of its next one.
    issued: Cell<u64>,
    /// How many times this rank has split the group: the number of its next split.
    splits: Cell<u64>,
    /// Point-to-point messages sent to and received from each rank so far.
    sent_to: RefCell<Vec<u64>>,
    received_from: RefCell<Vec<u64>>,
    /// Updated by the communication thread as each call completes.
    stats: Arc<Mutex<CommStats>>,
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
        let lane = Arc::new(Lane::start(mesh, rank)?);
        Ok(Self::of_group(rank, (0..world_size).collect(), 0, rv.timeout, lane, store.server))
    }

    /// The handle of the rank at `place` among `members`, a group tagged `tag`.
    fn of_group(
        place: usize,
        members: Vec<usize>,
        tag: u64,
        timeout: Duration,
        lane: Arc<Lane>,
        store: Option<StoreServer>,
    ) -> Self {
        let world_size = members.len();
        Self {
            rank: place,
            world_size,
            members: Arc::new(members),
            tag,
            timeout,
            lane,
            _store: store,
            issued: Cell::new(0),
            splits: Cell::new(0),
            sent_to: RefCell::new(vec![0; world_size]),
            received_from: RefCell::new(vec![0; world_size]),
            stats: Arc::default(),
        }
    }

    /// Issues `call` on `t` (none for a barrier): checks and numbers it here,
    /// then hands the ring a buffer that starts as `start` says on the
    /// communication thread, which counts the call once done. Returns where
    /// the ring's result will arrive.
    fn collective(
        &self,
        call: Call,
        t: Option<&Tensor>,
        start: Start,
        run: impl FnOnce(&mut Ring, Elements) -> Result<Elements> + Send + 'static,
    ) -> Result<Receiver<Result<Elements>>> {
        call.check(t, self.world_size)?;
        let seq = self.issued.replace(self.issued.get() + 1);
        let elements = match (t, start) {
            (Some(t), Start::CopyOfInput) => Elements::of(t)?,
            (Some(t), Start::Zeros) => Elements::zeros(t.dtype(), t.elem_count())?,
            (None, _) => Elements::U8(vec![]),
        };
        let (rank, world_size, header) = (self.rank, self.world_size, Header::collective(self.tag, seq, call, t, 0));
        let (kind, payload, stats) = (call.kind(), call.payload_bytes(t, world_size), Arc::clone(&self.stats));
        let members = Arc::clone(&self.members);
        self.lane.submit(format!("{kind} #{seq}, {payload} bytes"), move |mesh| {
            let mut ring = Ring { mesh, rank, world_size, members: &members, header, sent: 0 };
            let result = if world_size > 1 { run(&mut ring, elements)? } else { elements };
            let mut stats = stats.lock().unwrap_or_else(PoisonError::into_inner);
            stats.record(kind, payload);
            stats.record_wire(kind, ring.sent);
            Ok(result)
        })
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
            overlaps: true,
            // A writer thread per peer takes each message: see `mesh.rs`.
            buffered_sends: true,
        }
    }

    /// Reads the tensor where it lies while this thread waits for the ring,
    /// rather than copying it first as the asynchronous call must (its caller
    /// may change the tensor before the ring reads it): one pass less over
    /// the payload, a sixth of the time at hundreds of megabytes.
    fn all_reduce(&self, t: &Tensor, op: ReduceOp) -> Result<Tensor> {
        let (storage, layout) = t.storage_and_layout();
        let input = reducible_bytes(&storage, layout).filter(|_| self.world_size > 1);
        let Some(input) = input.map(LentBytes::new) else {
            drop(storage);
            return self.all_reduce_async(t, op)?.wait();
        };
        let (len, dtype, n) = (t.elem_count(), t.dtype(), self.world_size);
        let sum = self.collective(Call::AllReduce(op), Some(t), Start::Zeros, move |ring, mut buf| {
            sum_over_ring(ring, &mut buf, Contribution::Lent(input.bytes()), len, dtype)?;
            Ok(buf)
        });
        // Only once the job has run, or was dropped unrun, may the tensor change.
        let sum = sum.and_then(received);
        drop(storage);
        finished(sum?, op, n)?.into_tensor(t.dims(), t.device())
    }

    fn all_reduce_async(&self, t: &Tensor, op: ReduceOp) -> Result<Work> {
        let (len, dtype, n) = (t.elem_count(), t.dtype(), self.world_size);
        let sum = self.collective(Call::AllReduce(op), Some(t), Start::CopyOfInput, move |ring, mut buf| {
            sum_over_ring(ring, &mut buf, Contribution::InBuffer, len, dtype)?;
            Ok(buf)
        })?;
        let (dims, device) = (t.dims().to_vec(), t.device().clone());
        Ok(Work::pending(move || finished(received(sum)?, op, n)?.into_tensor(&dims, &device)))
    }

    fn broadcast(&self, t: &Tensor, root: usize) -> Result<Tensor> {
        let buf = self.collective(Call::Broadcast { root }, Some(t), Start::CopyOfInput, move |ring, mut buf| {
            ring.broadcast(buf.bytes_mut(), root)?;
            Ok(buf)
        })?;
        received(buf)?.into_tensor(t.dims(), t.device())
    }

    fn all_gather(&self, t: &Tensor) -> Result<Tensor> {
        self.all_gather_async(t)?.wait()
    }

    fn all_gather_async(&self, t: &Tensor) -> Result<Work> {
        let (n, dtype, len) = (self.world_size, t.dtype(), t.elem_count());
        let mut dims = t.dims().to_vec();
        match dims.first_mut() {
            Some(rows) => *rows *= n,
            None => dims.push(n), // a scalar gathers as shape [1] per rank
        }
        let buf = self.collective(Call::AllGather, Some(t), Start::CopyOfInput, move |ring, own| {
            let mut all = Elements::zeros(dtype, len * n)?;
            let parts = chunks(own.bytes().len() * n, n, 1);
            all.bytes_mut()[parts[ring.rank].clone()].copy_from_slice(own.bytes());
            ring.all_gather(all.bytes_mut(), &parts)?;
            Ok(all)
        })?;
        let device = t.device().clone();
        Ok(Work::pending(move || received(buf)?.into_tensor(&dims, &device)))
    }

    /// Reads the tensor where it lies, as [`all_reduce`](Self::all_reduce)
    /// does: no copy of the whole input, of which this rank keeps one chunk
    /// (the buffer's other chunks are written only where the ring passes
    /// partial sums through them). At GPT-2's shape under FSDP the root
    /// unit's gradient is 300 MB.
    fn reduce_scatter(&self, t: &Tensor, op: ReduceOp) -> Result<Tensor> {
        let (storage, layout) = t.storage_and_layout();
        let input = reducible_bytes(&storage, layout).filter(|_| self.world_size > 1);
        let Some(input) = input.map(LentBytes::new) else {
            drop(storage);
            return self.reduce_scatter_async(t, op)?.wait();
        };
        let (n, dtype, len) = (self.world_size, t.dtype(), t.elem_count());
        let mine = self.collective(Call::ReduceScatter(op), Some(t), Start::Zeros, move |ring, buf| {
            own_chunk_of(ring, buf, Contribution::Lent(input.bytes()), len, dtype)
        });
        let mine = mine.and_then(received);
        drop(storage);
        finished(mine?, op, n)?.into_tensor(&scattered_dims(t, n), t.device())
    }

    fn reduce_scatter_async(&self, t: &Tensor, op: ReduceOp) -> Result<Work> {
        let (n, dtype, len) = (self.world_size, t.dtype(), t.elem_count());
        let mine = self.collective(Call::ReduceScatter(op), Some(t), Start::CopyOfInput, move |ring, buf| {
            own_chunk_of(ring, buf, Contribution::InBuffer, len, dtype)
        })?;
        let (dims, device) = (scattered_dims(t, n), t.device().clone());
        Ok(Work::pending(move || finished(received(mine)?, op, n)?.into_tensor(&dims, &device)))
    }

    fn barrier(&self) -> Result<()> {
        let done = self.collective(Call::Barrier, None, Start::CopyOfInput, |ring, nothing| {
            ring.barrier()?;
            Ok(nothing)
        })?;
        received(done).map(drop)
    }

    fn send(&self, t: &Tensor, dst: usize) -> Result<()> {
        check_peer(Collective::Send, dst, self.rank, self.world_size)?;
        let elements = Elements::of(t)?;
        let header = Header::point_to_point(self.tag, next(&self.sent_to, dst), t, elements.bytes().len());
        let (stats, to) = (Arc::clone(&self.stats), self.members[dst]);
        let sent = self.lane.submit(format!("send to rank {dst}: {header}"), move |mesh| {
            let bytes = elements.bytes();
            mesh.send(to, &header, bytes)?;
            let mut stats = stats.lock().unwrap_or_else(PoisonError::into_inner);
            stats.record(Collective::Send, bytes.len() as u64);
            stats.record_wire(Collective::Send, bytes.len() as u64);
            Ok(())
        })?;
        received(sent)
    }

    fn recv(&self, like: &Tensor, src: usize) -> Result<Tensor> {
        check_peer(Collective::Recv, src, self.rank, self.world_size)?;
        let (dtype, count) = (like.dtype(), like.elem_count());
        let header =
            Header::point_to_point(self.tag, next(&self.received_from, src), like, count * dtype.size_in_bytes());
        let (stats, from) = (Arc::clone(&self.stats), self.members[src]);
        let buf = self.lane.submit(format!("recv from rank {src}: {header}"), move |mesh| {
            let mut buf = Elements::zeros(dtype, count)?;
            mesh.recv(from, &header, buf.bytes_mut())?;
            stats.lock().unwrap_or_else(PoisonError::into_inner).record(Collective::Recv, buf.bytes().len() as u64);
            Ok(buf)
        })?;
        received(buf)?.into_tensor(like.dims(), like.device())
    }

    /// A subgroup runs on this group's connections and communication
    /// thread, its messages told apart by their tag.
    fn split(&self, color: usize) -> Result<Box<dyn ProcessGroup>> {
        let (places, place) = members_of_color(self, color, &candle_core::Device::Cpu)?;
        let number = self.splits.replace(self.splits.get() + 1);
        let members = places.into_iter().map(|p| self.members[p]).collect();
        let tag = subgroup_tag(self.tag, number, color);
        Ok(Box::new(Self::of_group(place, members, tag, self.timeout, Arc::clone(&self.lane), None)))
    }

    fn set_busy(&self, what: Option<&str>) {
        let what = what.map(str::to_string);
        let label = format!("busy: {}", what.as_deref().unwrap_or("no longer"));
        // Not waited for: it only queues heartbeats.
        let _ = self.lane.submit(label, move |mesh| {
            mesh.set_busy(what.as_deref());
            Ok(())
        });
    }

    fn stats(&self) -> CommStats {
        self.stats.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }
}

/// The communication thread: it owns the rank's connections and runs the
/// work handed to it, one piece at a time, in the order it was handed over.
struct Lane {
    jobs: Option<Sender<Job>>,
    thread: Option<JoinHandle<()>>,
}

type Job = Box<dyn FnOnce(&Mesh) + Send>;

impl Lane {
    fn start(mesh: Mesh, rank: usize) -> Result<Self> {
        let (jobs, queue) = mpsc::channel::<Job>();
        let thread = thread::Builder::new().name(format!("comm-rank-{rank}")).spawn(move || {
            for job in queue {
                job(&mesh);
            }
        })?;
        Ok(Self { jobs: Some(jobs), thread: Some(thread) })
    }

    /// Queues `work`, called `what` on the timeline; its result arrives on
    /// the returned channel.
    fn submit<T: Send + 'static>(
        &self,
        what: String,
        work: impl FnOnce(&Mesh) -> Result<T> + Send + 'static,
    ) -> Result<Receiver<Result<T>>> {
        let (result, receiver) = mpsc::channel();
        let job: Job = Box::new(move |mesh| {
            let _span = timeline::span("comm", what);
            drop(result.send(work(mesh)))
        });
        let stopped = || Error::Msg("the communication thread has stopped".into());
        self.jobs.as_ref().ok_or_else(stopped)?.send(job).map_err(|_| stopped())?;
        Ok(receiver)
    }
}

impl Drop for Lane {
    /// Lets the thread finish what was queued, then closes the connections.
    fn drop(&mut self) {
        self.jobs = None;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// What a collective's buffer holds when the ring starts on it.
#[derive(Clone, Copy)]
enum Start {
    /// The tensor's elements, copied when the call is issued.
    CopyOfInput,
    /// Zeros: the ring reads the tensor's elements from where they lie.
    Zeros,
}

/// Sums this rank's `len` elements of `dtype` (in `buf`, or lent, as `own`
/// says) over the ring into `buf`: reduce-scatter, then all-gather.
fn sum_over_ring(ring: &mut Ring, buf: &mut Elements, own: Contribution, len: usize, dtype: DType) -> Result<()> {
    let parts = chunks(len, ring.world_size, dtype.size_in_bytes());
    ring.reduce_scatter(buf.bytes_mut(), own, &parts, dtype, None)?;
    ring.all_gather(buf.bytes_mut(), &parts)
}

/// This rank's chunk of the sum of every rank's `len` elements of `dtype`
/// (in `buf`, or lent, as `own` says): a reduce-scatter over the ring, whose
/// last step lands in a buffer of the chunk's size, the result itself.
fn own_chunk_of(ring: &mut Ring, mut buf: Elements, own: Contribution, len: usize, dtype: DType) -> Result<Elements> {
    let parts = chunks(len, ring.world_size, dtype.size_in_bytes());
    let mut mine = Elements::zeros(dtype, len / ring.world_size)?;
    ring.reduce_scatter(buf.bytes_mut(), own, &parts, dtype, Some(mine.bytes_mut()))?;
    Ok(mine)
}

/// The sum of `n` ranks' elements as `op` reduces it: an average is divided
/// in the buffer the sum arrived in, not copied into a tensor of its own.
fn finished(mut sum: Elements, op: ReduceOp, n: usize) -> Result<Elements> {
    if op == ReduceOp::Avg {
        sum.scale(1.0 / n as f64)?;
    }
    Ok(sum)
}

/// The shape of a reduce-scatter's result: `t`'s, its first dimension divided by `n`.
fn scattered_dims(t: &Tensor, n: usize) -> Vec<usize> {
    let mut dims = t.dims().to_vec();
    if let Some(rows) = dims.first_mut() {
        *rows /= n; // checked to divide before the call is issued
    }
    dims
}

/// A tensor's bytes lent to the communication thread.
struct LentBytes {
    start: *const u8,
    len: usize,
}

// SAFETY: only `all_reduce` and `reduce_scatter` lend bytes, and each holds the tensor's storage
// (so the bytes stay alive and unchanged) until `received` returns, which is
// once the job holding them has run or been dropped unrun. The ring's writer
// threads read them only within a step, which waits for them.
unsafe impl Send for LentBytes {}

impl LentBytes {
    fn new(bytes: &[u8]) -> Self {
        Self { start: bytes.as_ptr(), len: bytes.len() }
    }

    fn bytes(&self) -> &[u8] {
        // SAFETY: see `Send` above.
        unsafe { std::slice::from_raw_parts(self.start, self.len) }
    }
}

/// Waits for a result from the communication thread.
fn received<T>(receiver: Receiver<Result<T>>) -> Result<T> {
    receiver.recv().map_err(|_| Error::Msg("the communication thread stopped before it answered".into()))?
}

impl fmt::Debug for TcpProcessGroup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TcpProcessGroup(rank {} of {}, timeout {:?})", self.rank, self.world_size, self.timeout)?;
        if self.tag != 0 {
            write!(f, " (the job's ranks {:?})", self.members)?;
        }
        Ok(())
    }
}

/// The number of the next message in `counters[peer]`, counting it.
fn next(counters: &RefCell<Vec<u64>>, peer: usize) -> u64 {
    let mut counters = counters.borrow_mut();
    let seq = counters[peer];
    counters[peer] += 1;
    seq
}
