//! A process group whose all-reduce is replaced while everything else is
//! the inner group's: exercise 16's ring in the trainer (`train --allreduce
//! ring`, so the all-reduce of every DDP step runs the code you wrote), a
//! recorder of all-reduces in the tests. One wrapper forwards the rest, so
//! no replacement can forget a method.

use candle_core::{Result, Tensor};

use super::reduce_op::finish;
use super::{CommStats, ProcessGroup, Properties, ReduceOp, Work};
use crate::phase4_under_the_hood::ring_all_reduce;

/// The all-reduce a [`WithAllReduce`] puts in place of its inner group's.
pub trait AllReduceOverride: Send {
    fn all_reduce(&self, inner: &dyn ProcessGroup, t: &Tensor, op: ReduceOp) -> Result<Tensor>;

    /// The replacement started without waiting; by default it is done at once.
    fn all_reduce_async(&self, inner: &dyn ProcessGroup, t: &Tensor, op: ReduceOp) -> Result<Work> {
        Ok(Work::done(self.all_reduce(inner, t, op)))
    }

    /// What the group guarantees with the replacement; by default the inner group's.
    fn properties(&self, inner: &dyn ProcessGroup) -> Properties {
        inner.properties()
    }
}

/// `inner`, with its all-reduce replaced by `replacement`.
pub struct WithAllReduce<R> {
    inner: Box<dyn ProcessGroup>,
    replacement: R,
}

impl<R: AllReduceOverride> WithAllReduce<R> {
    pub fn new(inner: Box<dyn ProcessGroup>, replacement: R) -> Self {
        Self { inner, replacement }
    }
}

/// Exercise 16's ring, built from the inner group's own `send` and `recv`.
#[derive(Clone, Copy)]
pub struct OwnRing;

impl OwnRing {
    /// `inner` with exercise 16's ring as its all-reduce.
    pub fn around(inner: Box<dyn ProcessGroup>) -> WithAllReduce<OwnRing> {
        WithAllReduce::new(inner, OwnRing)
    }
}

impl AllReduceOverride for OwnRing {
    fn all_reduce(&self, inner: &dyn ProcessGroup, t: &Tensor, op: ReduceOp) -> Result<Tensor> {
        finish(ring_all_reduce(inner, t)?, op, inner.world_size())
    }

    fn properties(&self, inner: &dyn ProcessGroup) -> Properties {
        // Your ring adds each chunk in ring order: exact only for two ranks.
        Properties { rank_order_reduction: inner.world_size() <= 2, overlaps: false, ..inner.properties() }
    }
}

/// A subgroup's all-reduce is replaced too, by a clone of the replacement.
impl<R: AllReduceOverride + Clone + 'static> ProcessGroup for WithAllReduce<R> {
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
        self.inner.broadcast(t, root)
    }

    fn all_gather(&self, t: &Tensor) -> Result<Tensor> {
        self.inner.all_gather(t)
    }

    fn reduce_scatter(&self, t: &Tensor, op: ReduceOp) -> Result<Tensor> {
        self.inner.reduce_scatter(t, op)
    }

    fn send(&self, t: &Tensor, dst: usize) -> Result<()> {
        self.inner.send(t, dst)
    }

    fn recv(&self, like: &Tensor, src: usize) -> Result<Tensor> {
        self.inner.recv(like, src)
    }

    fn barrier(&self) -> Result<()> {
        self.inner.barrier()
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
