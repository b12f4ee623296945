//! The GPU backend: every rank is a process driving one GPU, and the ranks
//! exchange tensors through NCCL, as PyTorch's `nccl` backend does.
//!
//! NCCL (the NVIDIA Collective Communications Library) runs each collective
//! as a CUDA kernel on the GPUs themselves: data moves GPU to GPU over
//! NVLink, PCIe or InfiniBand without passing through the CPU, by ring or
//! tree algorithms it picks for the topology. Each [`ProcessGroup`] method is
//! one NCCL call on this rank's communicator, queued on the CUDA stream candle
//! computes on, so a collective runs after the kernels that produced its
//! input and before those that read its result. The host does not wait for
//! it: only [`barrier`](ProcessGroup::barrier) blocks until the GPU is done.
//!
//! **Start-up.** NCCL's ranks find each other through a 128-byte *unique id*
//! that rank 0 creates (`ncclGetUniqueId`) and the others must receive some
//! other way. Here that way is the job's [store](crate::distributed::store),
//! joined as the TCP backend joins it: rank 0 hosts it at
//! `MASTER_ADDR:MASTER_PORT` and publishes the id under `nccl_id`; the others
//! read it, waiting up to the rendezvous timeout. Every rank then calls
//! `ncclCommInitRank`, which returns once all of them have.
//!
//! **One GPU per process.** A communicator cannot hold two ranks on one GPU:
//! rank `r` of a node drives GPU `LOCAL_RANK` of that node, as
//! [`NcclProcessGroup::init_from_env`] arranges.
//!
//! **What tests must allow for.** NCCL adds in the order its algorithm
//! dictates (a ring starts each chunk at a different rank, a tree adds pairs),
//! so a sum is the same on every rank but may differ in the last bits from
//! one process adding in rank order: compare with a tolerance
//! ([`Properties::rank_order_reduction`] is false). A peer that dies is not
//! noticed by NCCL, which has no timeout: with two ranks or more a
//! [watchdog](super::watchdog) watches every queued call through a CUDA
//! event and ends the rank, with a message, when one has not completed
//! within the rendezvous timeout, so the job ends instead of hanging
//! ([`Properties::detects_dead_peers`] stays false: the others learn of it
//! only by their own timeouts). The limit is `WORKBOOK_TIMEOUT_S`, or ten
//! minutes without it, as PyTorch's: a call waits on the GPU for peers that
//! may be busy on the host. A rank busy with long work (a checkpoint write)
//! says so on the job's store ([`BusyBoard`]), which rank 0 keeps serving,
//! and a watchdog about to fire gives a late call another timeout while any
//! rank says it is busy. A send completes only once its receive is posted
//! ([`Properties::buffered_sends`] is false).
//!
//! **Blocking.** The communicator is NCCL's default, blocking kind
//! (`ncclCommInitRank` without a config): a call returns once it is queued,
//! and `ncclInProgress`, which only a non-blocking communicator may answer,
//! is treated as the error it would be here. Every call's status is checked.
//!
//! This file is type-checked in CI against the real candle and cudarc APIs,
//! through a stand-in `nvcc` (`.ci/fake-nvcc/nvcc`). On one GPU (an H100,
//! NCCL 2.28) a group of one rank joined through the store and ran every
//! collective and the barrier (`tests/graded/gpu.rs`); two or more ranks,
//! which need as many GPUs, have not run, and neither have the watchdog,
//! the busy board, [`split`](ProcessGroup::split)'s subgroups and
//! [`send_recv`](ProcessGroup::send_recv)'s grouped calls. The last two are
//! refused where they are called, with two ranks or more, unless the
//! process opts in ([`allow_unverified_nccl`](super::allow_unverified_nccl)).

use std::cell::{Cell, RefCell};
use std::ffi::c_char;
use std::fmt;
use std::time::Duration;

