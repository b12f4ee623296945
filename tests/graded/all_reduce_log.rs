//! A process group's all-reduces, logged against how far the caller's own
//! work had got: exercises 19 and 26, which overlap communication with
//! backward, are graded on when each bucket started and when its result was
//! waited for. Every other collective is logged too, by name and size, so
//! that a test can say that nothing at all crossed the group.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use candle_core::{Result, Tensor};
use workbook::distributed::{CollectiveOverride, ProcessGroup, ReduceOp, Work};

/// What the log saw, in order. `progress` is the caller's count at that
/// moment (e.g. the gradients backward had handed over).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum Event {
    Started {
        phase: usize,
        elements: usize,
        blocking: bool,
        progress: u64,
    },
    Waited {
        progress: u64,
    },
    /// Any other collective: its method's name and its tensor's elements.
    Called {
        phase: usize,
        collective: String,
        elements: usize,
    },
}

/// Wraps a process group (through `WithOverride`) and logs its all-reduces.
#[derive(Clone)]
pub struct AllReduceLog {
    progress: Arc<dyn Fn() -> u64 + Send + Sync>,
    /// The caller's phase, e.g. the micro-batch running.
    phase: Arc<AtomicUsize>,
    events: Arc<Mutex<Vec<Event>>>,
}

impl AllReduceLog {
    /// A log that reads the caller's progress from `progress`.
    pub fn new(progress: impl Fn() -> u64 + Send + Sync + 'static) -> Self {
        Self { progress: Arc::new(progress), phase: Arc::default(), events: Arc::default() }
    }

    /// Marks what follows as the caller's phase `phase`.
    pub fn enter(&self, phase: usize) {
        self.phase.store(phase, Ordering::SeqCst);
    }

    pub fn events(&self) -> Vec<Event> {
        self.events.lock().unwrap().clone()
    }

    fn called(&self, collective: &str, t: &Tensor) {
        let phase = self.phase.load(Ordering::SeqCst);
        let event = Event::Called { phase, collective: collective.to_string(), elements: t.elem_count() };
        self.events.lock().unwrap().push(event);
    }

    fn started(&self, t: &Tensor, blocking: bool) {
        let phase = self.phase.load(Ordering::SeqCst);
        let event = Event::Started { phase, elements: t.elem_count(), blocking, progress: (self.progress)() };
        self.events.lock().unwrap().push(event);
    }
}

impl CollectiveOverride for AllReduceLog {
    fn all_reduce(&self, inner: &dyn ProcessGroup, t: &Tensor, op: ReduceOp) -> Result<Tensor> {
        self.started(t, true);
        inner.all_reduce(t, op)
    }

    fn all_reduce_async(&self, inner: &dyn ProcessGroup, t: &Tensor, op: ReduceOp) -> Result<Work> {
        self.started(t, false);
        let work = inner.all_reduce_async(t, op)?;
        let log = self.clone();
        Ok(Work::pending(move || {
            log.events.lock().unwrap().push(Event::Waited { progress: (log.progress)() });
            work.wait()
        }))
    }

    fn broadcast(&self, inner: &dyn ProcessGroup, t: &Tensor, root: usize) -> Result<Tensor> {
        self.called("broadcast", t);
        inner.broadcast(t, root)
    }

    fn all_gather(&self, inner: &dyn ProcessGroup, t: &Tensor) -> Result<Tensor> {
        self.called("all_gather", t);
        inner.all_gather(t)
    }

    fn all_gather_async(&self, inner: &dyn ProcessGroup, t: &Tensor) -> Result<Work> {
        self.called("all_gather_async", t);
        inner.all_gather_async(t)
    }

    fn reduce_scatter(&self, inner: &dyn ProcessGroup, t: &Tensor, op: ReduceOp) -> Result<Tensor> {
        self.called("reduce_scatter", t);
        inner.reduce_scatter(t, op)
    }

    fn reduce_scatter_async(&self, inner: &dyn ProcessGroup, t: &Tensor, op: ReduceOp) -> Result<Work> {
        self.called("reduce_scatter_async", t);
        inner.reduce_scatter_async(t, op)
    }

    fn send(&self, inner: &dyn ProcessGroup, t: &Tensor, dst: usize) -> Result<()> {
        self.called("send", t);
        inner.send(t, dst)
    }

    fn recv(&self, inner: &dyn ProcessGroup, like: &Tensor, src: usize) -> Result<Tensor> {
        self.called("recv", like);
        inner.recv(like, src)
    }

    fn send_recv(&self, inner: &dyn ProcessGroup, t: &Tensor, dst: usize, like: &Tensor, src: usize) -> Result<Tensor> {
        self.called("send_recv", t);
        inner.send_recv(t, dst, like, src)
    }

    fn barrier(&self, inner: &dyn ProcessGroup) -> Result<()> {
        let phase = self.phase.load(Ordering::SeqCst);
        self.events.lock().unwrap().push(Event::Called { phase, collective: "barrier".into(), elements: 0 });
        inner.barrier()
    }
}

/// The started all-reduces of `events` in phase `phase`: (elements, blocking, progress).
pub fn started_in(events: &[Event], phase: usize) -> Vec<(usize, bool, u64)> {
    let of_phase = |e: &Event| match *e {
        Event::Started { phase: p, elements, blocking, progress } => {
            (p == phase).then_some((elements, blocking, progress))
        }
        Event::Waited { .. } | Event::Called { .. } => None,
    };
    events.iter().filter_map(of_phase).collect()
}

/// The caller's progress at each wait of `events`.
pub fn waits(events: &[Event]) -> Vec<u64> {
    let waited = |e: &Event| match *e {
        Event::Waited { progress } => Some(progress),
        Event::Started { .. } | Event::Called { .. } => None,
    };
    events.iter().filter_map(waited).collect()
}

/// Every collective started in phase `phase`, in order: its method's name
/// and its tensor's elements.
pub fn calls_in(events: &[Event], phase: usize) -> Vec<(String, usize)> {
    let call = |e: &Event| match e {
        Event::Started { phase: p, elements, blocking, .. } if *p == phase => {
            Some((if *blocking { "all_reduce" } else { "all_reduce_async" }.to_string(), *elements))
        }
        Event::Called { phase: p, collective, elements } if *p == phase => Some((collective.clone(), *elements)),
        _ => None,
    };
    events.iter().filter_map(call).collect()
}

/// `calls` said by collective, in the order each first appears:
/// `broadcast 21 times (5712 elements in all), all_reduce once (1 element)`.
pub fn said(calls: &[(String, usize)]) -> String {
    let mut kinds: Vec<(&str, usize, usize)> = vec![];
    for (name, elements) in calls {
        match kinds.iter_mut().find(|(kind, _, _)| kind == name) {
            Some((_, times, total)) => (*times, *total) = (*times + 1, *total + elements),
            None => kinds.push((name, 1, *elements)),
        }
    }
    let one = |(name, times, total): &(&str, usize, usize)| match (times, total) {
        (1, 1) => format!("{name} once (1 element)"),
        (1, _) => format!("{name} once ({total} elements)"),
        _ => format!("{name} {times} times ({total} elements in all)"),
    };
    kinds.iter().map(one).collect::<Vec<_>>().join(", ")
}
