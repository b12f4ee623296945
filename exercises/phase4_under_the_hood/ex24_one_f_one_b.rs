//! # Exercise 24: a pipelined step, the 1F1B schedule
//!
//! GPipe (exercise 21) runs all M forwards before the first backward, so
//! every stage holds the activations of all M micro-batches at once: more
//! micro-batches shrink the bubble but grow the memory. The **1F1B**
//! schedule (PipeDream-Flush, Narayanan et al. 2021) starts each
//! micro-batch's backward as early as it can. Stage s of S runs a
//! **warm-up** of S − s − 1 forwards (at most M), then alternates one
//! forward, one backward, and ends with the backwards still owed:
//!
//! ```text
//! S = 3, M = 4      time ─►
//! stage 0:  F0 F1 F2 ·  ·  B0 F3 B1 ·  B2 ·  B3
//! stage 1:     F0 F1 ·  B0 F2 B1 F3 B2 ·  B3
//! stage 2:        F0 B0 F1 B1 F2 B2 F3 B3
//!           (warm-ups of 2, 1 and 0 forwards; · idle)
//! ```
//!
//! The micro-batches go backward in the order they went forward (micro-batch
//! 0 first) on every stage, as the messages between two ranks arrive in the
//! order they were sent. A micro-batch is **in flight** on a stage from its
//! forward to its backward, and its activations (the forward's graph and
//! input) are alive exactly that long:
//!
//! ```text
//!                     in flight on stage s, at most    bubble
//! GPipe               M                                (S − 1) / (M + S − 1)
//! 1F1B                min(S − s, M)                    the same
//! ```
//!
//! So 1F1B keeps the bubble and caps the memory at S micro-batches' worth on
//! the first stage, whatever M: more micro-batches now cost nothing in
//! memory. Everything else is exercise 21's: the step's loss is the mean
//! over the micro-batches (the last stage's backward starts from 1/M), a
//! stage's weight gradients are summed over its M backwards, and a received
//! activation must be a `Var` for backward to give its gradient.
//!
//! Read first: Narayanan et al. 2021, "Efficient Large-Scale Language Model
//! Training on GPU Clusters Using Megatron-LM", section 2.2.1 and figure 4.
//! Guide: `guide/src/phase4/24-one-f-one-b.md`. Test: `cargo test exercise_24`.

use candle_core::{Result, Tensor};

use crate::distributed::ProcessGroup;
use crate::parallel::pipeline::{PipelineStage, PipelineStep};

/// One training step's gradients for `stage`, run by rank `pg.rank()` =
/// `stage.index()`, over `micro_batches` (each (B, T) token ids, the same on
/// every rank) on the 1F1B schedule above. Returns the stage's parameter
/// gradients of the mean loss, and on the last stage that loss. Drop each
/// micro-batch's input and output once its backward has run.
///
/// Pieces: exercise 21's (`stage.is_first()` / `is_last()`, `stage.forward`,
/// `stage.backward`, `stage.gradients`, `stage.activation_like`, `pg.send`,
/// `pg.recv`, `Var::from_tensor`, `store.get`, `Gradients::accumulate`),
/// `stage.index()` and `stage.stages()` (s and S), and a
/// `std::collections::VecDeque` of the micro-batches in flight
/// (`push_back`, `pop_front`).
pub fn one_f_one_b_step(
    pg: &dyn ProcessGroup,
    stage: &PipelineStage,
    micro_batches: &[Tensor],
) -> Result<PipelineStep> {
    let _ = (&pg, &stage, &micro_batches);
    todo!("Exercise 24: A pipelined step (1F1B); run `cargo xtask hint 24`")
}
