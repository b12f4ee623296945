//! # Exercise 9: warmup and cosine decay
//!
//! At the first steps Adam's moment estimates are noise and the weights are
//! random: a full learning rate then can throw training into a region it never
//! recovers from. So the rate **warms up** linearly to `max_lr` over
//! `warmup_steps` steps, then **decays** along half a cosine (fast in the
//! middle, gentle at both ends) to a floor `min_lr` at `max_steps`, and stays
//! there. Half a cosine, as SGDR defines it, over a progress p from 0 to 1:
//!
//! ```text
//! lr = min_lr + ½ (1 + cos(π · p)) · (max_lr − min_lr)      p = 0: max_lr    p = 1: min_lr
//! ```
//!
//! The contract, with steps counted from 0 and `warmup_steps` at most
//! `max_steps`:
//!
//! - step 0 already trains (its rate is above 0); each warmup step adds the
//!   same amount, and the last warmup step reaches `max_lr` exactly;
//! - the first step after warmup is still at `max_lr`; from there the rate
//!   never rises, and it reaches `min_lr` at `max_steps`;
//! - from `max_steps` on, the rate is `min_lr`;
//! - a warmup as long as the run (`warmup_steps == max_steps`) is allowed,
//!   and no step gives NaN.
//!
//! The test's schedule, `max_lr = 8e-4`, `min_lr = 5e-5`, `warmup_steps = 7`,
//! `max_steps = 90`:
//!
//! ```text
//! step   0          3          6        7        30          55          89          90      150
//! lr     1.143e-4   4.571e-4   8e-4     8e-4     6.666e-4    3.337e-4    5.027e-5    5e-5    5e-5
//! ```
//!
//! Before writing a line, find the warmup rate of each step and the p of each
//! decay step that give these numbers.
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
