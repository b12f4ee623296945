//! One FSDP unit on one rank: what it keeps of the parameters, gradients and
//! optimizer state, the slot that holds its whole parameters while it
//! computes, and the collectives that move them around a step.
//!
//! The unit step (exercise 22) sees a unit through [`shard`](ShardedUnit::shard),
//! [`unshard`](ShardedUnit::unshard), [`forward`](ShardedUnit::forward),
//! [`reshard`](ShardedUnit::reshard) and [`add_grad`](ShardedUnit::add_grad),
//! over the unit's *parameter group*: the ranks its parameters are sharded
//! across. Under FULL_SHARD that is the shard group; a strategy that keeps
//! parameters whole (SHARD_GRAD_OP, NO_SHARD, ZeRO-1) gives this rank alone,
//! so the unit step's all-gather and reduce-scatter move nothing. Everything a
//! strategy adds (reducing gradients that are sharded while parameters are
//! not, HYBRID_SHARD's all-reduce across replicas, precision, the optimizer
//! step) happens here, called by the trainer around the unit step.

use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use candle_core::backprop::GradStore;
use candle_core::{bail, DType, Device, Module, Result, Tensor, Var};

use super::offload::{OffloadFile, Parts, StepOnly};
use super::{comm, DecayRuns, FlatLayout, MemoryLedger, MixedPrecisionPolicy, ShardingPlan, UnitParams};
use crate::distributed::ProcessGroup;
use crate::distributed::SharedGroup;
use crate::model::{GptConfig, Layers, ParamStore, RotaryCache};
use crate::parallel::tensor::{BlockStep, TensorParallelBlock};
use crate::parallel::zero::update_piece;
use crate::timeline;
use crate::train::{AdamWConfig, Moments};

/// A unit's state on this rank. Flat buffers throughout, laid out by `layout`.
pub struct ShardedUnit {
    pub name: String,
    pub layout: FlatLayout,
    /// The block this unit holds; `None` for the root unit, which the trainer
    /// runs around the blocks.
    block: Option<BlockCompute>,
    /// The elements this rank's optimizer updates: its shard, or all of them.
    local: Range<usize>,
    /// The whole buffer in the param dtype, kept between steps when parameters
    /// are not sharded.
    replica: Option<Var>,
    /// f32 master weights over `local`, unless an f32 replica already holds them.
    master: Option<StepOnly>,
    param_dtype: DType,
    /// The dtype gradients are reduced and accumulated in.
    reduce_dtype: DType,
    device: Device,
    /// The shard handed to the prefetching group for this pass:
    /// [`shard`](Self::shard) returns this very tensor until the pass ends,
    /// so that the group knows each all-gather by its input.
    pass_shard: Option<Tensor>,
    /// The whole parameters while the unit computes: one variable per
    /// parameter, in layout order, so a backward through the block gives
    /// each its gradient.
    whole: Option<Vec<Var>>,
    /// What the unit step handed over with `add_grad` since the last `take_grad`, summed.
    added: Option<Tensor>,
    /// Set by [`fold_into_step`](Self::fold_into_step): `add_grad` sums each
    /// shard straight into `grad`, for a step of this many micro-batches.
    fold: Option<usize>,
    /// Whether `add_grad` folded a shard in since the last micro-batch ended.
    folded: bool,
    /// Which pass the unit step is in, for the timeline.
    pass: Pass,
    /// The timeline's span of a block while it is whole: its compute, from
    /// gather to free.
    whole_span: Option<timeline::Span>,
    /// This step's gradient so far, in the reduce dtype: over `local` once
    /// reduce-scattered, the whole buffer while it is not.
    grad: Option<Tensor>,
    /// The elements of that gradient at its largest: `local`'s when the plan
    /// shards gradients, the whole buffer's when the step reduces them
    /// (ZeRO-1, NO_SHARD).
    step_grad_len: usize,
    /// AdamW's moments over `local`, f32.
    exp_avg: StepOnly,
    exp_avg_sq: StepOnly,
    /// Each element's weight decay over `local`.
    decays: DecayRuns,
    gathered: Arc<GatheredBytes>,
}

/// The pass a unit computes in, as the timeline names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Pass {
    #[default]
    Forward,
    Backward,
}

