//! Learning-rate schedules. The warmup + cosine one is exercise 9; warmup-stable-decay is offered beside it.

use serde::{Deserialize, Serialize};

use crate::phase2_training::get_lr;

/// Linear warmup to `max_lr`, then cosine decay to `min_lr` at `max_steps`, `min_lr` after.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct CosineSchedule {
    pub max_lr: f64,
    pub min_lr: f64,
    pub warmup_steps: usize,
    pub max_steps: usize,
}

/// Warmup-stable-decay: linear warmup, a long plateau at `max_lr`, and a
/// linear decay to `min_lr` over the last `decay_steps` steps. Unlike cosine,
/// the plateau lets a run be extended or branched without restarting the schedule.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct WsdSchedule {
    pub max_lr: f64,
    pub min_lr: f64,
    pub warmup_steps: usize,
    pub max_steps: usize,
    pub decay_steps: usize,
}

impl WsdSchedule {
    pub fn lr(&self, step: usize) -> f64 {
        let decay_start = self.max_steps.saturating_sub(self.decay_steps);
        if step < self.warmup_steps {
            self.max_lr * (step + 1) as f64 / self.warmup_steps as f64
        } else if step < decay_start {
            self.max_lr
        } else if step >= self.max_steps {
            self.min_lr
        } else {
            let progress = (step - decay_start) as f64 / self.decay_steps as f64;
            self.max_lr + progress * (self.min_lr - self.max_lr)
        }
    }
}

/// The schedule a run uses.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum LrSchedule {
    Cosine(CosineSchedule),
    WarmupStableDecay(WsdSchedule),
}

impl LrSchedule {
    /// The learning rate of optimizer step `step` (counting from 0).
    pub fn lr(&self, step: usize) -> f64 {
        match self {
            LrSchedule::Cosine(schedule) => get_lr(step, schedule),
            LrSchedule::WarmupStableDecay(schedule) => schedule.lr(step),
        }
    }
}
