//! FSDP units in a mesh stage (`--strategy fsdp`, with `--pp S`, `--tp T`,
//! both or neither): each of the stage's blocks (under FSDP × TP, this rank's shards of
//! it) is a unit sharded across the data-parallel group (under
//! HYBRID_SHARD across a shard group of it, the groups replicas of each
//! other), its gradient shard kept by the unit step (exercise 22); so is the
//! stage's root (embedding, final norm, head), whose gradient the stage
//! reduce-scatters. Exercise 12's plan may keep parameters, or gradients
//! and moments too, whole (SHARD_GRAD_OP, NO_SHARD): the units then reduce
//! each micro-batch's gradient after its backward, and step by
//! `fsdp/step.rs`. What the mesh trainer does with them here:
//! their checkpoints, whole tensors a unit at a time and each rank's part
//! again, by exercise 15.

use std::collections::HashMap;
use std::ops::Range;

use candle_core::{bail, Device, Result, Tensor};

use crate::parallel::fsdp::{FlatLayout, WholeParam};
use crate::parallel::pipeline::HeldUnits;
use crate::phase3_fsdp::{gather_full_state, shard_full_state};
use crate::train::AdamW;

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
