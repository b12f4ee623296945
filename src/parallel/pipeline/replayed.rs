//! A stage's blocks as FSDP units across the data-parallel group: exercise
//! 22 gathers, runs and frees each unit, keeping no graph in forward. A
//! forward keeps each block's input, found by the output the stage handed
//! out, and the stage's backward replays the units from them. Under FSDP ×
//! TP a unit holds this rank's shards of its block, and under sequence
//! parallelism the units run on this rank's chunk of the tokens, whole
//! activations entering and leaving the stage as elsewhere.
//!
//! The stage's other parameters (the embedding on the first stage, the
//! final norm and head on the last) are one more unit, its root, as
//! torchtitan shards the root after the blocks: gathered whole for an
//! evaluation, for a pipeline's step (whose schedule interleaves the
//! micro-batches), or with one stage for each micro-batch; its gradient is
//! then reduce-scattered, and only this rank's shard kept between uses. It
//! runs by `fsdp/root.rs`: the embedding keeps no graph and the head's
//! weight gradient is one matmul.
//!
//! What is sharded is exercise 12's plan: where it keeps parameters whole
//! (SHARD_GRAD_OP, NO_SHARD) the unit step runs over this rank alone, so
//! its collectives move nothing, and each micro-batch's gradient is reduced
//! over the shard group after its backward.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, PoisonError};

use candle_core::{bail, Result, Tensor, TensorId, Var};

use crate::autograd::Gradients;
use crate::called_early::{fsdp_backward, fsdp_forward};
use crate::distributed::{ProcessGroup, ReduceOp, SharedGroup, SingleProcess, WithOverride};
use crate::parallel::fsdp::{in_pass, HeadPass, Pass, Prefetch, ShardedUnit, ShardingPlan, UnitGroups};
use crate::parallel::fsdp_unit::BlockUnit;
use crate::parallel::tensor::{gather_sequence, own_tokens};

/// FSDP units replayed in backward, and what each forward in flight kept.
pub(super) struct ReplayedBlocks {
    /// Each block an FSDP unit across `shard`, and the root: this rank
    /// keeps its shards; under HYBRID_SHARD the shard groups are `replicas`
    /// of each other.
    units: Mutex<Units>,
    shard: SharedGroup,
    replicas: Option<SharedGroup>,
    /// What the units shard (exercise 12's plan).
    plan: ShardingPlan,
    /// This rank alone: the group the unit step runs over when the plan
    /// keeps parameters whole.
    alone: SharedGroup,
    /// Under sequence parallelism, the tensor-parallel group whose ranks
    /// each run a chunk of the tokens through the units.
    sequence: Option<SharedGroup>,
    /// With prefetching, what starts each unit's all-gather one unit early,
    /// and the shard group whose all-gathers it answers.
    prefetch: Option<(Prefetch, SharedGroup)>,
    in_flight: Mutex<HashMap<TensorId, Kept>>,
    /// What the forwards in flight keep for their backwards.
    activations: Mutex<HeldActivations>,
}

/// Bytes the forwards in flight keep for their backwards, now and at most
/// since the last reset (none yet, or one forward since that could not be
/// counted: then the peak is not known).
#[derive(Default)]
struct HeldActivations {
    now: u64,
    peak: Option<u64>,
    uncounted: bool,
}

/// What one forward keeps for its backward.
pub(super) struct Kept {
    /// The stage's input: the token ids (first stage), whose embedding's
    /// gradient needs nothing else, or the activation received, whose
    /// gradient goes back.
    pub input: Tensor,
    /// Each block's input, detached.
    pub block_inputs: Vec<Tensor>,
    /// On the last stage, what the head's backward needs.
    pub head: Option<HeadPass>,
    /// Bytes all that holds, as the ledger counts activations; `None` where
    /// the host's counting allocator cannot tell (see
    /// [`MemoryLedger::activations_peak`](crate::parallel::fsdp::MemoryLedger::activations_peak)).
    pub held: Option<u64>,
}

impl ReplayedBlocks {
    pub(super) fn new(
        mut units: Units,
        (shard, replicas): (SharedGroup, Option<SharedGroup>),
        plan: ShardingPlan,
        sequence: Option<SharedGroup>,
    ) -> Self {
        // A micro-batch's reduce-scattered shard joins the step's gradient as
        // it comes, never held beside it; the schedule weighed each
        // micro-batch's loss already, so it is divided by 1.
        for unit in units.iter_mut() {
            unit.fold_into_step(1);
        }
        Self {
            units: Mutex::new(units),
            shard,
            replicas,
            plan,
            alone: SharedGroup::new(Box::new(SingleProcess::new())),
            sequence,
            prefetch: None,
            in_flight: Mutex::new(HashMap::new()),
            activations: Mutex::default(),
        }
    }

