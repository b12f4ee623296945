//! Reference solution of exercise 15: FSDP checkpoints, gathered to whole tensors.

use std::collections::HashMap;

use candle_core::{Result, Tensor};

use crate::distributed::ProcessGroup;
use crate::parallel::fsdp::{LocalState, ShardedUnit, WholeParam};

pub fn gather_full_state<'a>(
    units: impl IntoIterator<Item = &'a ShardedUnit>,
    group: &dyn ProcessGroup,
    with_moments: bool,
    keep: &mut dyn FnMut(WholeParam) -> Result<()>,
) -> Result<()> {
    // A unit at a time, each whole tensor handed on before the next unit is
    // gathered: no rank ever holds the whole model at once.
    for unit in units {
        let local = unit.local_state()?;
        // Every rank takes part in every all-gather; a whole buffer is not gathered again.
        let whole = |t: &Tensor| {
            let flat = if unit.is_sharded() { group.all_gather(t)? } else { t.clone() };
            unit.layout.unflatten(&flat)
        };
        let params = whole(&local.params)?;
        // unflatten gives every buffer's parameters in the layout's order.
        let moments: Vec<Option<[Tensor; 2]>> = match with_moments {
            true => whole(&local.exp_avg)?
                .into_iter()
                .zip(whole(&local.exp_avg_sq)?)
                .map(|((_, m), (_, v))| Some([m, v]))
                .collect(),
            false => vec![None; params.len()],
        };
        for ((name, value), moments) in params.into_iter().zip(moments) {
            keep(WholeParam { name, value, moments })?;
        }
    }
    Ok(())
}

pub fn shard_full_state(
    unit: &ShardedUnit,
    params: &HashMap<String, Tensor>,
    moments: Option<[&HashMap<String, Tensor>; 2]>,
) -> Result<LocalState> {
    let range = unit.local_range();
    let mine = |named: &HashMap<String, Tensor>| {
        unit.layout.flatten(named, unit.device())?.narrow(0, range.start, range.len())
    };
    let params = mine(params)?;
    let [exp_avg, exp_avg_sq] = match moments {
        None => [params.zeros_like()?, params.zeros_like()?],
        Some([exp_avg, exp_avg_sq]) => [mine(exp_avg)?, mine(exp_avg_sq)?],
    };
    Ok(LocalState { params, exp_avg, exp_avg_sq })
}
