//! # Exercise 10: one training step, with gradient accumulation and DDP
//!
//! The step where everything meets. A batch too large for memory is split
//! into k **micro-batches**; their gradients are summed, and one optimizer
//! step follows — "a poor man's large batch":
//!
//! ```text
//! for each of the k micro-batches:
//!     loss_i  = model(batch_i)                     mean next-token loss of the micro-batch
//!     grads  += ∇(loss_i / k)                      /k: the step's loss is the MEAN over micro-batches
//! DDP: average grads across ranks                  ONCE, after the last micro-batch
//! norm  = clip grads to a global L2 norm           after averaging: every rank clips the same gradients
//! lr    = schedule.lr(step)                        step counts optimizer steps from 0
//! optimizer.step(grads, lr); grads.clear(); step += 1
//! ```
//!
//! Without the `/k`, k micro-batches give k times the gradient of one big
//! batch. Synchronising inside the loop gives the right numbers but pays the
//! communication k times (PyTorch's `no_sync()` exists for this). Clipping
//! before averaging makes ranks clip different gradients. Forgetting to clear
//! the buffer adds the last step's gradients to the next.
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
    /// The order is the algorithm's, in the module doc. The pieces, by owner:
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