use candle_core::cuda_backend::cudarc::driver::{CudaSlice, CudaView, DeviceRepr, ValidAsZeroBits};
use candle_core::cuda_backend::cudarc::nccl::result::{group_end, group_start, NcclStatus};
use candle_core::cuda_backend::cudarc::nccl::{self, Comm, Id, NcclType};
use candle_core::cuda_backend::{CudaDType, CudaStorageSlice, WrapErr};
use candle_core::op::BackpropOp;
use candle_core::{bail, CudaDevice, CudaStorage, DType, Device, Error, Result, Storage, Tensor};

use std::sync::Arc;

use super::collective::{check_peer, Call};
use super::process_group::members_of_color;
use super::store::StoreServer;
use super::watchdog::Watchdog;
use super::{
    refuse_unverified, BusyBoard, Collective, CommStats, DistEnv, ProcessGroup, Properties, ReduceOp, Rendezvous,
};

/// The store key under which rank 0 publishes NCCL's unique id.
const ID_KEY: &str = "nccl_id";

/// One rank's handle on a group of processes, each driving one GPU, that
/// exchange tensors through NCCL.
///
/// The group may move to another thread (the trait requires `Send`), but
/// mind the stream: a device from [`Device::new_cuda`] queues on CUDA's
/// per-thread default stream, a different stream on each thread, and nothing
/// orders work queued before the move with work queued after it. Synchronize
/// the device before moving the group, or make the device with
/// [`Device::new_cuda_with_stream`], whose one stream serves every thread.
pub struct NcclProcessGroup {
    rank: usize,
    world_size: usize,
    /// This rank's GPU, with the stream that both candle and NCCL queue on.
    device: CudaDevice,
    comm: Comm,
    stats: RefCell<CommStats>,
    /// Ends the rank when a queued call never completes (two ranks or more).
    watchdog: Option<Watchdog>,
    /// Calls queued so far, to name them in the watchdog's message.
    queued: Cell<u64>,
    /// The longest a call may take: the watchdog's limit, a subgroup's too.
    timeout: Duration,
    /// Where the job's ranks say what long work they are busy with; shared
    /// with the watchdog and with subgroups.
    board: Arc<BusyBoard>,
    /// Rank 0's store server, which serves the board as long as any group of
    /// this rank lives.
    _server: Option<Arc<StoreServer>>,
}

// SAFETY: `Comm` holds NCCL's raw communicator pointer, so the compiler
// cannot tell that it may move between threads. NCCL allows it: "it is safe
// to operate a communicator from multiple threads as long as users can
// guarantee only one thread operates the communicator at a time" (NCCL user
// guide, Thread Safety). The group is not `Sync` (the `Comm` and the
// `RefCell` see to that), so although its methods take `&self`, only the one
// thread that owns the group can call them, and never two at once. No NCCL
// group call (ncclGroupStart/End) spans two methods. Each call binds the CUDA
// context to the calling thread first (see `queue`).
unsafe impl Send for NcclProcessGroup {}

impl NcclProcessGroup {
    /// Joins the job described by `rv` with this rank's GPU, `device`: rank 0
    /// hosts the store and creates NCCL's unique id, the others read it, and
    /// every rank builds its communicator on `device`'s stream. Returns once
    /// all ranks have joined. Tensors passed to the collectives must live on
    /// this very device (see [`device`](Self::device)).
    pub fn init(rv: &Rendezvous, device: &CudaDevice) -> Result<Self> {
        let Rendezvous { rank, world_size, .. } = *rv;
        let store = rv.join_store()?;
        let id = if rank == 0 {
            let id = Id::new().map_err(|e| nccl_error("creating NCCL's unique id", e))?;
            store.client.set(ID_KEY, &id_to_bytes(&id))?;
            id
        } else {
            id_from_bytes(&store.client.get(ID_KEY, rv.timeout)?)?
        };
        let stream = device.cuda_stream();
        stream.context().bind_to_thread().w()?;
        let comm = Comm::from_rank(stream, rank, world_size, id)
            .map_err(|e| nccl_error(&format!("rank {rank} joining the NCCL communicator"), e))?;
        let board = Arc::new(BusyBoard::join(store.client, rank, world_size)?);
        Ok(Self::of_comm(comm, device, rv.timeout, board, store.server.map(Arc::new)))
    }