    /// Gathers the next unit's parameters while one computes, in forward
    /// and in backward (`--prefetch`); the numbers do not change, and two
    /// units are whole at once.
    pub(super) fn prefetching(&mut self) -> Result<()> {
        let Some(gathered) = lock(&self.units).blocks.first().map(ShardedUnit::gathered_bytes) else {
            bail!("a stage of no blocks has nothing to prefetch")
        };
        let prefetch = Prefetch::new(gathered);
        let group = SharedGroup::new(Box::new(WithOverride::new(Box::new(self.shard.clone()), prefetch.clone())));
        self.prefetch = Some((prefetch, group));
        Ok(())
    }

    /// The group the unit step gathers over: the parameters' group,
    /// prefetching when asked and there is something to prefetch.
    fn gathering(&self) -> (&SharedGroup, Option<&Prefetch>) {
        match &self.prefetch {
            Some((prefetch, group)) if self.plan.params => (group, Some(prefetch)),
            _ => (self.params_group(), None),
        }
    }

    /// The ranks a unit's parameters are sharded across: the shard group,
    /// or this rank alone when the plan keeps them whole.
    fn params_group(&self) -> &SharedGroup {
        match self.plan.params {
            true => &self.shard,
            false => &self.alone,
        }
    }

    /// The root's whole parameters by name, all-gathered across the shard
    /// group, each a variable of its own; `None` for a stage without a root
    /// (one of blocks only).
    pub(super) fn gather_root(&self) -> Result<Option<Vec<(String, Var)>>> {
        let mut units = lock(&self.units);
        let Some(root) = units.root.as_mut() else { return Ok(None) };
        root.unshard(self.params_group().all_gather(&root.shard()?)?)?;
        let Some(whole) = root.whole() else { unreachable!("the root was just unsharded") };
        Ok(Some(root.layout().names().map(String::from).zip(whole.iter().cloned()).collect()))
    }

    /// Frees the root's whole parameters, after reduce-scattering their
    /// gradients, taken out of `grads`, into the root's gradient shard (or
    /// reducing them as the plan says, when parameters are kept whole).
    /// Without `grads` (an evaluation), frees them only.
    pub(super) fn reshard_root(&self, grads: Option<&mut Gradients>) -> Result<()> {
        let mut units = lock(&self.units);
        let Some(root) = units.root.as_mut() else { return Ok(()) };
        let Some(grads) = grads else {
            root.reshard();
            return Ok(());
        };
        let parts: Vec<_> = root.layout().names().map(|name| grads.remove(name)).collect();
        root.reshard();
        let Some(flat) = root.lay_out(parts)? else {
            bail!("no gradient reached unit `{}`: the loss does not depend on it", root.name);
        };
        root.add_grad(&self.params_group().reduce_scatter(&flat, ReduceOp::Avg)?)?;
        root.end_micro_batch(&self.shard, &self.plan, 1)
    }

    /// `x` (B, T, C) through the units, no graph kept: each unit's input,
    /// and the last unit's output, (B, T, C) whole.
    pub(super) fn forward(&self, x: &Tensor) -> Result<(Vec<Tensor>, Tensor)> {
        let (group, prefetch) = self.gathering();
        let x = self.own_tokens(x)?;
        let blocks = &mut lock(&self.units).blocks;
        let pass = in_pass(prefetch, blocks, Pass::Forward, |blocks| fsdp_forward(group, blocks, &x))?;
        Ok((pass.inputs, self.all_tokens(&pass.output)?))
    }

    /// Back through the units, last first, from `grad` (∂L/∂ the last
    /// output, whole and the same on every rank of a tensor-parallel
    /// group), from the inputs [`forward`](Self::forward) kept: each unit
    /// keeps its own shard of its gradients, reduced as the plan says.
    /// Returns ∂L/∂ the first unit's input, whole.
    pub(super) fn backward(&self, inputs: &[Tensor], grad: &Tensor) -> Result<Tensor> {
        let (group, prefetch) = self.gathering();
        let grad = self.own_tokens(grad)?;
        let blocks = &mut lock(&self.units).blocks;
        let grad = in_pass(prefetch, blocks, Pass::Backward, |blocks| fsdp_backward(group, blocks, inputs, &grad))?;
        // The schedule scaled each micro-batch's loss already: divide by 1.
        for unit in blocks.iter_mut() {
            unit.end_micro_batch(&self.shard, &self.plan, 1)?;
        }
        self.all_tokens(&grad)
    }

