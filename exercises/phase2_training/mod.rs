//! Phase 2: training (exercises 8–11).
//!
//! The files here are yours to edit. The machinery they plug into lives in
//! [`crate::train`]. With `--features solutions`, each module is read from
//! `solutions/phase2_training/` instead.

// A shipped stub leaves its arguments unused until the exercise is done.
#![allow(unused_variables)]

#[cfg_attr(
    feature = "solutions",
    path = "../../solutions/phase2_training/ex08_optimizer_groups.rs"
)]
mod ex08_optimizer_groups;
#[cfg_attr(feature = "solutions", path = "../../solutions/phase2_training/ex09_lr_schedule.rs")]
mod ex09_lr_schedule;
#[cfg_attr(feature = "solutions", path = "../../solutions/phase2_training/ex10_train_step.rs")]
mod ex10_train_step;
#[cfg_attr(feature = "solutions", path = "../../solutions/phase2_training/ex11_checkpoint.rs")]
mod ex11_checkpoint;

pub use ex08_optimizer_groups::build_optimizer;
pub use ex09_lr_schedule::get_lr;
