//! Distributed data parallel: every rank holds the whole model, trains on its
//! own slice of the batch, and averages gradients with the others before each
//! optimizer step, so all replicas take the same step and stay identical.
//!
//! Two things make it cheap:
//! - **buckets**: gradients travel in a few large all-reduces of ~25 MiB rather
//!   than one small call per parameter (each call has a fixed latency cost);
//! - **no synchronisation during accumulation**: with k micro-batches the
//!   gradients are summed locally and averaged across ranks once, after the
//!   last one (PyTorch's `no_sync()`), not k times.
//!
//! Buckets are filled in parameter-name order, which is the same on every rank:
//! all ranks must issue the same collectives in the same order.

mod comm;
mod overlap;

use candle_core::Result;

use crate::autograd::Gradients;
use crate::distributed::{ProcessGroup, SingleProcess};
use crate::model::ParamStore;
use crate::parallel::powersgd::PowerSgdHook;
pub use comm::{average_in_buckets, broadcast_parameters};

/// PyTorch DDP's default bucket size.
pub const DEFAULT_BUCKET_BYTES: usize = 25 * 1024 * 1024;

pub struct Ddp {
    pg: Box<dyn ProcessGroup>,
    bucket_bytes: usize,
    /// Gradients compressed to low rank before they are averaged (exercise 18).
    powersgd: Option<PowerSgdHook>,
    /// Buckets all-reduced during backward (exercise 19), not after it.
    overlap: bool,
    syncs: u64,
}

impl Ddp {
    pub fn new(pg: Box<dyn ProcessGroup>) -> Self {
        Self { pg, bucket_bytes: DEFAULT_BUCKET_BYTES, powersgd: None, overlap: false, syncs: 0 }
    }

    /// One process, no communication.
    pub fn single() -> Self {
        Self::new(Box::new(SingleProcess::new()))
    }

    pub fn with_bucket_bytes(mut self, bytes: usize) -> Self {
        self.bucket_bytes = bytes.max(1);
        self
    }

    /// Averages matrix gradients as rank-`approx_rank` PowerSGD estimates,
    /// through the learner's exercise 18.
    pub fn with_powersgd(mut self, approx_rank: usize) -> Self {
        self.powersgd = Some(PowerSgdHook::new(approx_rank));
        self
    }

    /// All-reduces each bucket during backward, as soon as backward has made
    /// its gradients, through the learner's exercise 19 (the trainer then
    /// takes its step with `Trainer::overlapped_train_step`).
    pub fn with_overlap(mut self) -> Self {
        self.overlap = true;
        self
    }

    /// Whether buckets are all-reduced during backward.
    pub fn overlaps(&self) -> bool {
        self.overlap
    }

    pub fn rank(&self) -> usize {
        self.pg.rank()
    }

    pub fn world_size(&self) -> usize {
        self.pg.world_size()
    }

    pub fn process_group(&self) -> &dyn ProcessGroup {
        self.pg.as_ref()
    }

    /// Copies rank 0's parameters to every rank, so all replicas start equal.
    pub fn broadcast_parameters(&self, params: &ParamStore) -> Result<()> {
        broadcast_parameters(self.pg.as_ref(), params)
    }

    /// Averages `grads` across ranks, in buckets. Call once per optimizer step,
    /// after the last micro-batch's backward.
    pub fn sync_gradients(&mut self, grads: &mut Gradients) -> Result<()> {
        self.syncs += 1;
        match &mut self.powersgd {
            Some(hook) => hook.average(self.pg.as_ref(), grads, self.bucket_bytes),
            None => average_in_buckets(self.pg.as_ref(), grads, self.bucket_bytes),
        }
    }

    /// How many times [`Ddp::sync_gradients`] ran: one per optimizer step when accumulation is right.
    pub fn syncs(&self) -> u64 {
        self.syncs
    }
}
