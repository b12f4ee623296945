//! One rank's handle on a group of CPU threads.

use std::cell::{Cell, RefCell};
use std::fmt;
use std::sync::Arc;

use candle_core::{Device, Result, Tensor};

use super::rendezvous::Rendezvous;
use crate::distributed::collective::{check_peer, Call, Outcome};
use crate::distributed::process_group::members_of_color;
use crate::distributed::{Collective, CommStats, ProcessGroup, Properties, ReduceOp};
use crate::timeline;

/// A rank of a group whose ranks are threads of this process, started by
/// [`spawn`](super::spawn). The tensors meet on the host (like PyTorch's Gloo
/// backend): inputs on another device are copied to the CPU and the results
/// copied back.
pub struct CpuProcessGroup {
    rank: usize,
    rendezvous: Arc<Rendezvous>,
    /// How many collectives this rank has issued: the generation of its next one.
    issued: Cell<u64>,
    /// How many times this rank has split the group: the number of its next split.
    splits: Cell<u64>,
    stats: RefCell<CommStats>,
}

impl CpuProcessGroup {
    pub(super) fn new(rank: usize, rendezvous: Arc<Rendezvous>) -> Self {
        Self { rank, rendezvous, issued: Cell::new(0), splits: Cell::new(0), stats: RefCell::default() }
    }

    /// Issues one collective and waits for the other ranks to issue it too.
    fn run(&self, call: Call, input: Option<&Tensor>) -> Result<Arc<Outcome>> {
        let _span = timeline::span("comm", call.kind().to_string());
        let world_size = self.world_size();
        call.check(input, world_size)?;
        let mut stats = self.stats.borrow_mut();
        stats.record(call.kind(), call.payload_bytes(input, world_size));
        // The one copy of its input this rank hands to the others.
        stats.record_wire(call.kind(), call.payload_bytes(input, 1));
        drop(stats);
        let generation = self.issued.replace(self.issued.get() + 1);
        let input = input.map(|t| t.detach().to_device(&Device::Cpu)).transpose()?;
        self.rendezvous.meet(self.rank, generation, call, input)
    }

    fn exchange(&self, call: Call, t: &Tensor) -> Result<Tensor> {
        self.run(call, Some(t))?.deliver(self.rank, t)
    }
}

impl ProcessGroup for CpuProcessGroup {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.rendezvous.world_size()
    }

    fn properties(&self) -> Properties {
        Properties { rank_order_reduction: true, detects_dead_peers: true, overlaps: false, buffered_sends: true }
    }

    fn all_reduce(&self, t: &Tensor, op: ReduceOp) -> Result<Tensor> {
        self.exchange(Call::AllReduce(op), t)
    }

    fn broadcast(&self, t: &Tensor, root: usize) -> Result<Tensor> {
        self.exchange(Call::Broadcast { root }, t)
    }

    fn all_gather(&self, t: &Tensor) -> Result<Tensor> {
        self.exchange(Call::AllGather, t)
    }

    fn reduce_scatter(&self, t: &Tensor, op: ReduceOp) -> Result<Tensor> {
        self.exchange(Call::ReduceScatter(op), t)
    }

    fn send(&self, t: &Tensor, dst: usize) -> Result<()> {
        check_peer(Collective::Send, dst, self.rank, self.world_size())?;
        let bytes = (t.elem_count() * t.dtype().size_in_bytes()) as u64;
        let mut stats = self.stats.borrow_mut();
        stats.record(Collective::Send, bytes);
        stats.record_wire(Collective::Send, bytes);
        drop(stats);
        // A copy of its own, as over a wire: later in-place updates of `t` stay here.
        let copy = t.detach().to_device(&Device::Cpu)?.copy()?;
        self.rendezvous.post(self.rank, dst, copy)
    }

    fn recv(&self, like: &Tensor, src: usize) -> Result<Tensor> {
        check_peer(Collective::Recv, src, self.rank, self.world_size())?;
        let t = self.rendezvous.collect(src, self.rank)?;
        if t.dims() != like.dims() || t.dtype() != like.dtype() {
            let reason = format!(
                "recv: rank {} expected a {:?} {} tensor from rank {src}, which sent a {:?} {} one: send and recv must agree on shape and dtype",
                self.rank,
                like.dims(),
                like.dtype().as_str(),
                t.dims(),
                t.dtype().as_str()
            );
            self.rendezvous.abort(reason.clone());
            return Err(candle_core::Error::Msg(reason));
        }
        self.stats.borrow_mut().record(Collective::Recv, (t.elem_count() * t.dtype().size_in_bytes()) as u64);
        t.to_device(like.device())
    }

    fn barrier(&self) -> Result<()> {
        self.run(Call::Barrier, None).map(drop)
    }

    /// The members of each new group meet in a rendezvous of their own,
    /// which the first of them to arrive makes and this group's keeps, so
    /// that an abort here reaches it too.
    fn split(&self, color: usize) -> Result<Box<dyn ProcessGroup>> {
        let (members, place) = members_of_color(self, color, &Device::Cpu)?;
        let number = self.splits.replace(self.splits.get() + 1);
        let rendezvous = self.rendezvous.subgroup(number, color, members);
        Ok(Box::new(Self::new(place, rendezvous)))
    }

    fn set_busy(&self, what: Option<&str>) {
        self.rendezvous.set_busy(self.rank, what);
    }

    fn stats(&self) -> CommStats {
        self.stats.borrow().clone()
    }
}

impl fmt::Debug for CpuProcessGroup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CpuProcessGroup(rank {} of {})", self.rank, self.world_size())
    }
}
