//! One micro-batch of FSDP as the model's own forward and backward see it.
//!
//! The FSDP trainer runs the learner's `Gpt::forward` and `ForwardPass::backward`
//! on a model whose blocks are [`ShardedBlock`]s: each gathers its unit when
//! it runs, frees it when its forward kept no graph (activation
//! checkpointing), and reduce-scatters its gradient after its replay's
//! backward. Those hooks need the step's state (the units, the process group,
//! the policy, the memory ledger), which lives on the trainer's stack frame:
//! [`within`] lends it to them for the duration of one micro-batch, on this
//! thread, and nowhere else. A block used outside that window is an error.

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::ptr;

use candle_core::backprop::GradStore;
use candle_core::{bail, DType, Result, Tensor, Var};

use super::shard::bytes;
use super::{FlatView, MemoryLedger, MixedPrecisionPolicy, ShardedUnit, ShardingPlan};
use crate::distributed::ProcessGroup;
use crate::model::{GptConfig, Layers, OnDemand, RotaryCache};
use crate::timeline;

/// What the units' hooks need during one micro-batch.
pub(super) struct Step<'a> {
    pub units: RefCell<&'a mut Vec<ShardedUnit>>,
    pub pg: &'a dyn ProcessGroup,
    pub policy: &'a MixedPrecisionPolicy,
    pub plan: &'a ShardingPlan,
    pub model_config: &'a GptConfig,
    pub rotary: &'a RotaryCache,
    /// Micro-batches in the optimizer step: each gradient is divided by it.
    pub micro_batches: usize,
    pub memory: RefCell<&'a mut MemoryLedger>,
    pub gathered: Gathered,
}

/// The timeline's counter of the bytes of gathered units alive on a rank.
const GATHERED_COUNTER: &str = "gathered bytes";

/// The units' buffers gathered now, and their bytes (units that keep a
/// replica gather nothing, so count nothing).
#[derive(Default)]
pub(super) struct Gathered {
    buffers: RefCell<BTreeMap<usize, Var>>,
    bytes: Cell<u64>,
}

impl Step<'_> {
    /// Unit `index`'s whole buffer in the param dtype (one all-gather when it
    /// is sharded), kept as the unit's gathered buffer until released.
    pub fn gather(&self, index: usize) -> Result<Var> {
        let units = self.units.borrow();
        let unit = &units[index];
        let flat = unit.materialize(self.pg, self.policy)?;
        if unit.gathers() {
            let now = self.gathered.bytes.get() + bytes(flat.as_tensor());
            self.gathered.bytes.set(now);
            timeline::counter(GATHERED_COUNTER, now as f64);
            let mut memory = self.memory.borrow_mut();
            memory.gathered_peak = memory.gathered_peak.max(now);
        }
        if self.gathered.buffers.borrow_mut().insert(index, flat.clone()).is_some() {
            bail!("unit `{}` was gathered twice without being freed in between", unit.name);
        }
        Ok(flat)
    }

    /// Forgets unit `index`'s gathered buffer; it is freed once nothing else holds it.
    pub fn release(&self, index: usize) -> Option<Var> {
        let flat = self.gathered.buffers.borrow_mut().remove(&index)?;
        if self.units.borrow()[index].gathers() {
            let now = self.gathered.bytes.get() - bytes(flat.as_tensor());
            self.gathered.bytes.set(now);
            timeline::counter(GATHERED_COUNTER, now as f64);
        }
        Some(flat)
    }

    /// Bytes of gathered buffers alive now.
    pub fn gathered_bytes(&self) -> u64 {
        self.gathered.bytes.get()
    }

    /// The units whose buffers are still gathered, last first: those whose
    /// forward kept its graph, so their gradients come from the whole backward.
    pub fn still_gathered(&self) -> Vec<usize> {
        self.gathered.buffers.borrow().keys().rev().copied().collect()
    }

    /// Moves unit `index`'s gradient out of `grads` and reduces it: the
    /// gradient of its gathered buffer, divided by the micro-batch count as
    /// exercise 10 does, in the reduce dtype. Releases the buffer.
    pub fn reduce_gradient(&self, index: usize, grads: &mut GradStore) -> Result<()> {
        let Some(flat) = self.release(index) else {
            bail!("unit {index} has no gathered buffer to take a gradient for");
        };
        let Some(grad) = grads.remove(flat.as_tensor()) else {
            bail!("no gradient reached unit `{}`: the loss does not depend on it", self.units.borrow()[index].name);
        };
        drop(flat);
        let grad = grad.detach().to_dtype(DType::F32)?;
        let grad = if self.micro_batches == 1 { grad } else { (grad * (1.0 / self.micro_batches as f64))? };
        let mut units = self.units.borrow_mut();
        units[index].add_grad(grad.to_dtype(self.policy.reduce_dtype)?, self.pg, self.plan)?;
        let held: u64 = units.iter().map(ShardedUnit::grad_bytes).sum();
        let mut memory = self.memory.borrow_mut();
        memory.grads = memory.grads.max(held);
        Ok(())
    }

    /// The layers of block `layer` (unit `layer + 1`) on `flat`, its gathered buffer.
    fn layers(&self, layer: usize, flat: &Tensor) -> Result<Layers> {
        let units = self.units.borrow();
        let view = FlatView { flat, layout: &units[layer + 1].layout };
        Layers::new(self.model_config, &view, layer, self.rotary)
    }
}

/// A block of the model whose weights are its FSDP unit's, gathered on demand.
pub(super) struct ShardedBlock {
    pub layer: usize,
}

impl ShardedBlock {
    /// Its unit: the root is unit 0, block `layer` unit `layer + 1`.
    fn unit(&self) -> usize {
        self.layer + 1
    }
}

impl OnDemand for ShardedBlock {
    fn gather(&self) -> Result<Layers> {
        current(|step| {
            let flat = step.gather(self.unit())?;
            step.layers(self.layer, flat.as_tensor())
        })
    }

    fn release(&self) {
        let _ = current(|step| Ok(step.release(self.unit())));
    }

    fn take_gradient(&self, grads: &mut GradStore) -> Result<()> {
        current(|step| step.reduce_gradient(self.unit(), grads))
    }
}

thread_local! {
    /// The step lent by [`within`] on this thread, type-erased; null outside it.
    static CURRENT: Cell<*const ()> = const { Cell::new(ptr::null()) };
}

/// Runs `work` with `step` lent to the blocks' hooks on this thread.
pub(super) fn within<R>(step: &Step<'_>, work: impl FnOnce() -> R) -> R {
    struct Restore(*const ());
    impl Drop for Restore {
        fn drop(&mut self) {
            CURRENT.with(|current| current.set(self.0));
        }
    }
    let _restore = Restore(CURRENT.with(|current| current.replace(step as *const Step<'_> as *const ())));
    work()
}

/// Calls `f` with the step lent by [`within`].
fn current<R>(f: impl for<'s> FnOnce(&'s Step<'s>) -> Result<R>) -> Result<R> {
    let lent = CURRENT.with(Cell::get);
    if lent.is_null() {
        bail!("an FSDP block ran outside its trainer's step: only FsdpTrainer::train_step can run it");
    }
    // SAFETY: `lent` was set by `within` from a `&Step` that outlives the
    // `work` it runs, and is reset before `within` returns (or unwinds); `f`
    // runs inside that window, on the same thread, and gets only a shared
    // borrow, whose lifetime cannot escape `f` (it is higher-ranked and `R`
    // is chosen by the caller). The step's mutable parts are `RefCell`s.
    let step = unsafe { &*(lent as *const Step<'_>) };
    f(step)
}
