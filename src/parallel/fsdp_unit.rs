//! One decoder block as an FSDP unit on one rank, the pieces of exercise 22
//! (`exercises/phase4_under_the_hood/ex22_fsdp_unit_step.rs`).
//!
//! Between uses a rank keeps only its shard of the unit's flat parameters
//! (exercise 12's FULL_SHARD) and its shard of the gradient. While the unit
//! computes, its whole parameters sit in a slot, as PyTorch's FSDP allocates
//! the storage of a unit's unsharded flat parameter before the unit runs and
//! frees it after: [`BlockUnit::unshard`] fills the slot with what the
//! all-gather returned, [`BlockUnit::reshard`] empties it. Every unit of a rank
//! shares one count of the bytes held in slots, so the peak says how many
//! units were whole at once.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use candle_core::{bail, DType, Result, Tensor, Var};

use super::fsdp::{bytes, FlatLayout, FlatView};
use crate::model::{layer_of, param_specs, GptConfig, Layers, ParamStore, RotaryCache};
use crate::timeline;

/// Block `layer` as an FSDP unit on one rank.
pub struct BlockUnit {
    layer: usize,
    config: GptConfig,
    rotary: RotaryCache,
    layout: FlatLayout,
    /// This rank's equal part of the padded flat f32 parameters.
    shard: Tensor,
    /// The whole flat parameters while the unit is unsharded: a variable, so
    /// a backward through the block gives their gradient.
    whole: Option<Var>,
    /// The sum of the gradient shards added since the unit was made.
    grad: Option<Tensor>,
    gathered: Arc<GatheredBytes>,
}

/// Bytes in the slots of one rank's units: now, and the most at any time.
#[derive(Default)]
struct GatheredBytes {
    now: AtomicU64,
    peak: AtomicU64,
}

/// What the forward pass over the units leaves for the backward pass.
#[derive(Debug, Clone)]
pub struct FsdpForward {
    /// The last unit's output, (B, T, C).
    pub output: Tensor,
    /// The input of each unit, in unit order: what its backward replays from.
    pub inputs: Vec<Tensor>,
}

impl BlockUnit {
    /// Every block of the model `params` holds, as units on rank `rank` of
    /// `world_size`: each keeps its shard of the block's parameters, flattened
    /// in the model's parameter order and padded to a multiple of `world_size`.
    pub fn shard_blocks(config: &GptConfig, params: &ParamStore, rank: usize, world_size: usize) -> Result<Vec<Self>> {
        config.validate()?;
        params.check_matches(config)?;
        if rank >= world_size {
            bail!("rank {rank} of {world_size}: ranks are numbered 0 to {}", world_size.saturating_sub(1));
        }
        let tensors: HashMap<String, Tensor> =
            params.iter().map(|(name, var)| (name.to_string(), var.as_tensor().clone())).collect();
        let Some((_, any)) = params.iter().next() else { bail!("the model has no parameters") };
        let device = any.device().clone();
        let rotary = RotaryCache::new(config.head_dim(), config.max_seq_len, config.rope_theta, &device)?;
        let gathered = Arc::new(GatheredBytes::default());
        let specs = param_specs(config);
        (0..config.num_layers)
            .map(|layer| {
                let names: Vec<String> =
                    specs.iter().map(|s| s.name.clone()).filter(|n| layer_of(n) == Some(layer)).collect();
                let layout = FlatLayout::new(config, &names, world_size)?;
                let range = layout.shard_range(rank, world_size);
                let shard =
                    layout.flatten(&tensors, &device)?.narrow(0, range.start, range.len())?.force_contiguous()?;
                Ok(Self {
                    layer,
                    config: config.clone(),
                    rotary: rotary.clone(),
                    layout,
                    shard,
                    whole: None,
                    grad: None,
                    gathered: gathered.clone(),
                })
            })
            .collect()
    }

    /// The block this unit holds.
    pub fn layer(&self) -> usize {
        self.layer
    }

    /// This rank's shard of the flat parameters: P'/N f32 elements, where P'
    /// is the block's parameter count padded to a multiple of the world size N.
    pub fn shard(&self) -> &Tensor {
        &self.shard
    }