/// What running a block's unit needs besides its parameters.
pub(crate) struct BlockCompute {
    pub layer: usize,
    pub config: GptConfig,
    pub rotary: RotaryCache,
    /// Under FSDP × TP, the tensor-parallel group the unit's parameters
    /// (this rank's shards of the block) are split across, and the exercise
    /// that runs the split block.
    pub split: Option<(SharedGroup, BlockStep)>,
}

/// Bytes of gathered parameters in the slots of one rank's units: now, and
/// the most at any time since the last reset.
#[derive(Debug, Default)]
pub struct GatheredBytes {
    now: AtomicU64,
    peak: AtomicU64,
}

/// The timeline's counter of the bytes of gathered units alive on a rank.
const GATHERED_COUNTER: &str = "gathered bytes";

impl GatheredBytes {
    pub(crate) fn add(&self, bytes: u64) {
        let now = self.now.fetch_add(bytes, Ordering::Relaxed) + bytes;
        self.peak.fetch_max(now, Ordering::Relaxed);
        timeline::counter(GATHERED_COUNTER, now as f64);
    }

    pub(crate) fn remove(&self, bytes: u64) {
        let now = self.now.fetch_sub(bytes, Ordering::Relaxed) - bytes;
        timeline::counter(GATHERED_COUNTER, now as f64);
    }

    /// The bytes held now.
    pub fn now(&self) -> u64 {
        self.now.load(Ordering::Relaxed)
    }

    /// The most bytes held at once since the last [`reset_peak`](Self::reset_peak).
    pub fn peak(&self) -> u64 {
        self.peak.load(Ordering::Relaxed)
    }

    /// Starts a new peak from what is held now.
    pub fn reset_peak(&self) {
        self.peak.store(self.now.load(Ordering::Relaxed), Ordering::Relaxed);
    }
}

/// What a rank holds of a unit's f32 state over its local range: the master
/// weights and AdamW's two moments. The unit of exercise 15's checkpoints.
#[derive(Debug, Clone)]
pub struct LocalState {
    pub params: Tensor,
    pub exp_avg: Tensor,
    pub exp_avg_sq: Tensor,
}

/// One parameter of a unit, whole, as exercise 15 gathers it for a
/// checkpoint: its f32 value and, when asked for, AdamW's two moments of it
/// (`exp_avg`, `exp_avg_sq`), each of the parameter's shape.
#[derive(Debug, Clone)]
pub struct WholeParam {
    pub name: String,
    pub value: Tensor,
    pub moments: Option<[Tensor; 2]>,
}

/// How a rank holds its units: what the plan shards, in which dtypes, across
/// how many ranks, and the count of gathered bytes they share.
pub(crate) struct UnitPlacement<'a> {
    pub plan: &'a ShardingPlan,
    pub policy: &'a MixedPrecisionPolicy,
    /// This rank's place in the shard group, and the group's size.
    pub rank: usize,
    pub world_size: usize,
    pub gathered: Arc<GatheredBytes>,
}

impl ShardedUnit {
    /// Shards `full`, the unit's whole padded f32 buffer (the same on every
    /// rank); `block` is the block it holds, `None` for the root unit.
    pub(crate) fn new(
        name: String,
        layout: FlatLayout,
        full: &Tensor,
        block: Option<BlockCompute>,
        at: &UnitPlacement<'_>,
        weight_decay_of: impl Fn(&str) -> f64,
    ) -> Result<Self> {
        let local = match at.plan.optimizer_state {
            true => layout.shard_range(at.rank, at.world_size),
            false => 0..layout.padded_len(),
        };
        let param_dtype = at.policy.param_dtype;
        let replica = match at.plan.params {
            true => None,
            false => Some(Var::from_tensor(&full.to_dtype(param_dtype)?)?),
        };
        let master_in_replica = replica.is_some() && param_dtype == DType::F32;
        let master = match master_in_replica {
            true => None,
            false => Some(full.narrow(0, local.start, local.len())?.force_contiguous()?),
        };
        let decays = layout.decay_runs(local.clone(), weight_decay_of);
        let (len, layout_len, device) = (local.len(), layout.padded_len(), full.device());
        let zeros = || Tensor::zeros(len, DType::F32, device);
        Ok(Self {
            name,
            layout,
            block,
            local,
            replica,
            master: master.map(StepOnly::InMemory),
            device: device.clone(),
            pass_shard: None,
            param_dtype,
            reduce_dtype: at.policy.reduce_dtype,
            whole: None,
            added: None,
            fold: None,
            folded: false,
            pass: Pass::default(),
            whole_span: None,
            grad: None,
            step_grad_len: if at.plan.grads { len } else { layout_len },
            exp_avg: StepOnly::InMemory(zeros()?),
            exp_avg_sq: StepOnly::InMemory(zeros()?),
            decays,
            gathered: at.gathered.clone(),
        })
    }

