//! ZeRO's sharded optimizer on its own (stages 1 and 2): every rank keeps
//! AdamW's moments for 1/N of the parameters only. Its step is exercise 17
//! (`exercises/phase4_under_the_hood/ex17_sharded_adamw.rs`), which the
//! [`MeshTrainer`](crate::parallel::MeshTrainer) takes every step with when
//! its data-parallel axis shards the optimizer (`train --strategy zero1`,
//! with or without `--pp` and `--tp`; its `update_shard` alone under
//! `--strategy zero2`); FSDP runs the same idea unit by unit, each unit's
//! shard stepped by [`update_piece`].

mod clip;

pub use clip::{ClipShards, ModelParts};

use candle_core::{bail, Result, Tensor};

use crate::exercise_bodies::{body, Body};
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

/// Exercise 17's `update_shard` on one piece of a shard whose moments live
/// elsewhere (an FSDP unit keeps its shard's moments in pieces, in memory or
/// in its offload file): AdamW's `t`-th step of `decayed` (its weight decay
/// applied) with `grad`, from `moments`. Returns the new piece and moments.
/// While exercise 17 still holds its stub the runtime's AdamW stands in:
/// FSDP is Phase 3, exercise 17 Phase 4.
pub(crate) fn update_piece(
    config: &AdamWConfig,
    (t, lr): (u64, f64),
    decayed: &Tensor,
    grad: &Tensor,
    moments: Moments,
) -> Result<(Tensor, Moments)> {
    if body(17) == Body::NotStarted {
        return config.update(t, lr, decayed, grad, moments);
    }
    let mut optimizer = ShardedAdamW { config: *config, weight_decay: 0.0, steps: t - 1, moments: Some(moments) };
    let updated = optimizer.update_shard(decayed, grad, lr)?;
    match (optimizer.moments, optimizer.steps) {
        (Some(moments), steps) if steps == t => Ok((updated, moments)),
        (None, _) => bail!("exercise 17's update_shard left no moments in self.moments after its step"),
        (Some(_), steps) => bail!("exercise 17's update_shard left self.steps at {steps} after AdamW's step {t}"),
    }
}

/// Who steps a sharded optimizer's shards, in words.
pub fn update_shard_body() -> &'static str {
    match body(17) {
        Body::NotStarted => "the runtime's AdamW, standing in until you start exercise 17",
        Body::Leaned => "exercise 17's reference `update_shard`",
        Body::DoesNotParse => "exercise 17's reference `update_shard`, in place of your file, which does not parse",
        Body::Yours => "your `update_shard` (exercise 17)",
    }
}

#[cfg(test)]
mod tests {
    use candle_core::Device;

    use super::*;

    /// A piece's update is AdamW's, from the moments it is given, whichever
    /// body steps it: exercise 17's, or the runtime's while 17 is a stub.
    #[test]
    fn a_piece_is_updated_as_adamw_updates_it() -> Result<()> {
        let config = AdamWConfig { beta1: 0.8, beta2: 0.95, eps: 1e-6 };
        let device = Device::Cpu;
        let piece = Tensor::new(&[0.5f32, -1.0, 2.0], &device)?;
        let grad = Tensor::new(&[0.1f32, 0.0, -0.3], &device)?;
        let moments = || -> Result<Moments> {
            Ok(Moments {
                exp_avg: Tensor::new(&[0.01f32, 0.02, -0.03], &device)?,
                exp_avg_sq: Tensor::new(&[1e-3f32, 2e-3, 3e-3], &device)?,
            })
        };
        let (got, got_moments) = update_piece(&config, (3, 0.01), &piece, &grad, moments()?)?;
        let (want, want_moments) = config.update(3, 0.01, &piece, &grad, moments()?)?;
        for (got, want) in [(got, want), (got_moments.exp_avg_sq, want_moments.exp_avg_sq)] {
            let apart = (got - want)?.abs()?.max_all()?.to_scalar::<f32>()?;
            assert!(apart <= 1e-7, "{apart}");
        }
        Ok(())
    }
}
