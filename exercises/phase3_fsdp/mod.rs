//! Phase 3: FSDP (exercises 12–15).
//!
//! The files here are yours to edit. The sharded runtime they configure lives
//! in [`crate::fsdp`]. With `--features solutions`, each module is read from
//! `solutions/phase3_fsdp/` instead.

// A shipped stub leaves its arguments unused until the exercise is done.
#![allow(unused_variables)]

#[cfg_attr(feature = "solutions", path = "../../solutions/phase3_fsdp/ex12_sharding_strategy.rs")]
mod ex12_sharding_strategy;
#[cfg_attr(feature = "solutions", path = "../../solutions/phase3_fsdp/ex13_mixed_precision.rs")]
mod ex13_mixed_precision;
#[cfg_attr(feature = "solutions", path = "../../solutions/phase3_fsdp/ex14_wrap_policy.rs")]
mod ex14_wrap_policy;
#[cfg_attr(feature = "solutions", path = "../../solutions/phase3_fsdp/ex15_fsdp_checkpoint.rs")]
mod ex15_fsdp_checkpoint;

pub use ex12_sharding_strategy::sharding_plan;
pub use ex13_mixed_precision::mixed_precision_policy;
pub use ex14_wrap_policy::wrap_policy;
