//! # Exercise 21: a pipelined step, GPipe's schedule
//!
//! When the model no longer fits one device, **pipeline parallelism** cuts
//! its blocks into S consecutive stages, one per rank. Stage s computes its
//! blocks and *sends* the activations to stage s+1; in backward, stage s+1
//! sends back the gradient of those activations. Only the activations at the
//! cuts travel, not the weights and not the gradients of the weights.
//!
//! One batch through S stages keeps one stage busy at a time. GPipe (Huang
//! et al. 2019) splits the batch into M **micro-batches** and streams them:
//! every stage runs all M forwards, then all M backwards (last micro-batch
//! first), so the stages work on different micro-batches at once.
//!
//! ```text
//! S = 3, M = 4      time ─►
//! stage 0:  F0 F1 F2 F3 ·  ·  ·  ·  B3 B2 B1 B0
//! stage 1:     F0 F1 F2 F3 ·  ·  B3 B2 B1 B0
//! stage 2:        F0 F1 F2 F3 B3 B2 B1 B0
//!                                          (· idle: the bubble)
//! bubble fraction = (S − 1) / (M + S − 1)      here 2/6 of each stage's time
//! ```
//!
//! The step's loss is the **mean** over the micro-batches, `L = (1/M) Σ Lₘ`,
//! so backward on the last stage starts from ∂L/∂Lₘ = 1/M, and each stage's
//! weight gradients are summed over its M backwards. For stage s, with input
//! xₘ (received) and output yₘ (sent):
//!
//! ```text
//! received ∂L/∂yₘ ──► backward of stage s ──► ∂L/∂W_s  (+= over m)
//!                                         └─► ∂L/∂xₘ  sent to stage s−1
//! ```
//!
//! To get ∂L/∂xₘ from candle, the received activation must be a variable
//! (`Var`): backward returns gradients for variables only. Messages between
//! two ranks arrive in the order they were sent, so every stage must run the
//! backwards in the same micro-batch order.
//!
//! Read first: Huang et al. 2019, "GPipe: Efficient Training of Giant Neural
//! Networks using Pipeline Parallelism", section 2 and figure 2.
//! Guide: `guide/src/phase4/21-gpipe.md`. Test: `cargo test exercise_21`.

use candle_core::{Result, Tensor};

use crate::distributed::ProcessGroup;
use crate::parallel::pipeline::{PipelineStage, PipelineStep};

/// One training step's gradients for `stage`, run by rank `pg.rank()` =
/// `stage.index()`, over `micro_batches` (each (B, T) token ids, the same on
/// every rank) on the GPipe schedule above. Returns the stage's parameter
/// gradients of the mean loss, and on the last stage that loss.
///
/// Pieces: `stage.is_first()` / `is_last()`, `stage.forward(input, tokens)`
/// (the first stage's input is the token ids; the last stage's output is the
/// micro-batch's loss), `stage.backward(output, grad_output)` (a `GradStore`),
/// `stage.gradients(&store)` (a `crate::autograd::Gradients`, with
/// `accumulate`), `stage.activation_like(tokens)` (what `recv` needs),
/// `pg.send(t, dst)`, `pg.recv(like, src)`, `candle_core::Var::from_tensor`,
/// `store.get(var.as_tensor())`, `Tensor::new(value, device)`, `to_scalar`.
pub fn gpipe_step(pg: &dyn ProcessGroup, stage: &PipelineStage, micro_batches: &[Tensor]) -> Result<PipelineStep> {
    let _ = (&pg, &stage, &micro_batches);
    todo!("Exercise 21: A pipelined step (GPipe); run `cargo xtask hint 21`")
}
