//! Gradient clipping inside exercise 17's step. A ZeRO-1 step reduces the
//! gradient and updates the parameters in one call, the learner's
//! `ShardedAdamW::step`, so no caller ever holds the averaged gradient to
//! measure and clip. Its one reduce-scatter does: each rank's shard is a
//! disjoint part of the averaged gradient, so the shards' squares summed
//! over the data-parallel ranks (one all-reduce) are the whole flat
//! gradient's, and every shard is scaled by the factor the whole model's
//! gradient would be.
//!
//! On a mesh the flat gradient is one rank's part of the model: its
//! pipeline stage, and of each split block its tensor-parallel shard. The
//! whole model's squares are then also added over the tp group (for the
//! shards, which the flat vector puts first; the whole parameters are the
//! same on every rank of it and count once) and over the pp group (the
//! stages hold disjoint parameters). ZeRO-2 reduces its micro-batches'
//! gradients before the step and clips the shard it holds the same way,
//! without the interception.

use std::sync::{Arc, Mutex, PoisonError};

use candle_core::{bail, Result, Tensor};

use crate::autograd::{clip_factor, sum_of_squares};
use crate::distributed::{all_reduce_scalar, CollectiveOverride, ProcessGroup, ReduceOp, SharedGroup};

/// The group's reduce-scatter, clipping; clones share one state.
#[derive(Clone)]
pub struct ClipShards {
    state: Arc<Mutex<Clipping>>,
    parts: Arc<ModelParts>,
}

/// Where the rest of the model's gradient is, beyond the data-parallel group.
pub struct ModelParts {
    /// The leading elements of the flat gradient that are tensor-parallel shards.
    pub shard_elements: usize,
    /// The ranks holding the other shards of the same blocks.
    pub tp: Option<SharedGroup>,
    /// The ranks holding the other stages of the same pipeline.
    pub pp: Option<SharedGroup>,
}

#[derive(Default)]
struct Clipping {
    max_norm: f64,
    /// The norm each reduce-scatter of this step measured.
    norms: Vec<f64>,
}

impl ClipShards {
    /// Clipping to `max_norm`, as exercise 10 clips, the whole model in the flat gradient.
    pub fn new(max_norm: f64) -> Self {
        Self::of_part(max_norm, ModelParts { shard_elements: 0, tp: None, pp: None })
    }

    /// Clipping to `max_norm` a flat gradient that is this rank's `parts` of the model.
    pub fn of_part(max_norm: f64, parts: ModelParts) -> Self {
        Self { state: Arc::new(Mutex::new(Clipping { max_norm, norms: vec![] })), parts: Arc::new(parts) }
    }

    /// The norm of this step's gradient before clipping, once the step's one
    /// reduce-scatter has run; starts the next step.
    pub fn take_norm(&self) -> Result<f64> {
        let norms = std::mem::take(&mut self.state.lock().unwrap_or_else(PoisonError::into_inner).norms);
        match norms[..] {
            [norm] => Ok(norm),
            _ => bail!(
                "exercise 17's step reduce-scattered {} times; the trainer clips the one reduce-scatter of the \
                 gradient that the step makes",
                norms.len()
            ),
        }
    }

    /// This rank's reduced `shard` of the flat gradient scaled as the whole
    /// model's gradient norm asks, with that norm (the shard unscaled when
    /// the norm is not finite). ZeRO-2, which holds its reduced shard
    /// itself, clips it here; ZeRO-1's reduce-scatter does below.
    pub fn clip(&self, dp: &dyn ProcessGroup, shard: Tensor) -> Result<(Tensor, f64)> {
        let norm = self.norm(dp, &shard)?;
        let max_norm = self.state.lock().unwrap_or_else(PoisonError::into_inner).max_norm;
        let shard = match clip_factor(norm, max_norm) {
            Some(factor) => (shard * factor)?,
            None => shard,
        };
        Ok((shard, norm))
    }

    /// The whole model's gradient norm, from this rank's reduced `shard`
    /// (rank `rank`'s of the flat gradient) and the data-parallel group `dp`.
    fn norm(&self, dp: &dyn ProcessGroup, shard: &Tensor) -> Result<f64> {
        let len = shard.elem_count();
        let start = dp.rank() * len;
        let shards = self.parts.shard_elements.clamp(start, start + len) - start;
        let squares = [shard.narrow(0, 0, shards)?, shard.narrow(0, shards, len - shards)?]
            .iter()
            .map(|part| sum_of_squares([part]).map(|s| s as f32))
            .collect::<Result<Vec<f32>>>()?;
        let summed = dp.all_reduce(&Tensor::new(squares, shard.device())?, ReduceOp::Sum)?.to_vec1::<f32>()?;
        let (mut shards, whole) = (f64::from(summed[0]), f64::from(summed[1]));
        if let Some(tp) = &self.parts.tp {
            shards = all_reduce_scalar(tp, shards, ReduceOp::Sum, shard.device())?;
        }
        let mut total = shards + whole;
        if let Some(pp) = &self.parts.pp {
            total = all_reduce_scalar(pp, total, ReduceOp::Sum, shard.device())?;
        }
        Ok(total.sqrt())
    }
}

impl CollectiveOverride for ClipShards {
    fn reduce_scatter(&self, inner: &dyn ProcessGroup, t: &Tensor, op: ReduceOp) -> Result<Tensor> {
        let (shard, norm) = self.clip(inner, inner.reduce_scatter(t, op)?)?;
        self.state.lock().unwrap_or_else(PoisonError::into_inner).norms.push(norm);
        Ok(shard)
    }
}
