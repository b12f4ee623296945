//! The optimizer step of a rank's FSDP units once a step's micro-batches
//! have run: each unit's gradient over its local range, averaged over the
//! ranks as the plan says; the whole model's squared norm from those parts;
//! and AdamW on each unit's local range, clipped. A mesh's stages step
//! their units with it, whatever the mesh.

use candle_core::{Device, Result, Tensor};

use super::{ShardedUnit, ShardingPlan};
use crate::autograd::sum_of_squares;
use crate::distributed::{all_reduce_scalar, ProcessGroup, ReduceOp};
use crate::parallel::tensor::ShardCuts;
use crate::train::AdamWConfig;

/// The groups a rank's units are sharded over, and what they shard.
#[derive(Clone, Copy)]
pub(crate) struct UnitGroups<'a> {
    /// The ranks the units are sharded across.
    pub shard: &'a dyn ProcessGroup,
    /// Under HYBRID_SHARD, the ranks holding the same shards in the other groups.
    pub replicas: Option<&'a dyn ProcessGroup>,
    pub plan: &'a ShardingPlan,
}

/// Each unit's gradient over its local range for this step, taken from it,
/// in f32: averaged over the shard group (as each micro-batch ended, or now
/// where the plan keeps gradients whole) and across the replicas; times
/// `unscale` (a loss scale divided back out) where it is not 1.
pub(crate) fn take_grads<'a>(
    units: impl IntoIterator<Item = &'a mut ShardedUnit>,
    groups: UnitGroups<'_>,
    unscale: f64,
) -> Result<Vec<Tensor>> {
    let mut grads = vec![];
    for unit in units {
        let grad = unit.take_reduced_grad(groups.shard, groups.replicas, groups.plan)?;
        // A unit at a time: a second copy of every gradient at once would
        // be the step's largest allocation.
        grads.push(if unscale == 1.0 { grad } else { (grad * unscale)? });
    }
    Ok(grads)
}

/// The squared norm of the units' whole gradients from this rank's `grads`
/// (as [`take_grads`] gave them): their squares added over the shard group
/// where the gradients are sharded (disjoint parts of one averaged
/// gradient; replicas hold the same ones and count once), this rank's
/// alone where they are whole. Under FSDP × TP, `split` gives where each
/// parameter was cut and the tensor-parallel group: a cut parameter's
/// squares add over that group too, a whole one's count once.
pub(crate) fn sum_of_squares_over<'a>(
    units: impl IntoIterator<Item = &'a ShardedUnit>,
    grads: &[Tensor],
    groups: UnitGroups<'_>,
    split: Option<(&ShardCuts, &dyn ProcessGroup)>,
    device: &Device,
) -> Result<f64> {
    // One rank's sum needs no all-reduce, which would round it to f32.
    let over_shards = |local: f64| match groups.plan.optimizer_state && groups.shard.world_size() > 1 {
        true => all_reduce_scalar(groups.shard, local, ReduceOp::Sum, device),
        false => Ok(local),
    };
    let Some((cuts, tp)) = split.filter(|(_, tp)| tp.world_size() > 1) else {
        return over_shards(sum_of_squares(grads)?);
    };
    let ranks = tp.world_size();
    let mut local = 0.0;
    for (unit, grad) in units.into_iter().zip(grads) {
        let held_range = unit.local_range();
        for (name, span) in unit.layout().spans() {
            let (start, end) = (span.start.max(held_range.start), span.end.min(held_range.end));
            if start >= end {
                continue;
            }
            let squares = sum_of_squares([&grad.narrow(0, start - held_range.start, end - start)?])?;
            // A whole parameter counts 1/N on each of the N ranks: once over tp.
            local += if cuts.is_cut(name) { squares } else { squares / ranks as f64 };
        }
    }
    all_reduce_scalar(tp, over_shards(local)?, ReduceOp::Sum, device)
}

/// AdamW's `t`-th update of each unit's local range at `lr`, its gradient
/// in `grads` scaled by `clip` first, a replica the plan keeps refreshed
/// over the shard group. The last unit steps first and each gradient is let
/// go after its step, so the units listed first (the root, the largest)
/// step when the others' gradients are gone.
pub(crate) fn step<'a>(
    units: impl IntoIterator<Item = &'a mut ShardedUnit>,
    grads: Vec<Tensor>,
    (clip, lr, t): (Option<f64>, f64, u64),
    adamw: &AdamWConfig,
    shard: &dyn ProcessGroup,
) -> Result<()> {
    let units: Vec<&mut ShardedUnit> = units.into_iter().collect();
    for (unit, grad) in units.into_iter().zip(grads).rev() {
        let grad = match clip {
            Some(factor) => (grad * factor)?,
            None => grad,
        };
        unit.step(&grad, lr, t, adamw, shard)?;
    }
    Ok(())
}
