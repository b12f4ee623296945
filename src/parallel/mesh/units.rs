//! FSDP units in a mesh stage (`--strategy fsdp` with `--pp S`, `--tp T` or
//! both): each of the stage's blocks (under FSDP × TP, this rank's shards of
//! it) is a unit sharded across the data-parallel group (under
//! HYBRID_SHARD across a shard group of it, the groups replicas of each
//! other), its gradient shard kept by the unit step (exercise 22); so is the
//! stage's root (embedding, final norm, head), whose gradient the stage
//! reduce-scatters. Exercise 12's plan may keep parameters, or gradients
//! and moments too, whole (SHARD_GRAD_OP, NO_SHARD): the units then reduce
//! each micro-batch's gradient as FSDP's own trainer does. What the mesh
//! trainer does with them besides: their part
//! of the gradient norm, their AdamW step, and their checkpoints: whole
//! tensors a unit at a time and each rank's part again, by exercise 15.

use std::collections::HashMap;
use std::ops::Range;

use candle_core::{bail, Device, Result, Tensor};

use crate::autograd::sum_of_squares;
use crate::distributed::{all_reduce_scalar, ProcessGroup, ReduceOp, SingleProcess};
use crate::parallel::fsdp::{FlatLayout, WholeParam};
use crate::parallel::pipeline::HeldUnits;
use crate::parallel::tensor::ShardCuts;
use crate::phase3_fsdp::{gather_full_state, shard_full_state};
use crate::train::{AdamW, AdamWConfig};

/// The units' gradients over their local ranges for this step, taken
/// from them: averaged over the shard group (by the unit step, or now when
/// the plan keeps gradients whole) and across the replicas; times `unscale`
/// (a loss scale divided back out) where it is not 1.
pub(super) fn take_grads(held: &mut HeldUnits, unscale: f64) -> Result<Vec<Tensor>> {
    let (shard, replicas, plan) = (held.shard, held.replicas, held.plan);
    let mut grads = vec![];
    for unit in held.units.iter_mut() {
        let replicas = replicas.map(|group| group as &dyn ProcessGroup);
        let grad = unit.take_reduced_grad(shard, replicas, plan)?;
        grads.push(if unscale == 1.0 { grad } else { (grad * unscale)? });
    }
    Ok(grads)
}

/// The squared norm of the units' whole gradients: their shards' squares
/// added over the shard group (the shards are disjoint parts of one
/// averaged gradient; replicas hold the same ones and count once), or
/// this rank's alone when the plan keeps gradients and moments whole. Under
/// FSDP × TP a unit's parameters are this rank's shards across `tp` where
/// `cuts` says so, whose squares add over `tp` too, and whole elsewhere, the
/// same on every rank of `tp` and counted once.
pub(super) fn sum_of_squares_over(
    held: &HeldUnits,
    grads: &[Tensor],
    (cuts, tp): (&ShardCuts, &dyn ProcessGroup),
    device: &Device,
) -> Result<f64> {
    let ranks = tp.world_size();
    let alone = SingleProcess::new();
    let shards: &dyn ProcessGroup = match held.plan.optimizer_state {
        true => held.shard,
        false => &alone,
    };
    if ranks == 1 {
        return all_reduce_scalar(shards, sum_of_squares(grads)?, ReduceOp::Sum, device);
    }
    let mut local = 0.0;
    for (unit, grad) in held.units.iter().zip(grads) {
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
    let over_shards = all_reduce_scalar(shards, local, ReduceOp::Sum, device)?;
    all_reduce_scalar(tp, over_shards, ReduceOp::Sum, device)
}

/// AdamW's `t`-th update of each unit's shard at `lr`, its gradient scaled
/// by `clip` first.
pub(super) fn step(
    held: &mut HeldUnits,
    grads: Vec<Tensor>,
    (clip, lr, t): (Option<f64>, f64, u64),
    adamw: &AdamWConfig,
) -> Result<()> {
    let shard = held.shard;
    for (unit, grad) in held.units.iter_mut().zip(grads) {
        let grad = match clip {
            Some(factor) => (grad * factor)?,
            None => grad,
        };
        unit.step(&grad, lr, t, adamw, shard)?;
    }
    Ok(())
}

/// One FSDP unit's whole tensors at a time, for a save that goes through a
/// stage's parameters in model order: a unit is gathered (exercise 15) when
/// the save first asks for one of its parameters, and each tensor is let go
/// as it is taken, so a rank holds at most one whole unit (its parameters
/// and moments).
#[derive(Default)]
pub(super) struct WholeUnit {
    index: Option<usize>,
    params: HashMap<String, WholeParam>,
}

impl WholeUnit {
    /// The unit of `held` that holds parameter `name`, if one does.
    pub(super) fn holding(held: &HeldUnits, name: &str) -> Option<usize> {
        held.units.iter().position(|unit| unit.layout().names().any(|held_name| held_name == name))
    }

    /// Parameter `name` of unit `index` whole and, with `moments`, its two
    /// moments (AdamW's order). Every rank of the shard group asks for the
    /// same parameters in the same order: a new unit is gathered across it.
    pub(super) fn take(
        &mut self,
        held: &HeldUnits,
        index: usize,
        name: &str,
        moments: bool,
    ) -> Result<(Tensor, Vec<Tensor>)> {
        if self.index != Some(index) {
            let Some(unit) = held.units.iter().nth(index) else { bail!("the stage has no unit {index}") };
            let mut params = HashMap::new();
            gather_full_state([unit], held.shard, moments, &mut |whole| {
                params.insert(whole.name.clone(), whole);
                Ok(())
            })?;
            *self = Self { index: Some(index), params };
        }
        let Some(whole) = self.params.remove(name) else { bail!("unit {index} has no parameter `{name}`") };
        Ok((whole.value, whole.moments.map(Vec::from).unwrap_or_default()))
    }
}

/// Gives each unit this rank's part (exercise 15) of the whole `params`
/// and, when some update was taken, of AdamW's `moments` (by AdamW's names).
pub(super) fn load(
    held: &mut HeldUnits,
    params: &HashMap<String, Tensor>,
    moments: Option<&HashMap<String, Tensor>>,
) -> Result<()> {
    let shard = held.shard;
    let [exp_avg, exp_avg_sq] = AdamW::moments_by_param(moments.unwrap_or(&HashMap::new()));
    for unit in held.units.iter_mut() {
        let state = shard_full_state(unit, params, moments.map(|_| [&exp_avg, &exp_avg_sq]))?;
        unit.set_local_state(state, shard)?;
    }
    Ok(())
}

/// Elements `range` of `layout`'s flat vector of AdamW's moment `kind` (0:
/// `exp_avg`, 1: `exp_avg_sq`), from the whole moments `saved` under
/// AdamW's names.
pub(super) fn saved_moment_part(
    layout: &FlatLayout,
    range: Range<usize>,
    saved: &HashMap<String, Tensor>,
    kind: usize,
    device: &Device,
) -> Result<Tensor> {
    let mut named = HashMap::new();
    for name in layout.names() {
        let moment_name = &AdamW::moment_names(name)[kind];
        let Some(moment) = saved.get(moment_name) else {
            bail!("the checkpoint has no {moment_name}: it was written before any optimizer step, or by another optimizer");
        };
        named.insert(name.to_string(), moment.clone());
    }
    layout.part(&named, range, device)
}