    /// The handle on `comm`, whose calls queue on `device`'s stream and
    /// which a watchdog ends after `timeout` without progress, unless some
    /// rank of the job says on `board` that it is busy.
    fn of_comm(
        comm: Comm,
        device: &CudaDevice,
        timeout: Duration,
        board: Arc<BusyBoard>,
        server: Option<Arc<StoreServer>>,
    ) -> Self {
        let (rank, world_size) = (comm.rank(), comm.world_size());
        let watchdog = (world_size > 1).then(|| {
            let asked = Arc::clone(&board);
            Watchdog::start(timeout, Box::new(move || asked.anyone_busy()), move |why| {
                eprintln!("error: rank {rank}: {why}");
                end_process()
            })
        });
        let (device, stats, queued) = (device.clone(), RefCell::default(), Cell::new(0));
        Self { rank, world_size, device, comm, stats, watchdog, queued, timeout, board, _server: server }
    }

    /// Joins the job this process was started in on GPU `LOCAL_RANK`
    /// (PyTorch: `torch.cuda.set_device(local_rank)` then
    /// `init_process_group("nccl", init_method="env://")`), or returns `None`
    /// when it was not started as a rank. Put the model on
    /// [`device`](Self::device).
    pub fn init_from_env() -> Result<Option<Self>> {
        let Some(env) = DistEnv::from_env()? else {
            return Ok(None);
        };
        let device = Device::new_cuda(env.local_rank)?;
        Self::init(&env.nccl_rendezvous(), device.as_cuda_device()?).map(Some)
    }

    /// This rank's GPU: the device every tensor handed to the group must be on.
    pub fn device(&self) -> Device {
        Device::Cuda(self.device.clone())
    }

    /// Checks and runs a collective on `t`, returning a result of shape
    /// `out_dims`; counts it once it has been queued.
    fn collective(&self, call: Call, t: &Tensor, out_dims: &[usize]) -> Result<Tensor> {
        call.check(Some(t), self.world_size)?;
        let op = match call {
            Call::AllReduce(op) => Op::AllReduce(op),
            Call::Broadcast { root } => Op::Broadcast { root },
            Call::AllGather => Op::AllGather,
            Call::ReduceScatter(op) => Op::ReduceScatter(op),
            Call::Barrier => bail!("barrier: it carries no tensor (a bug in the backend)"),
        };
        let out = self.launch(op, t, Some(out_dims))?;
        let payload = call.payload_bytes(Some(t), self.world_size);
        let mut stats = self.stats.borrow_mut();
        stats.record(call.kind(), payload);
        stats.record_wire(call.kind(), ring_wire_bytes(call, payload, self.rank, self.world_size));
        out.ok_or_else(|| Error::Msg(format!("{call}: NCCL gave no result (a bug in the backend)")))
    }

    /// Queues `op` on `input`'s buffer and returns its result buffer, shaped
    /// `out_dims`, as a tensor (`None` for a send, which has no result); the
    /// watchdog watches it.
    fn launch(&self, op: Op, input: &Tensor, out_dims: Option<&[usize]>) -> Result<Option<Tensor>> {
        // Queued on the stream, the call is ordered before the free of the
        // input's contiguous copy, which may go when this returns.
        let (out, _input) = self.enqueue(op, input, out_dims)?;
        self.watch(op)?;
        Ok(out)
    }

