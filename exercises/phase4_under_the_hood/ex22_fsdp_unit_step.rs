//! # Exercise 22: the FSDP unit step
//!
//! Under FULL_SHARD (ZeRO-3, exercise 12) a rank keeps 1/N of each unit's
//! flat parameters. A unit's computation, forward and backward alike, needs
//! all of them; the point of FULL_SHARD is that a unit is whole only while
//! it computes.
//!
//! The contract. Between uses a rank holds only its shards, so at most one
//! unit is whole at a time: with K units of P parameters, a rank holds
//! P·K/N parameters plus one whole unit, P, instead of P·K. When either
//! function returns, no unit is whole. Each unit's gradient leaves backward
//! as this rank's shard of the mean over the ranks, never whole. The price
//! is communication, each step:
//!
//! ```text
//! all-gathers      2 per unit (forward, and again for backward)   2·K·(N−1)/N · P elements received
//! reduce-scatters  1 per unit                                       K·(N−1)/N · P elements sent
//! ```
//!
//! 1.5x the volume of DDP's all-reduce (2·(N−1)/N · P·K), for N times less
//! parameter memory. Rank r's share of unit k's gradient is elements
//! [r·P'/N, (r+1)·P'/N) of the mean over the ranks' data, which is all its
//! optimizer updates.
//!
//! Nothing the forward returns carries a graph: a graph would hold every
//! unit's whole parameters until backward, and freeing the slot would free
//! nothing. The forward returns each unit's input instead; what backward
//! makes of them to get a unit's gradients, and the gradient it hands to the
//! unit before, is yours to work out. `vjp` gives a whole gradient only to
//! variables (`Var`): a tensor that is not one gets at most the part that
//! flows through operations where it meets a tracked tensor, and nothing
//! fails (the guide's candle primer says which tensors a `GradStore` holds).
//!
//! A trace: N = 2 ranks, K = 2 units, each P = 5 parameters padded to
//! P' = 6, a shard of 3 (12 bytes in f32), a whole unit 24 bytes.
//!
//! ```text
//!                    whole on this rank   collectives of this rank                  f32 elements in / out
//! forward, unit 0    W_0                  all-gather W_0                            3 in
//! forward, unit 1    W_1                  all-gather W_1                            3 in
//! backward, unit 1   W_1                  all-gather W_1, reduce-scatter ∂L/∂W_1    3 in, 3 out
//! backward, unit 0   W_0                  all-gather W_0, reduce-scatter ∂L/∂W_0    3 in, 3 out
//! in between         nothing              nothing
//! the step           peak 24 bytes whole, never 48; 4 all-gathers, 2 reduce-scatters, no all-reduce
//!
//! unit 0's ∂L/∂W_0, whole, from each rank's own batch
//!   rank 0 [2, 0, 4, 2, 6, 0]     rank 1 [0, 2, 0, 2, 2, 0]     mean [1, 1, 2, 2, 4, 0]
//! what each rank adds to unit 0's gradient shard
//!   rank 0 [1, 1, 2]              rank 1 [2, 4, 0]              (the last element is padding)
//! ```
//!
//! The FSDP trainer calls these two functions on every block: the reference
//! stands in until you start this file, then `cargo train --strategy fsdp`
//! runs yours.
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
/// (B, T, C) batch of this rank's own data. Returns the last unit's output
/// and each unit's input (`inputs[0]` holds `x`'s values), none of them
/// carrying a graph; on return no unit is whole, and each unit was whole
/// once.
///
/// Pieces: `unit.shard()?` (this rank's (P'/N,) shard), `pg.all_gather(&t)`
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
/// unit's input for this rank's data alone. On return no unit is whole; each
/// unit was whole once more, and one at a time.
///
/// Pieces: the ones above, `candle_core::Var::from_tensor`,
/// `crate::autograd::vjp(y, grad_y)` (a `GradStore` for the variables `y`
/// was computed from), `grads.get(t)`, `unit.flat_grad(&grads)?` (the
/// gradient of the unit's whole flat parameters, (P',); `None` when the unit
/// is not whole or the backward reached none of its parameters),
/// `pg.reduce_scatter(t, op)` (`crate::distributed::ReduceOp`),
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