    /// The block this unit holds. The root unit holds none; the unit step never sees it.
    pub fn layer(&self) -> usize {
        self.block.as_ref().map(|b| b.layer).expect("the root unit holds no block")
    }

    /// This rank's part of the unit's parameters over its parameter group,
    /// in the param dtype: P'/N elements, where P' is the padded parameter
    /// count and N the group's size (1 when parameters are kept whole).
    /// Under mixed precision it is cast from the f32 master shard each time,
    /// as PyTorch's FSDP does, so that no 16-bit shard is kept between uses.
    pub fn shard(&self) -> Result<Tensor> {
        if let Some(held) = &self.pass_shard {
            return Ok(held.clone());
        }
        match &self.replica {
            Some(replica) => Ok(replica.as_tensor().clone()),
            None => self.master_params()?.to_dtype(self.param_dtype),
        }
    }

    /// Makes [`shard`](Self::shard) hand out one tensor until
    /// [`release_shard`](Self::release_shard), and returns it.
    pub(crate) fn hold_shard(&mut self) -> Result<Tensor> {
        self.pass_shard = None;
        let shard = self.shard()?;
        self.pass_shard = Some(shard.clone());
        Ok(shard)
    }

    /// Ends [`hold_shard`](Self::hold_shard): a 16-bit shard is cast anew at each call again.
    pub(crate) fn release_shard(&mut self) {
        self.pass_shard = None;
    }

    /// Elements of [`shard`](Self::shard).
    fn shard_len(&self) -> usize {
        match self.replica {
            Some(_) => self.layout.padded_len(),
            None => self.local.len(),
        }
    }

    /// The unit's whole parameters while it is unsharded: one variable per
    /// parameter, in the layout's order.
    pub fn whole(&self) -> Option<&[Var]> {
        self.whole.as_deref()
    }

    /// The gradient of the unit's whole flat parameters in `grads` (a
    /// backward through [`forward`](Self::forward) while the unit is whole):
    /// P' elements in the reduce dtype, laid out as the parameters, padding
    /// zero; a parameter the backward did not reach has a zero gradient.
    /// `None` when the unit is not whole or no parameter of it has a gradient.
    pub fn flat_grad(&self, grads: &GradStore) -> Result<Option<Tensor>> {
        let Some(params) = &self.whole else { return Ok(None) };
        self.lay_out(params.iter().map(|p| grads.get(p.as_tensor()).cloned()).collect())
    }

    /// One flat gradient of the parameters' gradients, in layout order; a
    /// parameter without one gets zeros. `None` when none has one.
    pub(crate) fn lay_out(&self, grads: Vec<Option<Tensor>>) -> Result<Option<Tensor>> {
        if grads.iter().all(Option::is_none) {
            return Ok(None);
        }
        self.layout.concat(grads, self.reduce_dtype, &self.device).map(Some)
    }

    /// Bytes of the unit's whole parameters in the param dtype, padding included.
    fn whole_bytes(&self) -> u64 {
        (self.layout.padded_len() * self.param_dtype.size_in_bytes()) as u64
    }

