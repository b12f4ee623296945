//! # Exercise 9: warmup and cosine decay
//!
//! At the first steps Adam's moment estimates are noise and the weights are
//! random: a full learning rate then can throw training into a region it never
//! recovers from. So the rate **warms up** linearly, then **decays** along half
//! a cosine — fast in the middle, gentle at both ends — to a floor `min_lr`:
//!
//! ```text
//! step < warmup:             lr = max_lr · (step + 1) / warmup
//! warmup ≤ step < max_steps: p  = (step − warmup) / (max_steps − warmup)      ∈ [0, 1)
//!                            lr = min_lr + ½ (1 + cos(π · p)) · (max_lr − min_lr)
//! step ≥ max_steps:          lr = min_lr
//! ```
//!
//! (`warmup` is `warmup_steps`, at most `max_steps`.) Steps count from 0, so
//! step 0 already trains at `max_lr / warmup` and step `warmup − 1` reaches
//! `max_lr`. The decay starts from the end of warmup, not from step 0, and
//! meets `min_lr` at `max_steps`, where p would be 1; from there on the rate
//! stays at `min_lr`, where the cosine would climb back up. A warmup as long as
//! the run (`warmup_steps == max_steps`) leaves nothing to decay: the rate is
//! `min_lr` from `max_steps` on, and never NaN.
//!
//! With `max_lr = 8e-4`, `min_lr = 5e-5`, `warmup = 7`, `max_steps = 90` (the
//! test's schedule): step 0 → 1.143e-4, step 6 → 8e-4, step 7 → 8e-4 (p = 0),
//! step 55 → 3.337e-4 (p = 48/83), step 90 and beyond → 5e-5.
//!
//! Read first: Loshchilov & Hutter 2017, "SGDR: Stochastic Gradient Descent with Warm Restarts".
//! Guide: `guide/src/phase2/09-lr-schedule.md`. Test: `cargo test exercise_09`.

use crate::train::CosineSchedule;

/// The learning rate at optimizer step `step` (from 0) under `schedule`.
///
/// Fields: `schedule.max_lr`, `schedule.min_lr`, `schedule.warmup_steps`,
/// `schedule.max_steps`. `std::f64::consts::PI` and `f64::cos` do the cosine.
pub fn get_lr(step: usize, schedule: &CosineSchedule) -> f64 {
    let _ = (&step, &schedule);
    todo!("Exercise 9: Warmup and cosine learning-rate schedule; run `cargo xtask hint 9`")
}
