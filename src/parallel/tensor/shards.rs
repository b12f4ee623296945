//! Where a rank's tensor-parallel shards were cut, and what follows from it
//! for whole-model work: the gradient norm (shards added over the group,
//! whole parameters once), checkpoints (shards gathered along their cut),
//! and a rank's part of a whole checkpoint (cut again as
//! [`TensorParallelBlock::shard`] cuts it).

use std::collections::{BTreeMap, HashMap};
use std::ops::Range;

use candle_core::{bail, Device, Result, Tensor};

use super::TensorParallelBlock;
use crate::autograd::{sum_of_squares, Gradients};
use crate::distributed::{all_reduce_scalar, ProcessGroup, ReduceOp};
use crate::model::{layer_of, param_specs, GptConfig, ParamStore};
use crate::train::AdamW;

/// The dimension along which each shard joins the other ranks' into the
/// whole parameter; the parameters not listed are whole on every rank.
#[derive(Debug, Clone, Default)]
pub struct ShardCuts {
    cut_along: BTreeMap<String, usize>,
}

impl ShardCuts {
    /// The cuts of `held`, a rank's parameters under the whole model's
    /// names: where a shape differs from the whole parameter's.
    pub fn of(config: &GptConfig, held: &ParamStore) -> Self {
        Self::of_shapes(config, held.iter().map(|(name, var)| (name, var.dims())))
    }

    /// The cuts of parameters of these shapes, by the whole model's names.
    pub fn of_shapes<'a>(config: &GptConfig, held: impl IntoIterator<Item = (&'a str, &'a [usize])>) -> Self {
        let whole_shapes: HashMap<String, Vec<usize>> =
            param_specs(config).into_iter().map(|spec| (spec.name, spec.shape.dims().to_vec())).collect();
        let cut_along = held
            .into_iter()
            .filter_map(|(name, dims)| {
                let whole = whole_shapes.get(name)?;
                let dim = dims.iter().zip(whole).position(|(part, whole)| part != whole)?;
                Some((name.to_string(), dim))
            })
            .collect();
        Self { cut_along }
    }

    /// Whether parameter `name` is held as a shard, not whole.
    pub fn is_cut(&self, name: &str) -> bool {
        self.cut_along.contains_key(name)
    }

    /// The whole of `t`, this rank's part of parameter `name` (or of a
    /// moment of it): gathered from the group `tp` along the dimension it
    /// was cut on. Every rank of the group calls it.
    pub fn whole(&self, tp: &dyn ProcessGroup, name: &str, t: &Tensor) -> Result<Tensor> {
        match self.cut_along.get(name) {
            None => Ok(t.clone()),
            Some(0) => tp.all_gather(t),
            Some(&dim) => tp.all_gather(&t.transpose(0, dim)?.contiguous()?)?.transpose(0, dim)?.contiguous(),
        }
    }

    /// The squared L2 norm of the whole gradient whose parts `grads` this
    /// rank holds: the shards' squares added over `tp`, the whole
    /// parameters (the same on every rank of it) counted once.
    /// An error when the whole parameters' gradients differ across `tp`:
    /// counted once, they would also be stepped apart, and the ranks'
    /// copies of one parameter would drift.
    pub fn sum_of_squares(&self, grads: &Gradients, tp: &dyn ProcessGroup, device: &Device) -> Result<f64> {
        let (shards, whole): (Vec<_>, Vec<_>) = grads.iter().partition(|(name, _)| self.is_cut(name));
        let shards = sum_of_squares(shards.into_iter().map(|(_, g)| g))?;
        let whole = sum_of_squares(whole.into_iter().map(|(_, g)| g))?;
        if tp.world_size() > 1 {
            let each = tp.all_gather(&Tensor::new(&[whole as f32], device)?)?.to_vec1::<f32>()?;
            if each.iter().any(|&w| (w - each[0]).abs() > 1e-5 * each[0].abs()) {
                bail!(
                    "the gradients of the parameters every tensor-parallel rank holds whole (the norms', the \
                     embedding's, the head's) differ across the ranks: squared norms {each:?}. Each rank must end \
                     a backward with the same gradient of such a parameter, or their copies drift apart"
                );
            }
        }
        Ok(whole + all_reduce_scalar(tp, shards, ReduceOp::Sum, device)?)
    }
}

/// Rank `rank` of `ranks`'s part of each parameter of the whole model
/// `whole`: the parameters outside the blocks as they are, blocks `layers`
/// cut as [`TensorParallelBlock::shard`] cuts them.
pub fn part_of(
    config: &GptConfig,
    whole: &ParamStore,
    layers: Range<usize>,
    rank: usize,
    ranks: usize,
) -> Result<HashMap<String, Tensor>> {
    if ranks == 1 {
        return Ok(whole.iter().map(|(n, v)| (n.to_string(), v.as_tensor().clone())).collect());
    }
    let mut part: HashMap<String, Tensor> = whole
        .iter()
        .filter(|(name, _)| layer_of(name).is_none())
        .map(|(n, v)| (n.to_string(), v.as_tensor().clone()))
        .collect();
    for layer in layers {
        let shard = TensorParallelBlock::shard(config, whole, layer, rank, ranks)?;
        part.extend(shard.params().iter().map(|(n, v)| (n.to_string(), v.as_tensor().clone())));
    }
    Ok(part)
}

/// The part of each AdamW moment in `saved` of the parameters `names`
/// (those of `layers` and the others a stage holds), cut as [`part_of`]
/// cuts the parameters; `None` when one is missing.
pub fn moments_part<'a>(
    config: &GptConfig,
    saved: &HashMap<String, Tensor>,
    names: impl IntoIterator<Item = &'a str> + Clone,
    (layers, rank, ranks): (Range<usize>, usize, usize),
) -> Result<Option<HashMap<String, Tensor>>> {
    let mut part = HashMap::new();
    for kind in 0..2 {
        let named = |name: &str| AdamW::moment_names(name)[kind].clone();
        let mut whole = Vec::new();
        for name in names.clone() {
            let Some(moment) = saved.get(&named(name)) else { return Ok(None) };
            whole.push((name.to_string(), moment.clone()));
        }
        let cut = part_of(config, &ParamStore::from_tensors(whole)?, layers.clone(), rank, ranks)?;
        part.extend(cut.into_iter().map(|(name, moment)| (named(&name), moment)));
    }
    Ok(Some(part))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::distributed::spawn;

    /// A whole parameter stepped with a different gradient on each rank
    /// would leave the ranks with different copies of it.
    #[test]
    fn whole_gradients_that_differ_across_the_group_are_refused_and_equal_ones_counted_once() {
        let norms = |offset: f32| {
            spawn(2, |pg| {
                let mut grads = Gradients::default();
                let value = 3.0 + offset * pg.rank() as f32;
                grads.insert("model.norm.weight", Tensor::new(&[value, 4.0], &Device::Cpu)?);
                Ok(ShardCuts::default().sum_of_squares(&grads, &pg, &Device::Cpu).map_err(|e| e.to_string()))
            })
            .unwrap()
        };
        assert!(norms(0.0).iter().all(|n| n.as_ref().is_ok_and(|&n| n == 25.0)), "{:?}", norms(0.0));
        for norm in norms(1.0) {
            assert!(norm.as_ref().is_err_and(|e| e.contains("differ across the ranks")), "{norm:?}");
        }
    }
}