    /// [`launch`](Self::launch), unwatched: inside an NCCL group nothing
    /// runs before the group ends, so the group's caller watches it then.
    /// Returns the result and the flat buffer NCCL reads, which the caller
    /// keeps until the call is queued on the stream.
    fn enqueue(&self, op: Op, input: &Tensor, out_dims: Option<&[usize]>) -> Result<(Option<Tensor>, Tensor)> {
        if !input.device().same_device(&self.device()) {
            bail!(
                "{op}: the tensor is on {:?}, not on this rank's NCCL device {:?}; move it with `to_device(&pg.device())` \
                 (a device made separately for the same GPU counts as another one: candle ties each to its own stream)",
                input.device().location(),
                self.device().location(),
            );
        }
        // NCCL reads one flat buffer: the input's elements, in order.
        let input = input.contiguous()?;
        let out = {
            let (storage, layout) = input.storage_and_layout();
            let (Storage::Cuda(storage), Some((start, end))) = (&*storage, layout.contiguous_offsets()) else {
                bail!("{op}: a contiguous CUDA tensor was expected here (a bug in the backend)");
            };
            match &storage.slice {
                CudaStorageSlice::F32(s) => self.queue(op, &s.slice(start..end), out_dims)?,
                CudaStorageSlice::BF16(s) => self.queue(op, &s.slice(start..end), out_dims)?,
                CudaStorageSlice::F16(s) => self.queue(op, &s.slice(start..end), out_dims)?,
                _ => bail!(
                    "{op}: the NCCL backend carries f32, bf16 or f16 tensors, got {}: convert it first",
                    input.dtype().as_str()
                ),
            }
        };
        Ok((out, input))
    }

    /// [`launch`](Self::launch) once the input is a flat buffer of `T`s.
    fn queue<T>(&self, op: Op, src: &CudaView<'_, T>, out_dims: Option<&[usize]>) -> Result<Option<Tensor>>
    where
        T: NcclType + CudaDType + DeviceRepr + ValidAsZeroBits,
    {
        // Zeroed rather than left uninitialised: the memset costs little next
        // to the collective, and no path can hand back undefined memory.
        let mut out: Option<CudaSlice<T>> =
            out_dims.map(|dims| self.device.alloc_zeros::<T>(dims.iter().product())).transpose()?;
        // The group may have moved to another thread since the last call.
        self.device.cuda_stream().context().bind_to_thread().w()?;
        let comm = &self.comm;
        let queued = match (op, out.as_mut()) {
            (Op::AllReduce(reduce), Some(out)) => comm.all_reduce(src, out, &nccl_op(reduce)),
            // Only the root's `src` is read; NCCL ignores it on the others.
            (Op::Broadcast { root }, Some(out)) => comm.broadcast(Some(src), out, peer(root)),
            (Op::AllGather, Some(out)) => comm.all_gather(src, out),
            (Op::ReduceScatter(reduce), Some(out)) => comm.reduce_scatter(src, out, &nccl_op(reduce)),
            (Op::Send { dst }, None) => comm.send(src, peer(dst)).map(|()| NcclStatus::Success),
            // Only `like`'s shape and dtype matter: its data is not sent.
            (Op::Recv { src: from }, Some(out)) => comm.recv(out, peer(from)),
            _ => bail!("{op}: a result buffer where none belongs, or none where one does (a bug in the backend)"),
        };
        match queued.map_err(|e| nccl_error(&op.to_string(), e))? {
            NcclStatus::Success => {}
            NcclStatus::InProgress => bail!(
                "{op}: NCCL answered ncclInProgress, which only a non-blocking communicator may; this one is \
                 blocking, so the call's state is unknown (a bug in the backend)"
            ),
            NcclStatus::NumResults => bail!("{op}: NCCL answered ncclNumResults, which is no status (a bug in NCCL)"),
        }
        Ok(out.zip(out_dims).map(|(slice, dims)| {
            let storage = Storage::Cuda(CudaStorage::wrap_cuda_slice(slice, self.device.clone()));
            Tensor::from_storage(storage, dims, BackpropOp::none(), false)
        }))
    }

    /// Hands the call just queued to the watchdog, through an event recorded
    /// after it on the stream: the event completes when the call has.
    fn watch(&self, op: Op) -> Result<()> {
        let Some(watchdog) = &self.watchdog else { return Ok(()) };
        let number = self.queued.replace(self.queued.get() + 1);
        let event = self.device.cuda_stream().record_event(None).w()?;
        watchdog.watch(
            format!("NCCL call #{number} ({op})"),
            Box::new(move || {
                event.context().bind_to_thread().map_err(|e| format!("{e:?}"))?;
                event.try_is_complete().map_err(|e| format!("{e:?}"))
            }),
        );
        Ok(())
    }
}

impl ProcessGroup for NcclProcessGroup {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.world_size
    }