    /// Fills the slot with `whole`, the all-gather of every rank's shard, so
    /// that [`forward`](Self::forward) can run. The slot holds each parameter
    /// as a variable of its own: a backward through the block gives their
    /// gradient, which [`flat_grad`](Self::flat_grad) lays out flat.
    pub fn unshard(&mut self, whole: Tensor) -> Result<()> {
        if self.whole.is_some() {
            bail!("unit `{}` is already unsharded: reshard it after its forward before gathering it again", self.name);
        }
        if whole.dims() != [self.layout.padded_len()] {
            bail!(
                "unit `{}` takes its whole flat parameters, {} elements (the all-gather of every rank's shard of {}), \
                 got a tensor of shape {:?}",
                self.name,
                self.layout.padded_len(),
                self.shard_len(),
                whole.dims()
            );
        }
        let params = self.layout.split(&whole.to_dtype(self.param_dtype)?)?;
        if self.gathers() {
            self.gathered.add(self.whole_bytes());
        }
        self.whole = Some(params);
        if let Some(block) = &self.block {
            let pass = match self.pass {
                Pass::Forward => "forward",
                Pass::Backward => "backward",
            };
            self.whole_span = Some(timeline::span("compute", format!("{pass}, module {}", block.layer)));
        }
        Ok(())
    }

    /// Empties the slot: the whole parameters are freed once nothing else
    /// (a graph that read them, say) holds them. The shard stays, and so does
    /// a replica the strategy keeps.
    pub fn reshard(&mut self) {
        self.whole_span = None;
        if self.whole.take().is_some() && self.gathers() {
            self.gathered.remove(self.whole_bytes());
        }
    }

