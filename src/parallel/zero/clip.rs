//! Gradient clipping inside exercise 17's step. A ZeRO-1 step reduces the
//! gradient and updates the parameters in one call, the learner's
//! `ShardedAdamW::step`, so no caller ever holds the averaged gradient to
//! measure and clip. Its one reduce-scatter does: each rank's shard is a
//! disjoint part of the averaged gradient, so the shards' squares summed
//! over the ranks (one all-reduce of a number) are the whole gradient's, and
//! every shard is scaled by the factor the whole gradient would be.

use std::sync::{Arc, Mutex, PoisonError};

use candle_core::{bail, Result, Tensor};

use crate::autograd::{clip_factor, sum_of_squares};
use crate::distributed::{all_reduce_scalar, CollectiveOverride, ProcessGroup, ReduceOp};

/// The group's reduce-scatter, clipping; clones share one state.
#[derive(Clone)]
pub struct ClipShards {
    state: Arc<Mutex<Clipping>>,
}

#[derive(Default)]
struct Clipping {
    max_norm: f64,
    /// The norm each reduce-scatter of this step measured.
    norms: Vec<f64>,
}

impl ClipShards {
    /// Clipping to `max_norm`, as exercise 10 clips.
    pub fn new(max_norm: f64) -> Self {
        Self { state: Arc::new(Mutex::new(Clipping { max_norm, norms: vec![] })) }
    }

    /// The norm of this step's gradient before clipping, once the step's one
    /// reduce-scatter has run; starts the next step.
    pub fn take_norm(&self) -> Result<f64> {
        let norms = std::mem::take(&mut self.state.lock().unwrap_or_else(PoisonError::into_inner).norms);
        match norms[..] {
            [norm] => Ok(norm),
            _ => bail!(
                "exercise 17's step reduce-scattered {} times; the ZeRO-1 trainer clips the one reduce-scatter of the \
                 gradient that the step makes",
                norms.len()
            ),
        }
    }
}

impl CollectiveOverride for ClipShards {
    fn reduce_scatter(&self, inner: &dyn ProcessGroup, t: &Tensor, op: ReduceOp) -> Result<Tensor> {
        let shard = inner.reduce_scatter(t, op)?;
        let norm = all_reduce_scalar(inner, sum_of_squares([&shard])?, ReduceOp::Sum, shard.device())?.sqrt();
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        state.norms.push(norm);
        match clip_factor(norm, state.max_norm) {
            Some(factor) => shard * factor,
            None => Ok(shard),
        }
    }
}
