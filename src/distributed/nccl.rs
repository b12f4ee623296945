//! The GPU backend: every rank is a process driving one GPU, and the ranks
//! exchange tensors through NCCL, as PyTorch's `nccl` backend does.
//!
//! NCCL (the NVIDIA Collective Communications Library) runs each collective
//! as a CUDA kernel on the GPUs themselves: data moves GPU to GPU over
//! NVLink, PCIe or InfiniBand without passing through the CPU, by ring or
//! tree algorithms it picks for the topology. Each [`ProcessGroup`] method is
//! one NCCL call on this rank's communicator. The host does not wait for it:
//! only [`barrier`](ProcessGroup::barrier) blocks until the GPU is done.
//!
//! **Two streams.** The calls run on a communication stream of their own,
//! beside the compute stream candle queues its kernels on (one per device,
//! from [`crate::gpu::open`]), as PyTorch's ProcessGroupNCCL runs them. Before
//! each call the communication stream waits for an event recorded on the
//! compute stream, so the call reads its input only after the kernels that
//! produced it; after it, an event on the communication stream marks the
//! call done, and the compute stream waits for that event before anything
//! reads the result or frees a buffer the call uses (the buffers are kept
//! until then: a free on the compute stream would otherwise let the next
//! allocation reuse memory that NCCL still reads). A blocking method queues
//! that wait at once; an `_async` one queues it in [`Work::wait`], so the
//! kernels queued meanwhile run while the call moves data: DDP's buckets
//! during backward, FSDP's prefetched gathers during the unit before.
//! cudarc's automatic per-buffer tracking is off ([`crate::gpu::open`] says
//! why), so these events are the whole ordering. Subgroups share their
//! parent's communication stream: their calls then run in the one order the
//! ranks issue them, which is what keeps two ranks sharing two groups from
//! waiting for each other crosswise.
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
//! rank says it is busy. [`barrier`](ProcessGroup::barrier), which the
//! trainer calls after rank 0 saves, is no NCCL call but a wait on the same
//! store, held past the timeout likewise. A send completes only once its
//! receive is posted ([`Properties::buffered_sends`] is false).
//!
//! **Blocking.** The communicator is NCCL's default, blocking kind
//! (`ncclCommInitRank` without a config): a call returns once it is queued,
//! and `ncclInProgress`, which only a non-blocking communicator may answer,
//! is treated as the error it would be here. Every call's status is checked.
//!
//! This file is type-checked in CI against the real candle and cudarc APIs,
//! through a stand-in `nvcc` (`.ci/fake-nvcc/nvcc`). On one GPU (an H100 and
//! an H200, NCCL 2.28) a group of one rank joined through the store and ran
//! every collective and the barrier (then an all-reduce; the store barrier
//! has not run on a GPU), and on the H200 its calls on their own
//! stream, `_async` ones among them, waited for inputs still being written
//! and kept the inputs their callers had dropped (`tests/graded/gpu.rs`),
//! under `--ddp-overlap` and FSDP's `--prefetch` too; two or more ranks,
//! which need as many GPUs, have not run, and neither have the watchdog,
//! the busy board, the barrier's wait for other ranks,
//! [`split`](ProcessGroup::split)'s subgroups and
//! [`send_recv`](ProcessGroup::send_recv)'s grouped calls. The last two are
//! refused where they are called, with two ranks or more, unless the
//! process opts in ([`allow_unverified_nccl`](super::allow_unverified_nccl)).

use std::cell::{Cell, RefCell};
use std::ffi::c_char;
use std::fmt;
use std::time::Duration;

use candle_core::cuda_backend::cudarc::driver::{
    CudaEvent, CudaSlice, CudaStream, CudaView, DeviceRepr, ValidAsZeroBits,
};
use candle_core::cuda_backend::cudarc::nccl::result::{group_end, group_start, NcclStatus};
use candle_core::cuda_backend::cudarc::nccl::{self, Comm, Id, NcclType};
use candle_core::cuda_backend::{CudaDType, CudaStorageSlice, WrapErr};
use candle_core::op::BackpropOp;
use candle_core::{bail, CudaDevice, CudaStorage, Device, Error, Result, Storage, Tensor};

use std::sync::Arc;

use super::collective::{check_peer, Call};
use super::process_group::members_of_color;
use super::store::StoreServer;
use super::watchdog::Watchdog;
use super::{
    refuse_unverified, BusyBoard, Collective, CommStats, DistEnv, ProcessGroup, Properties, ReduceOp, Rendezvous, Work,
};

