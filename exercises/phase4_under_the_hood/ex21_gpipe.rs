//! # Exercise 21: a pipelined step, GPipe's schedule
//!
//! When the model no longer fits one device, **pipeline parallelism** cuts
//! its blocks into S consecutive stages, one per rank. Only the activations
//! at the cuts travel between ranks: forward, and their gradients backward.
//! The weights and the gradients of the weights stay on their stage.
//!
//! One batch through S stages keeps one stage busy at a time. GPipe (Huang
//! et al. 2019) splits the batch into M **micro-batches** and streams them,
//! so that the stages work on different micro-batches at once. Its schedule
//! has one rule: on every stage, all M forwards of the step come before the
//! first backward. A trace for S = 3, M = 4, with a backward as long as a
//! forward (Fm, Bm: the forward, the backward of micro-batch m; `held`: the
//! micro-batches a stage holds between their forward and their backward, at
//! the end of the slot):
//!
//! ```text
//! slot:      0  1  2  3  4  5  6  7  8  9  10 11
//! stage 0:   F0 F1 F2 F3 ·  ·  ·  ·  B3 B2 B1 B0
//!   held:    1  2  3  4  4  4  4  4  3  2  1  0
//! stage 1:   ·  F0 F1 F2 F3 ·  ·  B3 B2 B1 B0 ·
//!   held:    0  1  2  3  4  4  4  3  2  1  0  0
//! stage 2:   ·  ·  F0 F1 F2 F3 B3 B2 B1 B0 ·  ·
//!   held:    0  0  1  2  3  4  3  2  1  0  0  0
//! ```
//!
//! Stage 1 runs F2 in slot 3 because stage 0's output for micro-batch 2 is
//! complete at the end of slot 2. Stage 2 runs B3 in slot 6 with nothing
//! from another stage: its output is the loss. Stage 1 runs B3 in slot 7
//! because stage 2's gradient for micro-batch 3 is complete at the end of
//! slot 6. Every stage idles 4 of the 12 slots (·): the **bubble**,
//! (S − 1)/(M + S − 1) = 2/6 of its time.
//!
//! The contract, for micro-batch m of tokens (B, T) and hidden size C:
//!
//! ```text
//! stage s+1's xₘ   = stage s's yₘ          (B, T, C), crosses the cut forward
//! stage s's ∂L/∂yₘ = stage s+1's ∂L/∂xₘ    (B, T, C), crosses the cut backward
//! first stage's xₘ = the token ids         (B, T)
//! last stage's yₘ  = Lₘ                    the micro-batch's mean loss, a scalar
//! L                = (1/M) Σₘ Lₘ           the step's loss
//! ```
//!
//! Each stage returns ∂L/∂W_s for its own weights W_s, and each cut carries
//! exactly one tensor forward and one back per micro-batch. What does each of
//! a stage's M backwards contribute to ∂L/∂W_s, and from what gradient does
//! the last stage start one? Two facts to watch: messages between two ranks
//! arrive in the order they were sent, and nothing in a received gradient
//! says which micro-batch it belongs to; and candle's backward gives a
//! whole gradient only to variables (`Var`). A tensor that is not one still
//! gets a gradient in the `GradStore` when it met a tracked tensor in an
//! operation, but only the part that flows through such operations, and
//! nothing fails (the guide's candle primer, `guide/src/candle-primer.md`,
//! says which tensors the store holds).
//!
//! Read first: Huang et al. 2019, "GPipe: Efficient Training of Giant Neural
//! Networks using Pipeline Parallelism", section 2 and figure 2.
//! Guide: `guide/src/phase4/21-gpipe.md`. Test: `cargo test exercise_21`.

use candle_core::{Result, Tensor};

use crate::distributed::ProcessGroup;
use crate::parallel::pipeline::{PipelineStage, PipelineStep};

/// One training step's gradients for `stage`, run by rank `pg.rank()` =
/// `stage.index()`, over `micro_batches` (each (B, T) token ids, the same on
/// every rank) on the GPipe schedule above. Returns a `PipelineStep`: `grads`,
/// the stage's parameter gradients of the mean loss, and `loss`, that mean
/// on the last stage and `None` on the others.
///
/// Pieces: `stage.is_first()` / `is_last()`, `stage.forward(input, tokens)`
/// (the first stage's input is the token ids; the last stage's output is the
/// micro-batch's loss), `stage.backward(output, grad_output)` (a `GradStore`;
/// `grad_output` has `output`'s shape), `stage.gradients(&store)` (a
/// `crate::autograd::Gradients`, with `accumulate`), `stage.activation_like(tokens)`
/// (zeros of the input's shape, dtype and device: the `like` of `recv`),
/// `pg.send(t, dst)`, `pg.recv(like, src)`,
/// `candle_core::Var::from_tensor`, `Var::as_tensor`, `store.get(tensor)`,
/// `Tensor::new(value, device)`, `to_scalar`.
pub fn gpipe_step(pg: &dyn ProcessGroup, stage: &PipelineStage, micro_batches: &[Tensor]) -> Result<PipelineStep> {
    let _ = (&pg, &stage, &micro_batches);
    todo!("Exercise 21: A pipelined step (GPipe); run `cargo xtask hint 21`")
}
