//! ZeRO's sharded optimizer on its own (stages 1 and 2): every rank keeps
//! AdamW's moments for 1/N of the parameters only. Its step is exercise 17
//! (`exercises/phase4_under_the_hood/ex17_sharded_adamw.rs`), which the
//! [`MeshTrainer`](crate::parallel::MeshTrainer) takes every step with when
//! its data-parallel axis shards the optimizer (`train --strategy zero1`,
//! with or without `--pp` and `--tp`); FSDP's `SHARD_GRAD_OP` runs the same
//! idea unit by unit.

mod clip;

pub use clip::{ClipShards, ModelParts};

use candle_core::Tensor;

use crate::train::{AdamWConfig, Moments};

/// One rank's part of a sharded AdamW over a flat parameter vector of P
/// elements: the moments of this rank's shard of ⌈P/N⌉ elements.
#[derive(Debug, Clone)]
pub struct ShardedAdamW {
    pub config: AdamWConfig,
    /// Decoupled weight decay, applied to every element.
    pub weight_decay: f64,
    /// Optimizer steps taken: t in the bias corrections, from 1 at the first step.
    pub steps: u64,
    /// This rank's moments, created (as zeros, shaped like its shard) at the
    /// first step; `None` before it.
    pub(crate) moments: Option<Moments>,
}

impl ShardedAdamW {
    pub fn new(config: AdamWConfig, weight_decay: f64) -> Self {
        Self { config, weight_decay, steps: 0, moments: None }
    }

    /// The optimizer state this rank holds, in elements (both moments).
    pub fn state_elements(&self) -> usize {
        self.moments.as_ref().map_or(0, |m| m.exp_avg.elem_count() + m.exp_avg_sq.elem_count())
    }

    /// This rank's first moment, once it has stepped.
    pub fn exp_avg(&self) -> Option<&Tensor> {
        self.moments.as_ref().map(|m| &m.exp_avg)
    }
}
