//! A process group that writes down every point-to-point message one rank
//! passes, in order: exercise 16's checks read it to see what a ring did,
//! and the guide's ring figure is drawn from it. Collectives pass through.

use std::sync::{Mutex, PoisonError};

use candle_core::{DType, Result, Tensor};

use super::{CommStats, ProcessGroup, Properties, ReduceOp};

/// What one rank did on the wire, in order.
#[derive(Debug, Default, Clone)]
pub struct P2pTrace {
    /// Each send's values.
    pub sent: Vec<Vec<f32>>,
    /// Each send's destination.
    pub sent_to: Vec<usize>,
    /// Each receive's source, recorded as it starts: one that never ends is there too.
    pub waited_on: Vec<usize>,
    /// Each receive's values, once it ended.
    pub received: Vec<Vec<f32>>,
}

/// `inner` as it is, with every send and receive written into `trace`.
/// A grouped exchange (`send_recv`) is its send, then its receive, so the
/// inner group must buffer sends (the thread and TCP backends do).
pub struct P2pRecorder<'a, P> {
    inner: P,
    trace: &'a Mutex<P2pTrace>,
}

impl<'a, P: ProcessGroup> P2pRecorder<'a, P> {
    pub fn new(inner: P, trace: &'a Mutex<P2pTrace>) -> Self {
        Self { inner, trace }
    }

    fn write(&self, note: impl FnOnce(&mut P2pTrace)) {
        note(&mut self.trace.lock().unwrap_or_else(PoisonError::into_inner));
    }
}

fn values(t: &Tensor) -> Result<Vec<f32>> {
    t.flatten_all()?.to_dtype(DType::F32)?.to_vec1()
}

impl<P: ProcessGroup> ProcessGroup for P2pRecorder<'_, P> {
    fn rank(&self) -> usize {
        self.inner.rank()
    }
    fn world_size(&self) -> usize {
        self.inner.world_size()
    }
    fn properties(&self) -> Properties {
        self.inner.properties()
    }
    fn all_reduce(&self, t: &Tensor, op: ReduceOp) -> Result<Tensor> {
        self.inner.all_reduce(t, op)
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
        let sent = values(t)?;
        self.write(|trace| {
            trace.sent.push(sent);
            trace.sent_to.push(dst);
        });
        self.inner.send(t, dst)
    }
    fn recv(&self, like: &Tensor, src: usize) -> Result<Tensor> {
        self.write(|trace| trace.waited_on.push(src));
        let got = self.inner.recv(like, src)?;
        let received = values(&got)?;
        self.write(|trace| trace.received.push(received));
        Ok(got)
    }
    fn barrier(&self) -> Result<()> {
        self.inner.barrier()
    }
    fn stats(&self) -> CommStats {
        self.inner.stats()
    }
}