    fn properties(&self) -> Properties {
        Properties { rank_order_reduction: false, detects_dead_peers: false, overlaps: false, buffered_sends: false }
    }

    fn all_reduce(&self, t: &Tensor, op: ReduceOp) -> Result<Tensor> {
        self.collective(Call::AllReduce(op), t, t.dims())
    }

    fn broadcast(&self, t: &Tensor, root: usize) -> Result<Tensor> {
        self.collective(Call::Broadcast { root }, t, t.dims())
    }

    fn all_gather(&self, t: &Tensor) -> Result<Tensor> {
        let mut dims = t.dims().to_vec();
        match dims.first_mut() {
            Some(rows) => *rows *= self.world_size,
            None => dims.push(self.world_size), // a scalar gathers as shape [1] per rank
        }
        self.collective(Call::AllGather, t, &dims)
    }

    fn reduce_scatter(&self, t: &Tensor, op: ReduceOp) -> Result<Tensor> {
        let mut dims = t.dims().to_vec();
        if let Some(rows) = dims.first_mut() {
            *rows /= self.world_size; // `Call::check` rejects what does not divide
        }
        self.collective(Call::ReduceScatter(op), t, &dims)
    }

    /// NCCL has no barrier of its own: a one-element all-reduce returns only
    /// once every rank has contributed, and waiting for the stream makes the
    /// host wait for it too.
    fn barrier(&self) -> Result<()> {
        let token = Tensor::zeros(1, DType::F32, &self.device())?;
        self.launch(Op::AllReduce(ReduceOp::Sum), &token, Some(&[1]))?;
        self.device.cuda_stream().synchronize().w()?;
        self.stats.borrow_mut().record(Collective::Barrier, 0);
        Ok(())
    }

    /// Queues an `ncclSend`. Unlike the other backends, NCCL does not buffer
    /// a message: the send completes on the GPU only once `dst` has posted
    /// the matching [`recv`](ProcessGroup::recv), so two ranks that both send
    /// to each other before receiving may deadlock. Order the calls so that
    /// every send meets its receive (e.g. even ranks send first).
    fn send(&self, t: &Tensor, dst: usize) -> Result<()> {
        check_peer(Collective::Send, dst, self.rank, self.world_size)?;
        self.launch(Op::Send { dst }, t, None)?;
        let bytes = bytes_of(t);
        let mut stats = self.stats.borrow_mut();
        stats.record(Collective::Send, bytes);
        stats.record_wire(Collective::Send, bytes);
        Ok(())
    }

    fn recv(&self, like: &Tensor, src: usize) -> Result<Tensor> {
        check_peer(Collective::Recv, src, self.rank, self.world_size)?;
        let out = self.launch(Op::Recv { src }, like, Some(like.dims()))?;
        self.stats.borrow_mut().record(Collective::Recv, bytes_of(like));
        out.ok_or_else(|| Error::Msg("recv: NCCL gave no result (a bug in the backend)".into()))
    }

    /// A new communicator of the members, as PyTorch's `new_group` makes
    /// one: the first member creates a unique id and the group's all-gather
    /// carries it to the others (`ncclCommSplit` would need a newer cudarc
    /// than candle's; the result is the same).
    fn split(&self, color: usize) -> Result<Box<dyn ProcessGroup>> {
        if self.world_size > 1 {
            refuse_unverified("a subgroup's communicator (split: a mesh's groups, HYBRID_SHARD's shard groups)")?;
        }
        let (members, place) = members_of_color(self, color, &self.device())?;
        let id_bytes = match place {
            0 => id_to_bytes(&Id::new().map_err(|e| nccl_error("creating a subgroup's NCCL id", e))?),
            _ => vec![0; ID_BYTES],
        };
        let mine = Tensor::new(id_bytes.iter().map(|&b| b as f32).collect::<Vec<_>>(), &self.device())?;
        let ids = self.all_gather(&mine)?.reshape((self.world_size, ID_BYTES))?;
        let theirs: Vec<u8> = ids.get(members[0])?.to_vec1::<f32>()?.into_iter().map(|b| b as u8).collect();
        let stream = self.device.cuda_stream();
        stream.context().bind_to_thread().w()?;
        let comm = Comm::from_rank(stream, place, members.len(), id_from_bytes(&theirs)?)
            .map_err(|e| nccl_error(&format!("rank {} joining a subgroup of ranks {members:?}", self.rank), e))?;
        let server = self._server.clone();
        Ok(Box::new(Self::of_comm(comm, &self.device, self.timeout, Arc::clone(&self.board), server)))
    }

