//! Prefetching, PyTorch FSDP's `forward_prefetch` and
//! `backward_prefetch=BACKWARD_PRE`: while one unit computes, the next
//! unit's all-gather is already on the wire.
//!
//! The unit step (exercise 22) calls `all_gather` and waits for it, one unit
//! at a time. Prefetching lives around it, in the parameter group it is
//! given: told which shards the unit step will gather and in which order,
//! the group answers each from a gather it started one unit earlier, and
//! starts the next one before returning, so that it travels while the unit
//! computes. The price is memory: two units' whole parameters at once, the
//! one computing and the one arriving. On a backend that cannot overlap
//! (threads, a single process) the gathers are the same, done in turn.

use std::sync::{Arc, Mutex, PoisonError};

use candle_core::{Result, Tensor, TensorId};

use super::shard::{bytes, GatheredBytes};
use super::{Pass, ShardedUnit};
use crate::distributed::{CollectiveOverride, ProcessGroup, Work};

/// The parameter group's all-gather, prefetching; clones share one state.
#[derive(Clone)]
pub struct Prefetch {
    state: Arc<Mutex<Order>>,
}

/// The shards expected, and the gather on the wire for the next one.
struct Order {
    shards: Vec<Tensor>,
    in_flight: Option<InFlight>,
    /// The rank's count of gathered bytes, which an arriving unit is part of.
    gathered: Arc<GatheredBytes>,
}

struct InFlight {
    shard: TensorId,
    work: Work,
    bytes: u64,
}

impl Prefetch {
    /// Prefetching, an arriving unit counted in `gathered`, the rank's
    /// count of gathered bytes.
    pub fn new(gathered: Arc<GatheredBytes>) -> Self {
        let order = Order { shards: vec![], in_flight: None, gathered };
        Self { state: Arc::new(Mutex::new(order)) }
    }

    /// The shards the unit step will gather next, in the order it will gather them.
    pub fn expect(&self, shards: Vec<Tensor>) {
        self.lock().shards = shards;
    }

    /// Stops prefetching. A gather still on the wire is waited for and
    /// dropped: every rank started it, so every rank must finish it.
    pub fn finish(&self) -> Result<()> {
        let mut order = self.lock();
        order.shards.clear();
        order.settle()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Order> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Order {
    /// Waits out the gather on the wire, if any, and drops its result.
    fn settle(&mut self) -> Result<()> {
        match self.in_flight.take() {
            Some(stale) => {
                self.gathered.remove(stale.bytes);
                stale.work.wait().map(drop)
            }
            None => Ok(()),
        }
    }
}

impl CollectiveOverride for Prefetch {
    fn all_gather(&self, inner: &dyn ProcessGroup, t: &Tensor) -> Result<Tensor> {
        let mut order = self.lock();
        let Some(at) = order.shards.iter().position(|shard| shard.id() == t.id()) else {
            return inner.all_gather(t);
        };
        let whole = match order.in_flight.take() {
            Some(arriving) if arriving.shard == t.id() => {
                order.gathered.remove(arriving.bytes);
                arriving.work.wait()?
            }
            other => {
                order.in_flight = other;
                order.settle()?;
                inner.all_gather(t)?
            }
        };
        if let Some(next) = order.shards.get(at + 1).cloned() {
            let arriving_bytes = bytes(&next) * inner.world_size() as u64;
            order.gathered.add(arriving_bytes);
            let work = inner.all_gather_async(&next)?;
            order.in_flight = Some(InFlight { shard: next.id(), work, bytes: arriving_bytes });
        }
        Ok(whole)
    }
}

/// Runs `work`, the unit step on `blocks` in `pass`: the blocks name their
/// compute after it on the timeline, and with prefetching on, the parameter
/// group prefetches their shards in the order the pass gathers them.
pub(crate) fn in_pass<R>(
    prefetch: Option<&Prefetch>,
    blocks: &mut [ShardedUnit],
    pass: Pass,
    work: impl FnOnce(&mut [ShardedUnit]) -> Result<R>,
) -> Result<R> {
    blocks.iter_mut().for_each(|unit| unit.set_pass(pass));
    let Some(prefetch) = prefetch else { return work(blocks) };
    // The prefetching group knows a gather by its input: each unit hands
    // out one shard tensor for the whole pass.
    let held = blocks.iter_mut().map(ShardedUnit::hold_shard).collect::<Result<Vec<_>>>();
    let mut shards = match held {
        Ok(shards) => shards,
        Err(e) => {
            blocks.iter_mut().for_each(ShardedUnit::release_shard);
            return Err(e);
        }
    };
    if pass == Pass::Backward {
        shards.reverse();
    }
    prefetch.expect(shards);
    let done = work(blocks);
    blocks.iter_mut().for_each(ShardedUnit::release_shard);
    let settled = prefetch.finish();
    let done = done?;
    settled.map(|()| done)
}