    /// The block on the whole parameters in the slot: (B, T, C) to (B, T, C).
    /// Its graph reaches the whole parameters, and `x` when it is a variable.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let Some(block) = &self.block else {
            bail!("unit `{}` holds no block: the trainer runs the root unit around the blocks", self.name);
        };
        let Some(whole) = &self.whole else {
            bail!("unit `{}` is sharded: all-gather its shards and unshard it before running it", self.name);
        };
        let Some((tp, step)) = &block.split else {
            let params = UnitParams { params: whole, layout: &self.layout };
            return Layers::new(&block.config, &params, block.layer, &block.rotary)?.forward(x);
        };
        let shards = ParamStore::from_vars(self.layout.names().map(String::from).zip(whole.iter().cloned()));
        let split = TensorParallelBlock::of_shards(&block.config, shards, block.layer, tp.world_size(), &block.rotary)?;
        step.run(tp, &split, x)
    }

    /// Adds `shard_grad`, this rank's part (as [`shard`](Self::shard)'s) of
    /// a gradient of the whole flat parameters, to the unit's gradient.
    pub fn add_grad(&mut self, shard_grad: &Tensor) -> Result<()> {
        if shard_grad.dims() != [self.shard_len()] {
            bail!(
                "unit `{}` keeps a gradient shard of {} elements, like its parameter shard; got a tensor of shape {:?}. \
                 Reduce-scatter the whole buffer's gradient so that each rank keeps only its shard",
                self.name,
                self.shard_len(),
                shard_grad.dims()
            );
        }
        let shard_grad = shard_grad.detach().to_dtype(DType::F32)?;
        if let Some(micro_batches) = self.fold {
            self.folded = true;
            return self.add_to_step(for_the_step(shard_grad, micro_batches, self.reduce_dtype)?);
        }
        self.added = Some(match self.added.take() {
            Some(sum) => (sum + shard_grad)?,
            None => shard_grad,
        });
        Ok(())
    }

    /// The gradient shards added so far, summed.
    pub fn grad(&self) -> Option<&Tensor> {
        self.added.as_ref()
    }

    /// The gradient shards added so far, summed, leaving none.
    pub fn take_grad(&mut self) -> Option<Tensor> {
        self.added.take()
    }

    /// Replaces this rank's shard of a unit whose parameters are sharded,
    /// with what an optimizer step made of it.
    pub fn set_shard(&mut self, shard: &Tensor) -> Result<()> {
        if self.replica.is_some() || shard.dims() != [self.local.len()] {
            bail!(
                "unit `{}` keeps a shard of {} elements, got a tensor of shape {:?}",
                self.name,
                self.shard_len(),
                shard.dims()
            );
        }
        let Some(master) = &mut self.master else { unreachable!("a unit without a replica keeps f32 master weights") };
        master.set(shard.detach().to_dtype(DType::F32)?)
    }

    /// The most bytes the slots of this rank's units held at once.
    pub fn peak_gathered_bytes(&self) -> u64 {
        self.gathered.peak()
    }

    /// The count of bytes the slots of this rank's units hold, which they share.
    pub fn gathered_bytes(&self) -> Arc<GatheredBytes> {
        Arc::clone(&self.gathered)
    }

    /// The unit's layout: where each of its parameters sits in the flat buffer.
    pub fn layout(&self) -> &FlatLayout {
        &self.layout
    }

    /// Names the unit's compute on the timeline as part of `pass` from now on.
    pub(crate) fn set_pass(&mut self, pass: Pass) {
        self.pass = pass;
    }

    /// Whether this rank updates only a shard of the unit (so a full view needs an all-gather).
    pub fn is_sharded(&self) -> bool {
        self.local.len() != self.layout.padded_len()
    }

    /// The elements of the flat buffer this rank updates.
    pub fn local_range(&self) -> Range<usize> {
        self.local.clone()
    }

    /// Whether computing with the unit needs an all-gather first.
    pub fn gathers(&self) -> bool {
        self.replica.is_none()
    }

    /// From now on, when the unit gathers (what the unit step reduce-scatters
    /// is final), each shard `add_grad` is handed joins the step's gradient
    /// at once, divided by the step's `micro_batches` and in the reduce dtype,
    /// as [`end_micro_batch`](Self::end_micro_batch) would add it: a
    /// micro-batch's shards are then never held beside the step's gradient
    /// (12 blocks' at GPT-2's shape: 160 MiB on each of 2 ranks).
    pub(crate) fn fold_into_step(&mut self, micro_batches: usize) {
        self.fold = self.gathers().then_some(micro_batches);
    }

    /// After a micro-batch's backward: moves what the unit step added into
    /// the step's gradient, divided by the `micro_batches` of the step as
    /// exercise 10 does, in the reduce dtype. When parameters are kept whole
    /// the unit step reduced nothing, and sharded gradients are
    /// reduce-scattered over the shard group `pg` now.
    pub(crate) fn end_micro_batch(
        &mut self,
        pg: &dyn ProcessGroup,
        plan: &ShardingPlan,
        micro_batches: usize,
    ) -> Result<()> {
        let reached = match self.fold {
            Some(_) => std::mem::take(&mut self.folded),
            None => self.added.is_some(),
        };
        if !reached {
            bail!("no gradient reached unit `{}`: the loss does not depend on it", self.name);
        }
        let Some(added) = self.added.take() else { return Ok(()) }; // folded in as it came
        let added = for_the_step(added, micro_batches, self.reduce_dtype)?;
        let reduced = match self.gathers() {
            true => added,
            false => comm::reduce_micro_batch(pg, added, plan)?,
        };
        self.add_to_step(reduced)
    }

    /// Adds `part` to the step's gradient.
    fn add_to_step(&mut self, part: Tensor) -> Result<()> {
        self.grad = Some(match self.grad.take() {
            Some(sum) => (sum + part)?,
            None => part,
        });
        Ok(())
    }

    /// After the last micro-batch: the step's gradient averaged over ranks,
    /// over `local`, in f32. Gradients not yet reduced are reduced now, once,
    /// over the shard group `pg` and then the `replicas`, if any.
    pub(crate) fn take_reduced_grad(
        &mut self,
        pg: &dyn ProcessGroup,
        replicas: Option<&dyn ProcessGroup>,
        plan: &ShardingPlan,
    ) -> Result<Tensor> {
        let Some(grad) = self.grad.take() else {
            bail!("unit `{}` has no gradient: run a micro-batch before the step", self.name);
        };
        comm::reduce_step(pg, replicas, grad, plan)?.to_dtype(DType::F32)
    }

    /// One AdamW step of the local range with `grad` (f32 over `local`), in
    /// pieces of [`STEP_CHUNK`] elements, each by exercise 17's shard update,
    /// then the replica refreshed (an all-gather when the optimizer is sharded).
    pub(crate) fn step(
        &mut self,
        grad: &Tensor,
        lr: f64,
        t: u64,
        adamw: &AdamWConfig,
        pg: &dyn ProcessGroup,
    ) -> Result<()> {
        let len = self.local.len();
        let (mut params, mut exp_avg, mut exp_avg_sq) = (vec![], Parts::default(), Parts::default());
        for start in (0..len).step_by(STEP_CHUNK) {
            let range = start..len.min(start + STEP_CHUNK);
            let decayed =
                FlatLayout::decayed(&self.master_range(range.clone())?, &self.decays.slice(range.clone()), lr)?;
            let moments = Moments {
                exp_avg: self.exp_avg.get_range(range.clone())?,
                exp_avg_sq: self.exp_avg_sq.get_range(range.clone())?,
            };
            let grad = grad.narrow(0, start, range.len())?;
            let (new_p, moments) = update_piece(adamw, (t, lr), &decayed, &grad, moments)?;
            self.exp_avg.put_part(&mut exp_avg, &moments.exp_avg)?;
            self.exp_avg_sq.put_part(&mut exp_avg_sq, &moments.exp_avg_sq)?;
            params.push(new_p);
        }
        self.exp_avg.end_parts(exp_avg)?;
        self.exp_avg_sq.end_parts(exp_avg_sq)?;
        self.set_master_params(Tensor::cat(&params, 0)?, pg)
    }

    /// The f32 state over the local range.
    pub fn local_state(&self) -> Result<LocalState> {
        Ok(LocalState {
            params: self.master_params()?,
            exp_avg: self.exp_avg.get()?,
            exp_avg_sq: self.exp_avg_sq.get()?,
        })
    }

    /// Replaces the f32 state over the local range (each tensor `local_range().len()` long).
    pub(crate) fn set_local_state(&mut self, state: LocalState, pg: &dyn ProcessGroup) -> Result<()> {
        for (what, t) in [("params", &state.params), ("exp_avg", &state.exp_avg), ("exp_avg_sq", &state.exp_avg_sq)] {
            if t.dims() != [self.local.len()] {
                bail!(
                    "unit `{}`: {what} of shape {:?} does not fit this rank's range of {} elements ({}..{} of {})",
                    self.name,
                    t.dims(),
                    self.local.len(),
                    self.local.start,
                    self.local.end,
                    self.layout.padded_len()
                );
            }
        }
        let f32 = |t: &Tensor| t.to_dtype(DType::F32)?.force_contiguous();
        self.exp_avg.set(f32(&state.exp_avg)?)?;
        self.exp_avg_sq.set(f32(&state.exp_avg_sq)?)?;
        self.set_master_params(f32(&state.params)?, pg)
    }

    /// Moves the moments and the f32 master shard into `file`: the step
    /// reads them back, and each all-gather its shard (as PyTorch's
    /// `offload_params` copies a shard to the GPU before its all-gather).
    pub(crate) fn offload_to(&mut self, file: &Arc<OffloadFile>) -> Result<()> {
        self.exp_avg.offload_to(file)?;
        self.exp_avg_sq.offload_to(file)?;
        match &mut self.master {
            Some(master) => master.offload_to(file),
            None => Ok(()),
        }
    }

    /// What the unit holds between steps, in memory (params in the compute
    /// dtype, f32 master, moments) and offloaded to a file, and the gradient
    /// buffer a step fills at its largest, in the reduce dtype. Nothing
    /// gathered (see [`peak_gathered_bytes`](Self::peak_gathered_bytes)).
    pub(crate) fn held_memory(&self) -> MemoryLedger {
        let master = self.master.as_ref().map_or((0, 0), StepOnly::bytes);
        let (exp_avg, exp_avg_sq) = (self.exp_avg.bytes(), self.exp_avg_sq.bytes());
        MemoryLedger {
            params: self.replica.as_ref().map_or(0, |v| bytes(v.as_tensor())),
            master_params: master.0,
            grads: (self.step_grad_len * self.reduce_dtype.size_in_bytes()) as u64,
            optimizer_state: exp_avg.0 + exp_avg_sq.0,
            offloaded: master.1 + exp_avg.1 + exp_avg_sq.1,
            ..MemoryLedger::default()
        }
    }

    fn master_params(&self) -> Result<Tensor> {
        self.master_range(0..self.local.len())
    }

    /// Elements `range` of the local range's f32 master weights.
    fn master_range(&self, range: Range<usize>) -> Result<Tensor> {
        match (&self.master, &self.replica) {
            (Some(master), _) => master.get_range(range),
            (None, Some(replica)) => replica.as_tensor().narrow(0, self.local.start + range.start, range.len()),
            (None, None) => unreachable!("a unit without a replica keeps f32 master weights"),
        }
    }

    fn set_master_params(&mut self, p: Tensor, pg: &dyn ProcessGroup) -> Result<()> {
        if let Some(replica) = &self.replica {
            let low = p.to_dtype(self.param_dtype)?;
            let whole = if self.is_sharded() { comm::gather_unit(pg, &low)? } else { low };
            replica.set(&whole)?;
        }
        if let Some(master) = &mut self.master {
            master.set(p)?;
        }
        Ok(())
    }

    /// Where the unit's tensors live.
    pub fn device(&self) -> &Device {
        &self.device
    }
}

