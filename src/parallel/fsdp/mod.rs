//! Fully sharded data parallelism (FSDP, ZeRO): each rank keeps only a shard
//! of the model's parameters, gradients and optimizer state, and the ranks
//! exchange what a unit needs just before it is used.
//!
//! | strategy      | ZeRO | parameters | gradients | optimizer state |
//! |---------------|------|------------|-----------|-----------------|
//! | NO_SHARD      | 0    | whole      | whole     | whole           |
//! | SHARD_GRAD_OP | 2    | whole      | sharded   | sharded         |
//! | FULL_SHARD    | 3    | sharded    | sharded   | sharded         |
//!
//! HYBRID_SHARD is FULL_SHARD within groups of consecutive ranks, the
//! groups replicas of each other.
//!
//! The pieces: [`ShardingPlan`] (exercise 12 maps a strategy to one),
//! [`MixedPrecisionPolicy`] (exercise 13), [`FsdpUnit`]s (exercise 14 picks
//! them), [`FlatLayout`] (a unit's parameters as one padded buffer),
//! [`ShardedUnit`] (a rank's part of a unit; exercise 15 gathers it whole for
//! a checkpoint and shards it again), the units' optimizer step (`step.rs`),
//! the root's embedding and head (`root.rs`) and [`StepLedger`] (what a rank
//! held and sent in a step). The mesh trainer's stage runs them
//! ([`crate::parallel::mesh`]), with or without pipeline and tensor
//! parallelism. Every collective is
//! in `comm.rs` and goes through the
//! [`ProcessGroup`](crate::distributed::ProcessGroup).

mod comm;
mod flat;
mod ledger;
mod offload;
mod precision;
mod prefetch;
mod root;
mod shard;
mod step;
mod strategy;
mod units;

pub use flat::{DecayRuns, FlatLayout, UnitParams};
pub use ledger::{MemoryLedger, Peaks, StepLedger};
pub(crate) use offload::OffloadFile;
pub use precision::{LossScaler, MixedPrecisionPolicy, Precision};
pub(crate) use prefetch::in_pass;
pub use prefetch::Prefetch;
pub(crate) use root::{embedding_grad, head_backward, head_forward, HeadPass};
pub(crate) use shard::{bytes, BlockCompute, Pass, UnitPlacement};
pub use shard::{GatheredBytes, LocalState, ShardedUnit, WholeParam};
pub(crate) use step::{step, sum_of_squares_over, take_grads, UnitGroups};
pub use strategy::{ShardingPlan, ShardingStrategy};
pub use units::{block_unit_name, check_units, FsdpUnit, ROOT_UNIT};
