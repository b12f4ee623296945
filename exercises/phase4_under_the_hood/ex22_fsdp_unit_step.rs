//! # Exercise 22: the FSDP unit step
//!
//! Under FULL_SHARD (ZeRO-3, exercise 12) a rank keeps 1/N of each unit's
//! flat parameters. A unit's computation needs all of them, so FSDP makes
//! the unit whole just before it runs and frees it right after:
//!
//! ```text
//! forward, unit k     all-gather shards ─► whole W_k ─► y = block_k(x) ─► free W_k
//! backward, unit k    all-gather again  ─► whole W_k ─► replay block_k(x), back-propagate ∂L/∂y
//!                     ─► ∂L/∂W_k (whole, this rank's data only)
//!                     ─► reduce-scatter (Avg): this rank keeps its shard of the mean over ranks
//!                     ─► free W_k; ∂L/∂x goes on to unit k−1
//! ```
//!
//! Between uses only shards are held, so at most one unit is whole at a
//! time: with K units of P parameters, a rank holds P·K/N parameters plus one
//! whole unit, P, instead of P·K. The price is communication, each step:
//!
//! ```text
//! all-gathers      2 per unit (forward, and again for backward)   2·K·(N−1)/N · P elements received
//! reduce-scatters  1 per unit                                       K·(N−1)/N · P elements sent
//! ```
//!
//! 1.5x the volume of DDP's all-reduce (2·(N−1)/N · P·K), for N times less
//! parameter memory. Unit k's gradient is the sum over the ranks' data:
//! reduce-scatter with `Avg` leaves rank r holding elements
//! [r·P'/N, (r+1)·P'/N) of the mean, which is all its optimizer updates.
//!
//! The forward keeps no graph (exercise 7's activation checkpointing): if
//! it did, the graph would hold every unit's whole parameters until backward,
//! and freeing the slot would free nothing. Keep each unit's input instead;
//! backward replays the unit on it, as a variable, to get ∂L/∂x.
//!
//! Read first: Zhao et al. 2023, "PyTorch FSDP: Experiences on Scaling Fully
//! Sharded Data Parallel", section 3 (units, their all-gather before forward
//! and backward, the reduce-scatter after); Rajbhandari et al. 2020, "ZeRO",
//! sections 5.3 and 7.2 (partitioned parameters and their 1.5x traffic).
//! Guide: `guide/src/phase4/22-fsdp-unit-step.md`. Test: `cargo test exercise_22`.

use candle_core::{Result, Tensor};

use crate::distributed::ProcessGroup;
use crate::parallel::fsdp_unit::{BlockUnit, FsdpForward};

/// The forward pass of `units` (the model's blocks, in order) on `x`, a
/// (B, T, C) batch of this rank's own data: each unit gathered, run and
/// freed. Returns the last unit's output and each unit's input, none of them
/// carrying a graph.
///
/// Pieces: `unit.shard()` (this rank's (P'/N,) shard), `pg.all_gather(t)`
/// (every rank's shard in rank order, (P',)), `unit.unshard(whole)`,
/// `unit.forward(x)`, `unit.reshard()`, `Tensor::detach`.
pub fn fsdp_forward(pg: &dyn ProcessGroup, units: &mut [BlockUnit], x: &Tensor) -> Result<FsdpForward> {
    let _ = (&pg, &units, &x);
    todo!("Exercise 22: The FSDP unit step; run `cargo xtask hint 22`")
}

/// The backward pass of `units`, last unit first, from `grad_output`
/// (∂L/∂output, (B, T, C)) and `inputs`, the inputs [`fsdp_forward`] kept:
/// adds to each unit's gradient this rank's shard of ∂L/∂W averaged over the
/// ranks (`unit.add_grad`), and returns ∂L/∂x, the gradient of the first
/// unit's input for this rank's data.
///
/// Pieces: the ones above, `candle_core::Var::from_tensor`,
/// `crate::autograd::vjp(y, grad_y)` (a `GradStore` for the variables `y`
/// was computed from), `grads.get(t)`, `unit.whole()`,
/// `pg.reduce_scatter(t, ReduceOp::Avg)` (`crate::distributed::ReduceOp`),
/// `unit.add_grad(shard_grad)`.
pub fn fsdp_backward(
    pg: &dyn ProcessGroup,
    units: &mut [BlockUnit],
    inputs: &[Tensor],
    grad_output: &Tensor,
) -> Result<Tensor> {
    let _ = (&pg, &units, &inputs, &grad_output);
    todo!("Exercise 22: The FSDP unit step; run `cargo xtask hint 22`")
}
