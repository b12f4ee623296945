//! FSDP units in a mesh stage (`--strategy fsdp --pp S`): each of the
//! stage's blocks is a unit sharded across the data-parallel group, its
//! gradient shard kept by the unit step (exercise 22). What the mesh
//! trainer does with them besides: their part of the gradient norm, their
//! AdamW step, and their whole tensors for checkpoints.

use std::collections::HashMap;

use candle_core::{bail, DType, Device, Result, Tensor};

use crate::autograd::sum_of_squares;
use crate::distributed::{all_reduce_scalar, ProcessGroup, ReduceOp};
use crate::parallel::fsdp::LocalState;
use crate::parallel::fsdp_unit::BlockUnit;
use crate::train::{AdamW, AdamWConfig};

/// The units' gradient shards for this step, taken from them.
pub(super) fn take_grads(units: &mut [BlockUnit]) -> Result<Vec<Tensor>> {
    units
        .iter_mut()
        .map(|unit| match unit.take_grad() {
            Some(grad) => Ok(grad),
            None => bail!("no gradient reached unit {}: the loss does not depend on it", unit.layer()),
        })
        .collect()
}

/// The squared norm of the units' whole gradients: their shards' squares
/// added over `dp` (the shards are disjoint parts of one averaged gradient).
pub(super) fn sum_of_squares_over(dp: &dyn ProcessGroup, grads: &[Tensor], device: &Device) -> Result<f64> {
    all_reduce_scalar(dp, sum_of_squares(grads)?, ReduceOp::Sum, device)
}

/// AdamW's `t`-th update of each unit's shard at `lr`, its gradient scaled
/// by `clip` first; `dp` is the group the shards are spread over.
pub(super) fn step(
    units: &mut [BlockUnit],
    grads: Vec<Tensor>,
    (clip, lr, t): (Option<f64>, f64, u64),
    adamw: &AdamWConfig,
    dp: &dyn ProcessGroup,
) -> Result<()> {
    for (unit, grad) in units.iter_mut().zip(grads) {
        let grad = match clip {
            Some(factor) => (grad * factor)?,
            None => grad,
        };
        unit.step(&grad, lr, t, adamw, dp)?;
    }
    Ok(())
}

/// Every unit's parameters and, with `moments`, AdamW's two moments, whole
/// and by name (the moments under AdamW's names). Every rank of `dp` calls it.
pub(super) fn gathered(
    units: &[BlockUnit],
    dp: &dyn ProcessGroup,
    moments: bool,
) -> Result<(HashMap<String, Tensor>, HashMap<String, Tensor>)> {
    let (mut params, mut state) = (HashMap::new(), HashMap::new());
    for unit in units {
        let local = unit.local_state()?;
        let whole = |shard: &Tensor| unit.layout().unflatten(&dp.all_gather(shard)?);
        params.extend(whole(&local.params)?);
        if moments {
            for (kind, shard) in [&local.exp_avg, &local.exp_avg_sq].into_iter().enumerate() {
                for (name, moment) in whole(shard)? {
                    state.insert(AdamW::moment_names(&name)[kind].clone(), moment);
                }
            }
        }
    }
    Ok((params, state))
}

/// Gives each unit this rank's part of the whole `params` and, when some
/// update was taken, of AdamW's `moments` (by AdamW's names).
pub(super) fn load(
    units: &mut [BlockUnit],
    dp: &dyn ProcessGroup,
    params: &HashMap<String, Tensor>,
    moments: Option<&HashMap<String, Tensor>>,
    device: &Device,
) -> Result<()> {
    for unit in units.iter_mut() {
        let range = unit.local_range();
        let names: Vec<String> = unit.layout().names().map(str::to_string).collect();
        let part = |named: &HashMap<String, Tensor>| -> Result<Tensor> {
            let flat = unit.layout().flatten(named, device)?;
            flat.narrow(0, range.start, range.len())?.force_contiguous()
        };
        let moment = |kind: usize| -> Result<Tensor> {
            let Some(moments) = moments else { return Tensor::zeros(range.len(), DType::F32, device) };
            let mut named = HashMap::new();
            for name in &names {
                let moment_name = &AdamW::moment_names(name)[kind];
                let Some(saved) = moments.get(moment_name) else {
                    bail!("the checkpoint has no {moment_name}: it was written before any optimizer step, or by another optimizer");
                };
                named.insert(name.clone(), saved.clone());
            }
            part(&named)
        };
        let state = LocalState { params: part(params)?, exp_avg: moment(0)?, exp_avg_sq: moment(1)? };
        unit.set_local_state(state, dp)?;
    }
    Ok(())
}
