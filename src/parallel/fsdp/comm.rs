//! FSDP's communication: every collective a unit's step makes, and when.
//!
//! ```text
//! forward, backward   gather_unit          all-gather the shards into the whole buffer
//! each micro-batch    reduce_micro_batch   reduce-scatter the gradient (sharded gradients)
//! before the step     reduce_step          reduce-scatter or all-reduce what is not reduced yet,
//!                                          then under HYBRID_SHARD all-reduce across the replicas
//! the norm            sum_over_ranks       all-reduce each rank's sum of squares
//! after the step      gather_unit          all-gather updated shards into kept replicas
//! ```
//!
//! Every call goes through the [`ProcessGroup`], whose stats the ledger reads.

use candle_core::{Result, Tensor};

use super::ShardingPlan;
use crate::distributed::{ProcessGroup, ReduceOp};

/// The whole flat buffer, from every rank's equal shard in rank order.
pub(crate) fn gather_unit(pg: &dyn ProcessGroup, shard: &Tensor) -> Result<Tensor> {
    pg.all_gather(shard)
}

/// One micro-batch's gradient of a whole buffer: with sharded gradients it is
/// reduce-scattered at once (this rank keeps the average of its shard), so the
/// whole buffer is never kept; otherwise it stays whole until the step.
pub(crate) fn reduce_micro_batch(pg: &dyn ProcessGroup, flat: Tensor, plan: &ShardingPlan) -> Result<Tensor> {
    match plan.grads {
        true => pg.reduce_scatter(&flat, ReduceOp::Avg),
        false => Ok(flat),
    }
}

/// The step's gradient averaged over ranks, once: already done within the
/// shard group when gradients are sharded; reduce-scattered when only the
/// optimizer state is (ZeRO-1); all-reduced when nothing is (NO_SHARD, the
/// same traffic as DDP). Under HYBRID_SHARD the shard's average is then
/// averaged over the `replicas` holding the same shard: the mean of means of
/// equal-sized groups, the mean over every rank.
pub(crate) fn reduce_step(
    pg: &dyn ProcessGroup,
    replicas: Option<&dyn ProcessGroup>,
    grad: Tensor,
    plan: &ShardingPlan,
) -> Result<Tensor> {
    let within = match (plan.grads, plan.optimizer_state) {
        (true, _) => grad,
        (false, true) => pg.reduce_scatter(&grad, ReduceOp::Avg)?,
        (false, false) => pg.all_reduce(&grad, ReduceOp::Avg)?,
    };
    match replicas {
        Some(replicas) => replicas.all_reduce(&within, ReduceOp::Avg),
        None => Ok(within),
    }
}
