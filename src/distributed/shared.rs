//! A process group several owners hold at once. Groups are `Send` but not
//! `Sync` (a backend keeps per-call state in cells), so an `Arc` of one
//! cannot cross threads or live inside another group. Behind a lock it can:
//! a pipeline stage keeps its tensor-parallel group, and ZeRO's clipping
//! reduce-scatter reaches the tp and pp groups of the mesh it runs on, while
//! the mesh keeps them too. One rank calls one collective at a time, so the
//! lock is never contended.

use std::sync::{Arc, Mutex, PoisonError};

use candle_core::{Result, Tensor};

use super::{CommStats, ProcessGroup, Properties, ReduceOp, Work};

/// `inner`, shared: clones are the same group.
#[derive(Clone)]
pub struct SharedGroup(Arc<Mutex<Box<dyn ProcessGroup>>>);

impl SharedGroup {
    pub fn new(inner: Box<dyn ProcessGroup>) -> Self {
        Self(Arc::new(Mutex::new(inner)))
    }

    /// Whether `other` is this same group.
    pub fn is(&self, other: &SharedGroup) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }

    fn with<T>(&self, call: impl FnOnce(&dyn ProcessGroup) -> T) -> T {
        call(self.0.lock().unwrap_or_else(PoisonError::into_inner).as_ref())
    }
}

impl ProcessGroup for SharedGroup {
    fn rank(&self) -> usize {
        self.with(|pg| pg.rank())
    }

    fn world_size(&self) -> usize {
        self.with(|pg| pg.world_size())
    }

    fn properties(&self) -> Properties {
        self.with(|pg| pg.properties())
    }

    fn all_reduce(&self, t: &Tensor, op: ReduceOp) -> Result<Tensor> {
        self.with(|pg| pg.all_reduce(t, op))
    }

    fn broadcast(&self, t: &Tensor, root: usize) -> Result<Tensor> {
        self.with(|pg| pg.broadcast(t, root))
    }

    fn all_gather(&self, t: &Tensor) -> Result<Tensor> {
        self.with(|pg| pg.all_gather(t))
    }

    fn reduce_scatter(&self, t: &Tensor, op: ReduceOp) -> Result<Tensor> {
        self.with(|pg| pg.reduce_scatter(t, op))
    }

    fn send(&self, t: &Tensor, dst: usize) -> Result<()> {
        self.with(|pg| pg.send(t, dst))
    }

    fn recv(&self, like: &Tensor, src: usize) -> Result<Tensor> {
        self.with(|pg| pg.recv(like, src))
    }

    fn send_recv(&self, t: &Tensor, dst: usize, like: &Tensor, src: usize) -> Result<Tensor> {
        self.with(|pg| pg.send_recv(t, dst, like, src))
    }

    fn barrier(&self) -> Result<()> {
        self.with(|pg| pg.barrier())
    }

    fn all_reduce_async(&self, t: &Tensor, op: ReduceOp) -> Result<Work> {
        self.with(|pg| pg.all_reduce_async(t, op))
    }

    fn all_gather_async(&self, t: &Tensor) -> Result<Work> {
        self.with(|pg| pg.all_gather_async(t))
    }

    fn reduce_scatter_async(&self, t: &Tensor, op: ReduceOp) -> Result<Work> {
        self.with(|pg| pg.reduce_scatter_async(t, op))
    }

    fn split(&self, color: usize) -> Result<Box<dyn ProcessGroup>> {
        self.with(|pg| pg.split(color))
    }

    fn set_busy(&self, what: Option<&str>) {
        self.with(|pg| pg.set_busy(what))
    }

    fn stats(&self) -> CommStats {
        self.with(|pg| pg.stats())
    }
}