    /// The send and the receive queued as one NCCL group, so that neither
    /// waits for the other: a ring of them cannot deadlock.
    fn send_recv(&self, t: &Tensor, dst: usize, like: &Tensor, src: usize) -> Result<Tensor> {
        check_peer(Collective::Send, dst, self.rank, self.world_size)?;
        check_peer(Collective::Recv, src, self.rank, self.world_size)?;
        if self.world_size > 1 {
            refuse_unverified("send_recv's grouped send and receive (exercise 16's ring, the pipelines' exchanges)")?;
        }
        let mut group = Group::start()?;
        let received = group
            .enqueue(self, Op::Send { dst }, t, None)
            .and_then(|_| group.enqueue(self, Op::Recv { src }, like, Some(like.dims())));
        // The group is ended whatever happened inside it, or NCCL stays in it.
        let ended = group.end();
        let received = received?;
        ended?;
        self.watch(Op::Recv { src })?;
        let (sent_bytes, received_bytes) = (bytes_of(t), bytes_of(like));
        let mut stats = self.stats.borrow_mut();
        stats.record(Collective::Send, sent_bytes);
        stats.record_wire(Collective::Send, sent_bytes);
        stats.record(Collective::Recv, received_bytes);
        drop(stats);
        received.ok_or_else(|| Error::Msg("send_recv: NCCL gave no result (a bug in the backend)".into()))
    }

    /// Says it on the job's store, where every rank's watchdog reads it
    /// before it would end a rank for a late call.
    fn set_busy(&self, what: Option<&str>) {
        if let Err(e) = self.board.say(what) {
            eprintln!("warning: rank {}: could not say on the store that it is busy: {e}", self.rank);
        }
    }

    fn stats(&self) -> CommStats {
        self.stats.borrow().clone()
    }
}

/// An NCCL group (`ncclGroupStart` … `ncclGroupEnd`). The calls queued in it
/// reach the stream only when it ends, so the buffers they read are kept
/// here until then: a contiguous copy freed earlier would be freed on the
/// stream before the calls that read it, and its memory could be handed to
/// the next allocation (the receive's buffer) while a send still reads it.
struct Group {
    kept: Vec<Tensor>,
    ended: bool,
}

impl Group {
    fn start() -> Result<Self> {
        group_start().map_err(|e| nccl_error("ncclGroupStart", e))?;
        Ok(Self { kept: vec![], ended: false })
    }

    /// Queues `op` in the group; its input stays alive until the group ends.
    fn enqueue(
        &mut self,
        pg: &NcclProcessGroup,
        op: Op,
        input: &Tensor,
        out_dims: Option<&[usize]>,
    ) -> Result<Option<Tensor>> {
        let (out, read) = pg.enqueue(op, input, out_dims)?;
        self.kept.push(read);
        Ok(out)
    }

    /// Ends the group, queuing its calls; then its buffers may go.
    fn end(mut self) -> Result<()> {
        self.ended = true;
        group_end().map_err(|e| nccl_error("ncclGroupEnd", e))?;
        Ok(())
    }
}

impl Drop for Group {
    /// A group left without `end` (a panic) is still ended, before its
    /// buffers are dropped: NCCL would otherwise stay in it.
    fn drop(&mut self) {
        if !self.ended {
            let _ = group_end();
        }
    }
}

