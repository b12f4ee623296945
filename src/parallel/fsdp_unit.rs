//! One decoder block as an FSDP unit on one rank, the pieces of exercise 22
//! (`exercises/phase4_under_the_hood/ex22_fsdp_unit_step.rs`), which the FSDP
//! trainer runs on every block.
//!
//! Between uses a rank keeps only its shard of the unit's flat parameters
//! (exercise 12's FULL_SHARD) and its shard of the gradient. While the unit
//! computes, its whole parameters sit in a slot, as PyTorch's FSDP allocates
//! the storage of a unit's unsharded flat parameter before the unit runs and
//! frees it after: [`BlockUnit::unshard`] fills the slot with what the
//! all-gather returned, [`BlockUnit::reshard`] empties it. Every unit of a rank
//! shares one count of the bytes held in slots, so the peak says how many
//! units were whole at once.

use std::ops::Range;
use std::sync::Arc;

use candle_core::{bail, Result, Tensor};

use super::fsdp::{
    block_unit_name, BlockCompute, FlatLayout, MixedPrecisionPolicy, ShardedUnit, ShardingPlan, UnitPlacement,
};
use crate::distributed::{ProcessGroup, SharedGroup};
use crate::model::{layer_of, param_specs, GptConfig, ParamStore, RotaryCache};
use crate::parallel::tensor::{part_of, BlockStep};

/// A block's FSDP unit: the state every FSDP unit has on a rank
/// ([`ShardedUnit`]), seen by the unit step.
pub type BlockUnit = ShardedUnit;

/// The parameters of block `l`'s unit, in the unit's order.
pub(crate) type NamesOf<'a> = &'a dyn Fn(usize) -> Vec<String>;

/// What the forward pass over the units leaves for the backward pass.
#[derive(Debug, Clone)]
pub struct FsdpForward {
    /// The last unit's output, (B, T, C).
    pub output: Tensor,
    /// The input of each unit, in unit order: what its backward replays from.
    pub inputs: Vec<Tensor>,
}

impl BlockUnit {
    /// Every block of the model `params` holds, as FULL_SHARD units in f32 on
    /// rank `rank` of `world_size`: each keeps its shard of the block's
    /// parameters, flattened in the model's parameter order and padded to a
    /// multiple of `world_size`.
    pub fn shard_blocks(config: &GptConfig, params: &ParamStore, rank: usize, world_size: usize) -> Result<Vec<Self>> {
        let (plan, policy) = (ShardingPlan::zero(3), MixedPrecisionPolicy::f32());
        let at = (rank, world_size);
        let specs = param_specs(config);
        let names_of = |layer| -> Vec<String> {
            specs.iter().map(|s| s.name.clone()).filter(|n| layer_of(n) == Some(layer)).collect()
        };
        Self::shard_layers(config, params, 0..config.num_layers, at, (&plan, &policy), None, (&names_of, &|_| 0.0))
    }

    /// Blocks `layers` of the model `params` holds, as units placed by
    /// `plan` and `policy` on rank `rank` of `world_size`, the unit of block
    /// `l` holding the parameters `names_of(l)` in that order, each element
    /// decayed by its parameter's `weight_decay_of`. With `split`, each unit
    /// holds this rank's shards of its block across that tensor-parallel
    /// group (FSDP × TP), run by that exercise.
    pub(crate) fn shard_layers(
        config: &GptConfig,
        params: &ParamStore,
        layers: Range<usize>,
        (rank, world_size): (usize, usize),
        (plan, policy): (&ShardingPlan, &MixedPrecisionPolicy),
        split: Option<(SharedGroup, BlockStep)>,
        (names_of, weight_decay_of): (NamesOf<'_>, &dyn Fn(&str) -> f64),
    ) -> Result<Vec<Self>> {
        config.validate()?;
        if rank >= world_size {
            bail!("rank {rank} of {world_size}: ranks are numbered 0 to {}", world_size.saturating_sub(1));
        }
        let device = params.device()?;
        let rotary = RotaryCache::new(config.head_dim(), config.max_seq_len, config.rope_theta, &device)?
            .to_dtype(policy.buffer_dtype)?;
        let at = UnitPlacement { plan, policy, rank, world_size, gathered: Arc::default() };
        // The blocks' parameters: whole, or this rank's shards of them across tp.
        let (tp_rank, tp_ranks) = split.as_ref().map_or((0, 1), |(tp, _)| (tp.rank(), tp.world_size()));
        let held = part_of(config, params, layers.clone(), tp_rank, tp_ranks)?;
        layers
            .map(|layer| {
                let shapes = names_of(layer).into_iter().map(|name| match held.get(&name) {
                    Some(t) => Ok((name, t.shape().clone())),
                    None => bail!("parameter `{name}` is missing: the parameters do not fit this model config"),
                });
                let layout = FlatLayout::of_shapes(shapes.collect::<Result<Vec<_>>>()?, world_size);
                let full = layout.flatten(&held, &device)?;
                let block =
                    BlockCompute { layer, config: config.clone(), rotary: rotary.clone(), split: split.clone() };
                ShardedUnit::new(block_unit_name(layer), layout, &full, Some(block), &at, weight_decay_of)
            })
            .collect()
    }
}
