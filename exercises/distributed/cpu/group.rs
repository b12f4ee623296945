//! One rank's handle on a group of CPU threads.

use std::cell::{Cell, RefCell};
use std::fmt;
use std::sync::Arc;

use candle_core::{Device, Result, Tensor};

use super::rendezvous::Rendezvous;
use crate::distributed::collective::{Call, Outcome};
use crate::distributed::{CommStats, ProcessGroup, ReduceOp};

/// A rank of a group whose ranks are threads of this process, started by
/// [`spawn`](super::spawn). The tensors meet on the host (like PyTorch's Gloo
/// backend): inputs on another device are copied to the CPU and the results
/// copied back.
pub struct CpuProcessGroup {
    rank: usize,
    rendezvous: Arc<Rendezvous>,
    /// How many collectives this rank has issued: the generation of its next one.
    issued: Cell<u64>,
    stats: RefCell<CommStats>,
}

impl CpuProcessGroup {
    pub(super) fn new(rank: usize, rendezvous: Arc<Rendezvous>) -> Self {
        Self {
            rank,
            rendezvous,
            issued: Cell::new(0),
            stats: RefCell::default(),
        }
    }

    /// Issues one collective and waits for the other ranks to issue it too.
    fn run(&self, call: Call, input: Option<&Tensor>) -> Result<Arc<Outcome>> {
        let world_size = self.world_size();
        call.check(input, world_size)?;
        self.stats
            .borrow_mut()
            .record(call.kind(), call.payload_bytes(input, world_size));
        let generation = self.issued.replace(self.issued.get() + 1);
        let input = input
            .map(|t| t.detach().to_device(&Device::Cpu))
            .transpose()?;
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

    fn barrier(&self) -> Result<()> {
        self.run(Call::Barrier, None).map(drop)
    }

    fn stats(&self) -> CommStats {
        self.stats.borrow().clone()
    }
}

impl fmt::Debug for CpuProcessGroup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "CpuProcessGroup(rank {} of {})",
            self.rank,
            self.world_size()
        )
    }
}