    /// This rank's chunk of the tokens under sequence parallelism; `t` otherwise.
    fn own_tokens(&self, t: &Tensor) -> Result<Tensor> {
        match &self.sequence {
            Some(tp) => own_tokens(tp, t),
            None => Ok(t.clone()),
        }
    }

    /// Every rank's chunk put together under sequence parallelism; `t` otherwise.
    fn all_tokens(&self, t: &Tensor) -> Result<Tensor> {
        match &self.sequence {
            Some(tp) => gather_sequence(tp, t),
            None => Ok(t.clone()),
        }
    }

    /// Keeps what the forward that returned `output` needs for its backward.
    pub(super) fn keep(&self, output: &Tensor, kept: Kept) {
        let mut activations = lock(&self.activations);
        match kept.held {
            Some(bytes) => activations.now += bytes,
            None => activations.uncounted = true,
        }
        activations.peak = Some(activations.peak.unwrap_or(0).max(activations.now));
        lock(&self.in_flight).insert(output.id(), kept);
    }

    /// What the forward that returned `output` kept, handed over.
    pub(super) fn take(&self, output: &Tensor) -> Option<Kept> {
        let kept = lock(&self.in_flight).remove(&output.id())?;
        let mut activations = lock(&self.activations);
        activations.now -= kept.held.unwrap_or(0).min(activations.now);
        Some(kept)
    }

    /// The most bytes the forwards in flight kept at once since the last
    /// [`reset_peaks`](Self::reset_peaks), and under a pipeline's schedule
    /// several are; `None` where they could not be counted.
    pub(super) fn activations_peak(&self) -> Option<u64> {
        let activations = lock(&self.activations);
        activations.peak.filter(|_| !activations.uncounted)
    }

    /// Starts new peaks of activations and gathered units from what is held now.
    pub(super) fn reset_peaks(&self) {
        let mut activations = lock(&self.activations);
        *activations = HeldActivations { now: activations.now, peak: None, uncounted: false };
        if let Some(unit) = lock(&self.units).iter().next() {
            unit.gathered_bytes().reset_peak();
        }
    }

    /// The units and their groups.
    pub(super) fn units(&self) -> HeldUnits<'_> {
        HeldUnits { units: lock(&self.units), shard: &self.shard, replicas: self.replicas.as_ref(), plan: &self.plan }
    }
}

/// A stage's FSDP units: its root (when the stage holds the embedding or
/// the head) and one per block.
pub struct Units {
    pub root: Option<ShardedUnit>,
    pub blocks: Vec<BlockUnit>,
}

impl Units {
    /// Every unit, the root first: the order every rank of a shard group
    /// goes through them in, collectives and all.
    pub fn iter(&self) -> impl Iterator<Item = &ShardedUnit> {
        self.root.iter().chain(&self.blocks)
    }

    pub fn iter_mut(&mut self) -> impl Iterator<Item = &mut ShardedUnit> {
        self.root.iter_mut().chain(&mut self.blocks)
    }

    /// How many units: the blocks', and the root if the stage has one.
    pub fn len(&self) -> usize {
        usize::from(self.root.is_some()) + self.blocks.len()
    }

    /// Never: a stage holds at least one block.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A stage's FSDP units, held for a step or a checkpoint, with the group
/// they are sharded over and, under HYBRID_SHARD, the group of ranks that
/// hold the same shards.
pub struct HeldUnits<'a> {
    pub units: MutexGuard<'a, Units>,
    pub shard: &'a SharedGroup,
    pub replicas: Option<&'a SharedGroup>,
    pub plan: &'a ShardingPlan,
}

impl<'a> HeldUnits<'a> {
    /// The groups the units are sharded over, and their plan.
    pub(crate) fn groups(&self) -> UnitGroups<'a> {
        let replicas = self.replicas.map(|group| group as &dyn ProcessGroup);
        UnitGroups { shard: self.shard, replicas, plan: self.plan }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}