/// A tensor's payload in bytes.
fn bytes_of(t: &Tensor) -> u64 {
    (t.elem_count() * t.dtype().size_in_bytes()) as u64
}

impl fmt::Debug for NcclProcessGroup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "NcclProcessGroup(rank {} of {}, {:?})", self.rank, self.world_size, self.device().location())
    }
}

/// One NCCL call, as [`NcclProcessGroup::launch`] issues it.
#[derive(Debug, Clone, Copy)]
enum Op {
    AllReduce(ReduceOp),
    Broadcast { root: usize },
    AllGather,
    ReduceScatter(ReduceOp),
    Send { dst: usize },
    Recv { src: usize },
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Op::AllReduce(_) => "all_reduce",
            Op::Broadcast { .. } => "broadcast",
            Op::AllGather => "all_gather",
            Op::ReduceScatter(_) => "reduce_scatter",
            Op::Send { .. } => "send",
            Op::Recv { .. } => "recv",
        })
    }
}

/// NCCL's name for a reduction. `Avg` is NCCL's own `ncclAvg` (NCCL 2.10+),
/// which divides as it finishes the sum: no second kernel.
fn nccl_op(op: ReduceOp) -> nccl::ReduceOp {
    match op {
        ReduceOp::Sum => nccl::ReduceOp::Sum,
        ReduceOp::Avg => nccl::ReduceOp::Avg,
    }
}

/// A rank as NCCL numbers it. Ranks were checked to be below the world size,
/// which NCCL itself holds in an `int`.
fn peer(rank: usize) -> i32 {
    rank as i32
}

/// The bytes this rank sends in `call` if NCCL runs its ring algorithm over
/// the ranks in rank order, which is what the TCP backend's rings send too,
/// so the two backends' wire counts compare. (NCCL may pick a tree, or a
/// different ring order, for the topology; the payload bytes, which the cost
/// models use, do not depend on it.)
fn ring_wire_bytes(call: Call, payload: u64, rank: usize, world_size: usize) -> u64 {
    let n = world_size as u64;
    match call {
        // A reduce-scatter, then an all-gather: (N−1)/N of the buffer each.
        Call::AllReduce(_) => 2 * (n - 1) * payload / n,
        // The payload is the whole output for an all-gather and the whole
        // input for a reduce-scatter; each rank forwards N−1 of its N chunks.
        Call::AllGather | Call::ReduceScatter(_) => (n - 1) * payload / n,
        // Passed along the ring from the root: all but the last rank forward it.
        Call::Broadcast { root } if (rank + 1) % world_size == root => 0,
        Call::Broadcast { .. } => payload,
        Call::Barrier => 0,
    }
}

/// The length of NCCL's unique id.
const ID_BYTES: usize = 128;

/// The id's 128 bytes, as the store carries them.
fn id_to_bytes(id: &Id) -> Vec<u8> {
    id.internal().iter().map(|&c| c as u8).collect()
}

/// The id rank 0 published, rebuilt from its bytes.
fn id_from_bytes(bytes: &[u8]) -> Result<Id> {
    let mut internal = [0 as c_char; ID_BYTES];
    if bytes.len() != internal.len() {
        bail!(
            "the NCCL id in the store has {} bytes, not {}: is rank 0 running the NCCL backend too?",
            bytes.len(),
            internal.len()
        );
    }
    for (to, &from) in internal.iter_mut().zip(bytes) {
        *to = from as c_char;
    }
    Ok(Id::uninit(internal))
}

/// Ends this process at once: a rank whose collective never completes cannot
/// unwind (its CUDA stream would wait forever in teardown), and the launcher
/// then stops the job.
fn end_process() -> ! {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: `_exit` ends the process without running exit handlers, which
    // is the point; it touches no memory of ours.
    unsafe {
        libc::_exit(1)
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    std::process::abort()
}

/// An NCCL failure as a candle error that says where it happened.
fn nccl_error(what: &str, e: nccl::result::NcclError) -> Error {
    Error::Msg(format!("{what}: NCCL failed with {:?}; run with NCCL_DEBUG=INFO to see why", e.0))
}
