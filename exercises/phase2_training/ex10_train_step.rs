//! # Exercise 10: one training step, with gradient accumulation and DDP
//!
//! The step where everything meets. A batch too large for memory is split
//! into k **micro-batches**, and one optimizer step follows — "a poor man's
//! large batch": the step must be the one a single batch of all k would
//! give. Under DDP, the W ranks' micro-batches together make that batch.
//!
//! What one step must compute (on every rank):
//!
//! ```text
//! loss    the mean of this rank's k micro-batch losses
//! g       the gradient of the mean loss over all k·W micro-batches: the same on every rank
//! norm    ‖g‖₂, before clipping
//! update  AdamW with g · min(1, max_grad_norm / ‖g‖₂), at lr = schedule(t),
//!         t = the optimizer steps taken before this one (0 at the first)
//! after   t + 1, and no gradient left over for the next step
//! tokens  every token of every micro-batch
//! ```
//!
//! Worked numbers, one weight, k = 2, W = 2: rank 0's micro-batches give
//! gradients 0.6 and 1.0, rank 1's give 0.2 and 0.6. Each rank's mean is 0.8
//! and 0.4, g = 0.6 on both, the norm reported is 0.6, and with
//! max_grad_norm 0.5 AdamW is handed 0.5 on both ranks.
//!
//! Three properties decide where each piece goes: the gradient is linear in
//! the loss, the average over ranks is linear too, and clipping is not
//! (clip(a) + clip(b) ≠ clip(a + b)). Every synchronisation is an all-reduce
//! of the whole gradient across the ranks, and `backward()` differentiates
//! the loss stored in the pass, as it is.
//!
//! Shapes: each micro-batch is (B, T) token ids (u32); the model predicts each
//! next token of the same tensor, so it is both input and labels.
//!
//! Read first: PyTorch's DDP notes (`no_sync`, gradient bucketing); Goyal et
//! al. 2017, "Accurate, Large Minibatch SGD", section 2.
//! Guide: `guide/src/phase2/10-train-step.md`. Test: `cargo test exercise_10`.

use candle_core::{Result, Tensor};

use crate::train::{StepStats, Trainer};

impl Trainer {
    /// One optimizer step over `micro_batches` (each (B, T), usually
    /// `self.config.grad_accum_steps` of them). Returns the mean loss, the
    /// gradient norm before clipping, the learning rate used and the tokens seen.
    ///
    /// The pieces, by owner:
    /// - `self.model.forward(idx, Some(labels))` gives a `ForwardPass`: its
    ///   `.loss` is `Some(scalar)` when labels are given, and its `.backward()`
    ///   gives candle's `GradStore`.
    /// - `crate::autograd::Gradients`: `from_store(&self.params, &store)` names a
    ///   `GradStore` by parameter; `scale`, `accumulate`, `clip_global_norm`
    ///   (it returns the norm before clipping) and `clear`. `self.grads` is the
    ///   step's buffer, empty when the step starts.
    /// - `self.ddp.sync_gradients`, `self.config.max_grad_norm`,
    ///   `self.config.schedule.lr(step)`, `self.optimizer.step(params, grads, lr)`.
    /// - A scalar tensor's value: `to_scalar::<f32>()`; a batch's token count:
    ///   `elem_count()`.
    pub fn train_step(&mut self, micro_batches: &[Tensor]) -> Result<StepStats> {
        let _ = &micro_batches;
        todo!("Exercise 10: Train step with gradient accumulation; run `cargo xtask hint 10`")
    }
}