    /// The unit's whole flat parameters, P' elements, while it is unsharded.
    pub fn whole(&self) -> Option<&Tensor> {
        self.whole.as_ref().map(Var::as_tensor)
    }

    /// Fills the slot with `whole`, the all-gather of every rank's shard, so
    /// that [`forward`](Self::forward) can run. The slot holds it as a
    /// variable: a backward through the block gives its gradient, under
    /// `grads.get(unit.whole().unwrap())`.
    pub fn unshard(&mut self, whole: Tensor) -> Result<()> {
        if self.whole.is_some() {
            bail!("unit {} is already unsharded: reshard it after its forward before gathering it again", self.layer);
        }
        if whole.dims() != [self.layout.padded_len()] {
            bail!(
                "unit {} takes its whole flat parameters, {} elements (the all-gather of every rank's shard of {}), \
                 got a tensor of shape {:?}",
                self.layer,
                self.layout.padded_len(),
                self.shard.elem_count(),
                whole.dims()
            );
        }
        let whole = Var::from_tensor(&whole.to_dtype(DType::F32)?)?;
        let held = bytes(whole.as_tensor());
        let now = self.gathered.now.fetch_add(held, Ordering::Relaxed) + held;
        self.gathered.peak.fetch_max(now, Ordering::Relaxed);
        self.whole = Some(whole);
        Ok(())
    }

    /// Empties the slot: the whole parameters are freed once nothing else
    /// (a graph that read them, say) holds them. The shard stays.
    pub fn reshard(&mut self) {
        if let Some(whole) = self.whole.take() {
            self.gathered.now.fetch_sub(bytes(whole.as_tensor()), Ordering::Relaxed);
        }
    }

    /// The block on the whole parameters in the slot: (B, T, C) to (B, T, C).
    /// Its graph reaches the whole parameters, and `x` when it is a variable.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let Some(whole) = &self.whole else {
            bail!("unit {} is sharded: all-gather its shards and unshard it before running it", self.layer);
        };
        let _span = timeline::span("compute", format!("block {}", self.layer));
        let view = FlatView { flat: whole.as_tensor(), layout: &self.layout };
        candle_core::Module::forward(&Layers::new(&self.config, &view, self.layer, &self.rotary)?, x)
    }

    /// Adds `shard_grad`, this rank's shard of a gradient of the whole flat
    /// parameters (P'/N elements), to the unit's gradient.
    pub fn add_grad(&mut self, shard_grad: &Tensor) -> Result<()> {
        if shard_grad.dims() != self.shard.dims() {
            bail!(
                "unit {} keeps a gradient shard of {} elements, like its parameter shard; got a tensor of shape {:?}. \
                 Reduce-scatter the whole buffer's gradient so that each rank keeps only its shard",
                self.layer,
                self.shard.elem_count(),
                shard_grad.dims()
            );
        }
        let shard_grad = shard_grad.detach().to_dtype(DType::F32)?;
        self.grad = Some(match self.grad.take() {
            Some(sum) => (sum + shard_grad)?,
            None => shard_grad,
        });
        Ok(())
    }

    /// The gradient shards added so far, summed: P'/N elements.
    pub fn grad(&self) -> Option<&Tensor> {
        self.grad.as_ref()
    }

    /// The gradient shards added so far, summed, leaving none: what an
    /// optimizer step consumes.
    pub fn take_grad(&mut self) -> Option<Tensor> {
        self.grad.take()
    }

    /// Replaces this rank's shard, with what an optimizer step made of it.
    pub fn set_shard(&mut self, shard: &Tensor) -> Result<()> {
        if shard.dims() != self.shard.dims() {
            bail!(
                "unit {} keeps a shard of {} elements, got a tensor of shape {:?}",
                self.layer,
                self.shard.elem_count(),
                shard.dims()
            );
        }
        self.shard = shard.detach().to_dtype(DType::F32)?;
        Ok(())
    }

    /// The most bytes the slots of this rank's units held at once.
    pub fn peak_gathered_bytes(&self) -> u64 {
        self.gathered.peak.load(Ordering::Relaxed)
    }

    /// The unit's layout: where each of the block's parameters sits in the flat buffer.
    pub fn layout(&self) -> &FlatLayout {
        &self.layout
    }
}