/// The store key under which rank 0 publishes NCCL's unique id.
const ID_KEY: &str = "nccl_id";

/// One rank's handle on a group of processes, each driving one GPU, that
/// exchange tensors through NCCL.
///
/// The group may move to another thread (the trait requires `Send`): both
/// its streams are explicit, so they stay the same whichever thread calls.
/// Give it a device from [`crate::gpu::open`]: one from [`Device::new_cuda`]
/// queues on CUDA's per-thread default stream, a different stream on each
/// thread, and the compute side of the ordering would then follow the
/// calling thread.
pub struct NcclProcessGroup {
    rank: usize,
    world_size: usize,
    /// This rank's GPU, with the compute stream candle queues on.
    device: CudaDevice,
    /// The stream NCCL's calls run on (the communicator is bound to it).
    comm_stream: Arc<CudaStream>,
    comm: Comm,
    stats: RefCell<CommStats>,
    /// Ends the rank when a queued call never completes (two ranks or more).
    watchdog: Option<Watchdog>,
    /// Calls queued so far, to name them in the watchdog's message.
    queued: Cell<u64>,
    /// Which group of the job this is, the same on each of its ranks: its
    /// barriers' names on the store start with it.
    key: String,
    /// Barriers and splits so far, to name the next of each.
    barriers: Cell<u64>,
    splits: Cell<u64>,
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
// context to the calling thread first (see `queue`), and queues on the
// group's two streams, which do not depend on the thread.
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
        let compute = device.cuda_stream();
        compute.context().bind_to_thread().w()?;
        // A stream that starts out waiting for everything queued so far.
        let comm_stream = compute.fork().w()?;
        let comm = Comm::from_rank(Arc::clone(&comm_stream), rank, world_size, id)
            .map_err(|e| nccl_error(&format!("rank {rank} joining the NCCL communicator"), e))?;
        let board = Arc::new(BusyBoard::join(store.client, rank, world_size)?);
        let key = "job".to_string();
        Ok(Self::of_comm(comm, comm_stream, device, key, rv.timeout, board, store.server.map(Arc::new)))
    }

    /// The handle on `comm`, whose calls queue on `comm_stream`, ordered
    /// with `device`'s compute stream, and which a watchdog ends after
    /// `timeout` without progress, unless some rank of the job says on
    /// `board` that it is busy.
    fn of_comm(
        comm: Comm,
        comm_stream: Arc<CudaStream>,
        device: &CudaDevice,
        key: String,
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
        let (barriers, splits) = (Cell::new(0), Cell::new(0));
        Self {
            rank,
            world_size,
            device,
            comm_stream,
            comm,
            stats,
            watchdog,
            queued,
            key,
            barriers,
            splits,
            timeout,
            board,
            _server: server,
        }
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
        let device = crate::gpu::open(env.local_rank)?;
        Self::init(&env.nccl_rendezvous(), device.as_cuda_device()?).map(Some)
    }

    /// This rank's GPU: the device every tensor handed to the group must be on.
    pub fn device(&self) -> Device {
        Device::Cuda(self.device.clone())
    }

    /// An all-gather's result shape: `t`'s rows, once per rank (a scalar
    /// gathers as shape [1] per rank).
    fn gathered_dims(&self, t: &Tensor) -> Vec<usize> {
        let mut dims = t.dims().to_vec();
        match dims.first_mut() {
            Some(rows) => *rows *= self.world_size,
            None => dims.push(self.world_size),
        }
        dims
    }

    /// A reduce-scatter's result shape: this rank's share of `t`'s rows
    /// (`Call::check` rejects what does not divide).
    fn scattered_dims(&self, t: &Tensor) -> Vec<usize> {
        let mut dims = t.dims().to_vec();
        if let Some(rows) = dims.first_mut() {
            *rows /= self.world_size;
        }
        dims
    }

    /// Checks and queues a collective on `t`, with a result of shape
    /// `out_dims`; counts it once it has been queued.
    fn collective(&self, call: Call, t: &Tensor, out_dims: &[usize]) -> Result<InFlight> {
        call.check(Some(t), self.world_size)?;
        let op = match call {
            Call::AllReduce(op) => Op::AllReduce(op),
            Call::Broadcast { root } => Op::Broadcast { root },
            Call::AllGather => Op::AllGather,
            Call::ReduceScatter(op) => Op::ReduceScatter(op),
            Call::Barrier => bail!("barrier: it carries no tensor (a bug in the backend)"),
        };
        let flight = self.launch(op, t, Some(out_dims))?;
        let payload = call.payload_bytes(Some(t), self.world_size);
        let mut stats = self.stats.borrow_mut();
        stats.record(call.kind(), payload);
        stats.record_wire(call.kind(), ring_wire_bytes(call, payload, self.rank, self.world_size));
        Ok(flight)
    }

    /// Queues `op` on `input`'s buffer, with a result buffer shaped
    /// `out_dims` (`None` for a send, which has none); the watchdog watches
    /// it.
    fn launch(&self, op: Op, input: &Tensor, out_dims: Option<&[usize]>) -> Result<InFlight> {
        let (out, read) = self.enqueue(op, input, out_dims)?;
        let flight = self.in_flight(out, vec![read])?;
        self.watch(op)?;
        Ok(flight)
    }

    /// [`launch`](Self::launch), before the call is marked done and watched:
    /// inside an NCCL group nothing reaches the stream before the group ends,
    /// so the group's caller does both then. Returns the result and the flat
    /// buffer NCCL reads, which must live until the compute stream has
    /// waited for the call.
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
        let compute = self.device.cuda_stream();
        compute.context().bind_to_thread().w()?;
        // The call starts after what the compute stream has queued so far:
        // the kernels that wrote its input and the result buffer's memset.
        self.comm_stream.wait(&compute.record_event(None).w()?).w()?;
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

    /// The calls just queued, with their result (if any) and the buffers
    /// they read, as one [`InFlight`] marked done by an event recorded after
    /// them on the communication stream.
    fn in_flight(&self, out: Option<Tensor>, kept: Vec<Tensor>) -> Result<InFlight> {
        let done = self.comm_stream.record_event(None).w()?;
        Ok(InFlight { out, _kept: kept, done, compute: self.device.cuda_stream(), waited: false })
    }

    /// Hands the call just queued to the watchdog, through an event recorded
    /// after it on the communication stream: the event completes when the
    /// call has.
    fn watch(&self, op: Op) -> Result<()> {
        let Some(watchdog) = &self.watchdog else { return Ok(()) };
        let number = self.queued.replace(self.queued.get() + 1);
        let event = self.comm_stream.record_event(None).w()?;
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
        Properties { rank_order_reduction: false, detects_dead_peers: false, overlaps: true, buffered_sends: false }
    }

    fn all_reduce(&self, t: &Tensor, op: ReduceOp) -> Result<Tensor> {
        self.collective(Call::AllReduce(op), t, t.dims())?.result()
    }

    fn all_reduce_async(&self, t: &Tensor, op: ReduceOp) -> Result<Work> {
        Ok(self.collective(Call::AllReduce(op), t, t.dims())?.into_work())
    }

    fn broadcast(&self, t: &Tensor, root: usize) -> Result<Tensor> {
        self.collective(Call::Broadcast { root }, t, t.dims())?.result()
    }

    fn all_gather(&self, t: &Tensor) -> Result<Tensor> {
        self.collective(Call::AllGather, t, &self.gathered_dims(t))?.result()
    }

    fn all_gather_async(&self, t: &Tensor) -> Result<Work> {
        Ok(self.collective(Call::AllGather, t, &self.gathered_dims(t))?.into_work())
    }

    fn reduce_scatter(&self, t: &Tensor, op: ReduceOp) -> Result<Tensor> {
        self.collective(Call::ReduceScatter(op), t, &self.scattered_dims(t))?.result()
    }

    fn reduce_scatter_async(&self, t: &Tensor, op: ReduceOp) -> Result<Work> {
        Ok(self.collective(Call::ReduceScatter(op), t, &self.scattered_dims(t))?.into_work())
    }

    /// Once this rank's GPU work is done, waits on the host, through the
    /// job's store, for every rank of the group: no NCCL call. A barrier on
    /// the GPU (PyTorch's is a one-element all-reduce) would sit queued on
    /// the ranks that wait after rank 0 writes a checkpoint, for as long as
    /// the write takes, timed by the watchdog; this one waits past the
    /// timeout while a rank says on the store that it is busy, and fails
    /// with the ranks that arrived when none does.
    fn barrier(&self) -> Result<()> {
        self.device.cuda_stream().synchronize().w()?;
        self.comm_stream.synchronize().w()?;
        let number = self.barriers.replace(self.barriers.get() + 1);
        let name = format!("nccl/{}/{number}", self.key);
        self.board.barrier(&name, self.world_size, self.timeout).map_err(|e| Error::Msg(format!("barrier: {e}")))?;
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
        self.launch(Op::Send { dst }, t, None)?.finish()?;
        let bytes = bytes_of(t);
        let mut stats = self.stats.borrow_mut();
        stats.record(Collective::Send, bytes);
        stats.record_wire(Collective::Send, bytes);
        Ok(())
    }

    fn recv(&self, like: &Tensor, src: usize) -> Result<Tensor> {
        check_peer(Collective::Recv, src, self.rank, self.world_size)?;
        let received = self.launch(Op::Recv { src }, like, Some(like.dims()))?.result()?;
        self.stats.borrow_mut().record(Collective::Recv, bytes_of(like));
        Ok(received)
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
        self.comm_stream.context().bind_to_thread().w()?;
        let comm = Comm::from_rank(Arc::clone(&self.comm_stream), place, members.len(), id_from_bytes(&theirs)?)
            .map_err(|e| nccl_error(&format!("rank {} joining a subgroup of ranks {members:?}", self.rank), e))?;
        let (server, board) = (self._server.clone(), Arc::clone(&self.board));
        let comm_stream = Arc::clone(&self.comm_stream);
        // Every rank splits in the same order, so the number names the same split on each.
        let key = format!("{}/split{}/{members:?}", self.key, self.splits.replace(self.splits.get() + 1));
        Ok(Box::new(Self::of_comm(comm, comm_stream, &self.device, key, self.timeout, board, server)))
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
        // The group is ended whatever happened inside it, or NCCL stays in
        // it; whatever it queued keeps its buffers until it is done.
        let (kept, ended) = group.end();
        let flight = self.in_flight(received.as_ref().ok().cloned().flatten(), kept)?;
        received?;
        ended?;
        self.watch(Op::Recv { src })?;
        let received = flight.result()?;
        let (sent_bytes, received_bytes) = (bytes_of(t), bytes_of(like));
        let mut stats = self.stats.borrow_mut();
        stats.record(Collective::Send, sent_bytes);
        stats.record_wire(Collective::Send, sent_bytes);
        stats.record(Collective::Recv, received_bytes);
        drop(stats);
        Ok(received)
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
/// here until then and handed on to the [`InFlight`] that outlives the calls:
/// a contiguous copy freed earlier could have its memory handed to the next
/// allocation (the receive's buffer) while a send still reads it.
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

    /// Ends the group, queuing its calls, and hands back the buffers they
    /// read, with whether it ended well.
    fn end(mut self) -> (Vec<Tensor>, Result<()>) {
        self.ended = true;
        let ended = group_end().map(drop).map_err(|e| nccl_error("ncclGroupEnd", e));
        (std::mem::take(&mut self.kept), ended)
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

/// Calls queued on the communication stream: their result, the buffers
/// they read, and the event that marks them done. The compute stream waits
/// for that event before the result is handed out, and before the buffers
/// can be freed (frees are queued on the compute stream): when the result is
/// taken, or, for calls whose result is never taken, when this is dropped.
struct InFlight {
    out: Option<Tensor>,
    /// Held only to be dropped after the wait.
    _kept: Vec<Tensor>,
    done: CudaEvent,
    compute: Arc<CudaStream>,
    waited: bool,
}

impl InFlight {
    /// Orders the compute stream after the calls and hands back the result.
    fn finish(mut self) -> Result<Option<Tensor>> {
        self.compute.wait(&self.done).w()?;
        self.waited = true;
        Ok(self.out.take())
    }

    /// [`finish`](Self::finish), for a call that has a result.
    fn result(self) -> Result<Tensor> {
        self.finish()?.ok_or_else(|| Error::Msg("NCCL gave no result (a bug in the backend)".into()))
    }

    /// The result, waited for only when [`Work::wait`] asks for it: the
    /// compute stream runs what is queued meanwhile beside the call.
    fn into_work(self) -> Work {
        Work::pending(move || self.result())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if !self.waited {
            // Nothing to report to: a failure here is the stream's, and the
            // next call on it reports it.
            let _ = self.compute.wait(&self.done);
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
