//! A process group with some of its calls replaced and everything else the
//! inner group's: exercise 16's ring as the trainer's all-reduce (`train
//! --allreduce ring`), FSDP's prefetching all-gather, ZeRO-1's clipping
//! reduce-scatter, the recorder of a ring's messages, recorders in the tests. One wrapper forwards the rest, so no replacement can forget a
//! method.

use candle_core::{Result, Tensor};

use super::{CommStats, ProcessGroup, Properties, ReduceOp, Work};

/// What a [`WithOverride`] puts in place of its inner group's calls; each
/// method is the inner group's unless replaced.
pub trait CollectiveOverride: Send {
    fn all_reduce(&self, inner: &dyn ProcessGroup, t: &Tensor, op: ReduceOp) -> Result<Tensor> {
        inner.all_reduce(t, op)
    }

    /// The all-reduce started without waiting; by default this override's
    /// all-reduce, done at once, so a replaced all-reduce is never bypassed.
    fn all_reduce_async(&self, inner: &dyn ProcessGroup, t: &Tensor, op: ReduceOp) -> Result<Work> {
        Ok(Work::done(self.all_reduce(inner, t, op)))
    }

    fn broadcast(&self, inner: &dyn ProcessGroup, t: &Tensor, root: usize) -> Result<Tensor> {
        inner.broadcast(t, root)
    }

    fn all_gather(&self, inner: &dyn ProcessGroup, t: &Tensor) -> Result<Tensor> {
        inner.all_gather(t)
    }

    /// The inner group's, not this override's `all_gather`, unless replaced.
    fn all_gather_async(&self, inner: &dyn ProcessGroup, t: &Tensor) -> Result<Work> {
        inner.all_gather_async(t)
    }

    fn reduce_scatter(&self, inner: &dyn ProcessGroup, t: &Tensor, op: ReduceOp) -> Result<Tensor> {
        inner.reduce_scatter(t, op)
    }

    /// The inner group's, not this override's `reduce_scatter`, unless replaced.
    fn reduce_scatter_async(&self, inner: &dyn ProcessGroup, t: &Tensor, op: ReduceOp) -> Result<Work> {
        inner.reduce_scatter_async(t, op)
    }

    fn barrier(&self, inner: &dyn ProcessGroup) -> Result<()> {
        inner.barrier()
    }

    fn send(&self, inner: &dyn ProcessGroup, t: &Tensor, dst: usize) -> Result<()> {
        inner.send(t, dst)
    }

    fn recv(&self, inner: &dyn ProcessGroup, like: &Tensor, src: usize) -> Result<Tensor> {
        inner.recv(like, src)
    }

    fn send_recv(&self, inner: &dyn ProcessGroup, t: &Tensor, dst: usize, like: &Tensor, src: usize) -> Result<Tensor> {
        inner.send_recv(t, dst, like, src)
    }

    /// What the group guarantees with the replacement; by default the inner group's.
    fn properties(&self, inner: &dyn ProcessGroup) -> Properties {
        inner.properties()
    }
}

/// `inner`, with the collectives `replacement` overrides replaced.
pub struct WithOverride<R> {
    inner: Box<dyn ProcessGroup>,
    replacement: R,
}

impl<R: CollectiveOverride> WithOverride<R> {
    pub fn new(inner: Box<dyn ProcessGroup>, replacement: R) -> Self {
        Self { inner, replacement }
    }

    /// The group without the replacement.
    pub fn inner(&self) -> &dyn ProcessGroup {
        self.inner.as_ref()
    }
}

/// A subgroup's collectives are replaced too, by a clone of the replacement.
impl<R: CollectiveOverride + Clone + 'static> ProcessGroup for WithOverride<R> {
    fn rank(&self) -> usize {
        self.inner.rank()
    }

    fn world_size(&self) -> usize {
        self.inner.world_size()
    }

    fn properties(&self) -> Properties {
        self.replacement.properties(self.inner.as_ref())
    }

    fn all_reduce(&self, t: &Tensor, op: ReduceOp) -> Result<Tensor> {
        self.replacement.all_reduce(self.inner.as_ref(), t, op)
    }

    fn all_reduce_async(&self, t: &Tensor, op: ReduceOp) -> Result<Work> {
        self.replacement.all_reduce_async(self.inner.as_ref(), t, op)
    }

    fn broadcast(&self, t: &Tensor, root: usize) -> Result<Tensor> {
        self.replacement.broadcast(self.inner.as_ref(), t, root)
    }

    fn all_gather(&self, t: &Tensor) -> Result<Tensor> {
        self.replacement.all_gather(self.inner.as_ref(), t)
    }

    fn all_gather_async(&self, t: &Tensor) -> Result<Work> {
        self.replacement.all_gather_async(self.inner.as_ref(), t)
    }

    fn reduce_scatter(&self, t: &Tensor, op: ReduceOp) -> Result<Tensor> {
        self.replacement.reduce_scatter(self.inner.as_ref(), t, op)
    }

    fn reduce_scatter_async(&self, t: &Tensor, op: ReduceOp) -> Result<Work> {
        self.replacement.reduce_scatter_async(self.inner.as_ref(), t, op)
    }

    fn send(&self, t: &Tensor, dst: usize) -> Result<()> {
        self.replacement.send(self.inner.as_ref(), t, dst)
    }

    fn recv(&self, like: &Tensor, src: usize) -> Result<Tensor> {
        self.replacement.recv(self.inner.as_ref(), like, src)
    }

    fn send_recv(&self, t: &Tensor, dst: usize, like: &Tensor, src: usize) -> Result<Tensor> {
        self.replacement.send_recv(self.inner.as_ref(), t, dst, like, src)
    }

    fn barrier(&self) -> Result<()> {
        self.replacement.barrier(self.inner.as_ref())
    }

    fn split(&self, color: usize) -> Result<Box<dyn ProcessGroup>> {
        Ok(Box::new(Self::new(self.inner.split(color)?, self.replacement.clone())))
    }

    fn set_busy(&self, what: Option<&str>) {
        self.inner.set_busy(what)
    }

    fn stats(&self) -> CommStats {
        self.inner.stats()
    }
}
