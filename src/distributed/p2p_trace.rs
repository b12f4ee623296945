//! A process group that writes down every point-to-point message one rank
//! passes, in order: exercise 16's checks read it to see what a ring did,
//! and the guide's ring figure is drawn from it. Collectives pass through.

use std::sync::{Arc, Mutex, PoisonError};

use candle_core::{DType, Result, Tensor};

use super::{CollectiveOverride, ProcessGroup, WithOverride};

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

/// Writes every send and receive of a group into `trace`. A grouped
/// exchange (`send_recv`) is its send, then its receive, so the inner group
/// must buffer sends (the thread and TCP backends do).
#[derive(Clone)]
pub struct P2pRecorder {
    trace: Arc<Mutex<P2pTrace>>,
}

impl P2pRecorder {
    /// `inner` as it is, with every send and receive written into `trace`.
    pub fn around(inner: Box<dyn ProcessGroup>, trace: Arc<Mutex<P2pTrace>>) -> WithOverride<Self> {
        WithOverride::new(inner, Self { trace })
    }

    fn write(&self, note: impl FnOnce(&mut P2pTrace)) {
        note(&mut self.trace.lock().unwrap_or_else(PoisonError::into_inner));
    }
}

fn values(t: &Tensor) -> Result<Vec<f32>> {
    t.flatten_all()?.to_dtype(DType::F32)?.to_vec1()
}

impl CollectiveOverride for P2pRecorder {
    fn send(&self, inner: &dyn ProcessGroup, t: &Tensor, dst: usize) -> Result<()> {
        let sent = values(t)?;
        self.write(|trace| {
            trace.sent.push(sent);
            trace.sent_to.push(dst);
        });
        inner.send(t, dst)
    }

    fn recv(&self, inner: &dyn ProcessGroup, like: &Tensor, src: usize) -> Result<Tensor> {
        self.write(|trace| trace.waited_on.push(src));
        let got = inner.recv(like, src)?;
        let received = values(&got)?;
        self.write(|trace| trace.received.push(received));
        Ok(got)
    }

    fn send_recv(&self, inner: &dyn ProcessGroup, t: &Tensor, dst: usize, like: &Tensor, src: usize) -> Result<Tensor> {
        self.send(inner, t, dst)?;
        self.recv(inner, like, src)
    }
}
