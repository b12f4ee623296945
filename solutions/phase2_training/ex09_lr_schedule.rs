//! Reference solution of exercise 9: warmup and cosine decay.

use crate::train::CosineSchedule;

pub fn get_lr(step: usize, schedule: &CosineSchedule) -> f64 {
    let CosineSchedule { max_lr, min_lr, warmup_steps, max_steps } = *schedule;
    if step < warmup_steps {
        return max_lr * (step + 1) as f64 / warmup_steps as f64;
    }
    if step >= max_steps {
        return min_lr; // also where a warmup as long as the run leaves no decay: 0/0
    }
    let progress = (step - warmup_steps) as f64 / (max_steps - warmup_steps) as f64;
    min_lr + 0.5 * (1.0 + (std::f64::consts::PI * progress).cos()) * (max_lr - min_lr)
}
