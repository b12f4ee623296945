//! # Exercise 24: a pipelined step, the 1F1B schedule
//!
//! GPipe (exercise 21) runs all M forwards before the first backward, so
//! every stage holds the activations of all M micro-batches at once: more
//! micro-batches shrink the bubble but grow the memory. The **1F1B**
//! schedule (PipeDream-Flush, Narayanan et al. 2021) computes the same
//! gradients in another order, one that caps what a stage holds. A
//! micro-batch is **in flight** on a stage from its forward to its backward,
//! and its activations (the forward's graph and its input) are alive exactly
//! that long:
//!
//! ```text
//!                     in flight on stage s, at most    bubble
//! GPipe               M                                (S − 1) / (M + S − 1)
//! 1F1B                min(S − s, M)                    the same
//! ```
//!
//! Within that cap a 1F1B stage runs each backward as early as its gradient
//! can arrive. A trace for S = 3, M = 4, with a backward as long as a
//! forward (Fm, Bm: the forward, the backward of micro-batch m; `held`: the
//! micro-batches in flight at the end of the slot):
//!
//! ```text
//! slot:      0  1  2  3  4  5  6  7  8  9  10 11
//! stage 0:   F0 F1 F2 ·  ·  B0 F3 B1 ·  B2 ·  B3
//!   held:    1  2  3  3  3  2  3  2  2  1  1  0
//! stage 1:   ·  F0 F1 ·  B0 F2 B1 F3 B2 ·  B3 ·
//!   held:    0  1  2  2  1  2  1  2  1  1  0  0
//! stage 2:   ·  ·  F0 B0 F1 B1 F2 B2 F3 B3 ·  ·
//!   held:    0  0  1  0  1  0  1  0  1  0  0  0
//! ```
//!
//! Stage 2's output is the loss, so B0 follows F0 at once and stage 2 never
//! holds more than one micro-batch. Stage 0 reaches its cap of 3 in slot 2,
//! then idles through slots 3 and 4: the gradient for micro-batch 0 comes
//! back from stage 1 at the end of slot 4. Every stage idles 4
//! of the 12 slots, as in exercise 21's GPipe trace, but holds at most
//! 3, 2 and 1 micro-batches where GPipe holds 4. The tests compare each
//! stage's order of forwards and backwards with 1F1B's for other S and M,
//! fewer micro-batches than stages among them: generalise the trace.
//!
//! So 1F1B keeps the bubble and caps the memory at S micro-batches' worth on
//! the first stage, whatever M. The rest is exercise 21's contract: each cut
//! carries one (B, T, C) activation forward and its gradient back per
//! micro-batch; the step's loss is the mean over the micro-batches, and each
//! stage returns its weights' gradients of that mean. Watch for: nothing in
//! a received gradient says which micro-batch it belongs to.
//!
//! One constraint comes from GPUs. The CPU backends' `send` returns at once;
//! NCCL's completes only once the receiving stage has posted its receive.
//! In 1F1B's steady state a stage sends an activation forward just when the
//! stage after it sends a gradient back: if each sends before it receives,
//! each waits in its send for the other, forever. The tests also run your
//! step on a group whose sends wait for their receive: where a stage sends
//! to a neighbour and receives from that same neighbour next, make the two
//! one exchange, `pg.send_recv(t, dst, like, src)`, whose halves are posted
//! together (NCCL's grouped call; PyTorch's `batch_isend_irecv`).
//!
//! Read first: Narayanan et al. 2021, "Efficient Large-Scale Language Model
//! Training on GPU Clusters Using Megatron-LM", section 2.2.1 and figure 4.
//! Guide: `guide/src/phase4/24-one-f-one-b.md`. Test: `cargo test exercise_24`.

use candle_core::{Result, Tensor};

use crate::distributed::ProcessGroup;
use crate::parallel::pipeline::{PipelineStage, PipelineStep};

/// One training step's gradients for `stage`, run by rank `pg.rank()` =
/// `stage.index()`, over `micro_batches` (each (B, T) token ids, the same on
/// every rank) on the 1F1B schedule above. Returns a `PipelineStep`: `grads`,
/// the stage's parameter gradients of the mean loss, and `loss`, that mean
/// on the last stage and `None` on the others. Keep a micro-batch's input
/// and output from its forward to its backward, and no longer.
///
/// Pieces: exercise 21's (`stage.is_first()` / `is_last()`, `stage.forward`,
/// `stage.backward`, `stage.gradients`, `stage.activation_like`, `pg.send`,
/// `pg.recv`, `Var::from_tensor`, `store.get`, `Gradients::accumulate`),
/// `pg.send_recv`, `stage.index()` and `stage.stages()` (s and S), and
/// `std::collections::VecDeque` (`push_back`, `pop_front`).
pub fn one_f_one_b_step(
    pg: &dyn ProcessGroup,
    stage: &PipelineStage,
    micro_batches: &[Tensor],
) -> Result<PipelineStep> {
    let _ = (&pg, &stage, &micro_batches);
    todo!("Exercise 24: A pipelined step (1F1B); run `cargo xtask hint 24`")
}
