//! How every trainer ends a step once it knows the whole model's gradient
//! norm, the same number on every rank whatever groups the layout summed it
//! over. A norm that is not finite means some gradient held an inf or NaN:
//! the update is skipped on every rank together (so no replica drifts from
//! the others), and under dynamic loss scaling the scale is halved. A finite
//! norm is clipped to `max_grad_norm` and the update goes ahead. The
//! schedule's clock moves either way. DDP's step (exercise 10) reaches the
//! same verdict inside AdamW, whose every rank holds the whole gradient.

use super::{AdamW, TrainerState};
use crate::autograd::clip_factor;
use crate::parallel::fsdp::LossScaler;

/// How far a run has come, in one place.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StepCounters {
    /// Optimizer steps taken, skipped ones included: the schedule's clock.
    pub step: usize,
    /// Updates applied: AdamW's `t` in its bias corrections.
    pub optimizer_steps: u64,
    /// Updates skipped because a gradient was not finite.
    pub skipped_steps: u64,
}

/// What a step does once its gradient norm is known.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Verdict {
    /// Update every parameter, its gradient scaled by `clip` first where
    /// there is one; `t` is this update's number (AdamW's t, from 1).
    Update { clip: Option<f64>, t: u64 },
    /// Change no parameter and no moment.
    Skip,
}

impl StepCounters {
    /// The counters of a trainer at `step` whose one optimizer is `optimizer`.
    pub fn of(step: usize, optimizer: &AdamW) -> Self {
        Self { step, optimizer_steps: optimizer.steps(), skipped_steps: optimizer.skipped_steps() }
    }

    /// The counters a checkpoint's `state` was saved at.
    pub fn restore(&mut self, state: &TrainerState) {
        self.step = state.step;
        self.optimizer_steps = state.optimizer_steps;
    }

    /// Ends a step whose whole model's gradient norm is `grad_norm`: the
    /// verdict above, counted, with `scaler` (if the run scales its loss)
    /// told whether the gradients overflowed.
    pub fn settle(&mut self, grad_norm: f64, max_grad_norm: f64, scaler: Option<&mut LossScaler>) -> Verdict {
        let finite = grad_norm.is_finite();
        if let Some(scaler) = scaler {
            scaler.update(!finite);
        }
        self.step += 1;
        if !finite {
            self.skipped_steps += 1;
            return Verdict::Skip;
        }
        self.optimizer_steps += 1;
        Verdict::Update { clip: clip_factor(grad_norm, max_grad_norm), t: self.optimizer_steps }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_norm_that_is_not_finite_skips_and_halves_the_loss_scale_while_the_clock_moves() {
        let mut counters = StepCounters { step: 4, optimizer_steps: 3, skipped_steps: 1 };
        let mut scaler = LossScaler::new(1024.0, 2000);
        assert_eq!(counters.settle(f64::NAN, 1.0, Some(&mut scaler)), Verdict::Skip);
        assert_eq!(counters, StepCounters { step: 5, optimizer_steps: 3, skipped_steps: 2 });
        assert_eq!(scaler.scale, 512.0);
    }

    #[test]
    fn a_finite_norm_updates_clipped_to_the_largest_norm_allowed() {
        let mut counters = StepCounters { step: 4, optimizer_steps: 3, skipped_steps: 1 };
        match counters.settle(4.0, 1.0, None) {
            Verdict::Update { clip: Some(factor), t: 4 } => assert!((factor - 0.25).abs() < 1e-6, "{factor}"),
            other => panic!("a norm of 4 over a largest of 1 gave {other:?}"),
        }
        assert_eq!(counters.settle(0.5, 1.0, None), Verdict::Update { clip: None, t: 5 });
        assert_eq!(counters, StepCounters { step: 6, optimizer_steps: 5, skipped_steps: 1 });
    }
}