/// Elements of a unit's local range that one piece of its optimizer step
/// updates: the step's temporaries then take a few times this many floats
/// rather than a few times the unit's (the root unit holds the vocabulary's
/// embedding and head), and offloaded state comes back a piece at a time.
const STEP_CHUNK: usize = 1 << 16;

/// A micro-batch's gradient as the step adds it: divided by the step's
/// `micro_batches`, as exercise 10 does, in the reduce `dtype`.
fn for_the_step(grad: Tensor, micro_batches: usize, dtype: DType) -> Result<Tensor> {
    let grad = if micro_batches == 1 { grad } else { (grad * (1.0 / micro_batches as f64))? };
    grad.to_dtype(dtype)
}

pub(crate) fn bytes(t: &Tensor) -> u64 {
    (t.elem_count() * t.dtype().size_in_bytes()) as u64
}

#[cfg(test)]
mod tests {
    use candle_core::{Device, Result, Var};

    use crate::autograd::vjp;
    use crate::model::{init_params, GptConfig, InitRng};
    use crate::parallel::fsdp_unit::BlockUnit;

    /// A backward through a gathered unit gives each parameter a gradient of
    /// its own size, which `flat_grad` lays out flat: no gradient the size of
    /// the whole unit is made per parameter, as the backward of views of one
    /// flat buffer would.
    #[test]
    fn a_gathered_unit_gets_one_gradient_per_parameter_and_one_flat_gradient() -> Result<()> {
        let config = GptConfig {
            vocab_size: 16,
            hidden_size: 8,
            num_layers: 1,
            num_heads: 2,
            num_kv_heads: None,
            intermediate_size: 12,
            max_seq_len: 4,
            rope_theta: 10_000.0,
            norm_eps: 1e-5,
            bias: false,
            tie_word_embeddings: false,
        };
        let params = init_params(&config, 7, &Device::Cpu)?;
        let mut units = BlockUnit::shard_blocks(&config, &params, 0, 1)?;
        let unit = &mut units[0];
        unit.unshard(unit.shard()?)?;
        let x = Var::from_tensor(&InitRng::from_seed(8).normal(&(2, 4, 8).into(), 1.0, &Device::Cpu)?)?;
        let y = unit.forward(x.as_tensor())?;
        let grads = vjp(&y, &y.ones_like()?)?;
        let padded = unit.layout().padded_len();
        for id in grads.get_ids() {
            let size = grads.get_id(*id).map_or(0, |g| g.elem_count());
            assert!(size < padded, "a gradient of {size} elements, the whole unit's {padded}, was made");
        }
        let Some(flat) = unit.flat_grad(&grads)? else { panic!("the unit's parameters got no gradient") };
        let whole = unit.whole().expect("the unit is gathered");
        for (param, (name, laid_out)) in whole.iter().zip(unit.layout().unflatten(&flat)?) {
            let own = grads.get(param.as_tensor()).expect("every parameter of the block gets a gradient");
            let difference = (own - laid_out)?.abs()?.max_all()?.to_scalar::<f32>()?;
            assert_eq!(difference, 0.0, "`{name}`'s gradient is not where the layout puts it");
        }
        Ok(())
    }
}
