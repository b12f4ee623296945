//! # Exercise 7: the GPT forward pass, next-token loss and activation checkpointing
//!
//! Everything comes together:
//!
//! ```text
//! idx (B, T) token ids
//!   → embed_tokens          (B, T, C)
//!   → block 0 … block L-1   (B, T, C)   each: x + attn(norm(x)), then + mlp(norm(·))
//!   → norm                  (B, T, C)   the final RMSNorm
//!   → lm_head               (B, T, V)   logits: a score for every possible next token
//! ```
//!
//! **The loss predicts the next token.** The logits at position t are the
//! model's scores for the token at position t + 1, and `labels` come aligned
//! with `idx` (usually `labels = idx`): the model does the shifting. The loss
//! is the mean cross-entropy, −log softmax(logits)[label], over every
//! prediction that has a label to be scored against. Example, one sequence of
//! T = 3 with labels [5, 9, 2]: the logits at position 0 are scored against
//! token 9, those at position 1 against token 2, those at position 2 against
//! nothing, and the loss is the mean of those two terms.
//!
//! The loss is an f32 scalar whatever the model's dtype; for a bf16 model it
//! must agree with the f32 loss to within 2%. Cross-entropy is a log-sum-exp
//! over all V logits, a long reduction (exercise 1 showed what bf16 does to
//! those).
//!
//! **Activation checkpointing.** Backward needs every block's intermediate
//! activations; for big models they dominate memory. A block run through
//! `recompute.checkpoint(block, &x)` keeps only its input and returns what
//! `block.forward(&x)` would; [`ForwardPass::backward`](crate::ForwardPass::backward)
//! runs it again to back-propagate through it. One extra forward per block buys
//! memory that no longer grows with the block's internals. With
//! `self.activation_checkpointing` on, the tests expect every block on the
//! tape once per forward pass; with it off, none. The gradients must be
//! identical either way.
//!
//! Read first: Chen et al. 2016, "Training Deep Nets with Sublinear Memory Cost".
//! Guide: `guide/src/phase1/07-gpt-forward.md`. Test: `cargo test exercise_07`.

use candle_core::{Result, Tensor};

use crate::model::{ForwardPass, Gpt};

impl Gpt {
    /// Runs the model on `idx` (B, T) and, when `labels` (B, T) are given,
    /// computes the next-token loss.
    ///
    /// Fields: `self.embed_tokens` (`candle_nn::Embedding`), `self.blocks`
    /// (`Vec<Block>`), `self.norm` (`RmsNorm`), `self.lm_head` (a `Linear`),
    /// `self.activation_checkpointing`; each layer has `.forward` through
    /// `candle_core::Module`. The tape of checkpointed blocks is a
    /// [`Recompute`](crate::Recompute), empty at the start of every forward
    /// pass; return it in the [`ForwardPass`] with the logits (B, T, V) and the loss.
    ///
    /// The loss is [`next_token_loss`] below.
    pub fn forward(&self, idx: &Tensor, labels: Option<&Tensor>) -> Result<ForwardPass> {
        let _ = (&idx, &labels);
        todo!("Exercise 7: GPT forward, next-token loss and activation checkpointing; run `cargo xtask hint 7`")
    }
}

/// The mean next-token cross-entropy of `logits` (B, T, V) against `labels`
/// (B, T), an f32 scalar. The FSDP runtime of Phase 3 calls it too.
///
/// `labels` are aligned with the input: the logits at position t predict the
/// token at t + 1. The result is the mean over every prediction that has a
/// label to be scored against, in every sequence; for bf16 logits it must
/// agree with the f32 loss to within 2%.
///
/// Useful: `dims3`, `narrow`, `reshape`, `to_dtype`, and
/// `crate::kernels::cross_entropy`, which takes (N, V) logits and (N) targets
/// and returns their mean (a fused kernel; the same as
/// `candle_nn::loss::cross_entropy`, faster).
pub fn next_token_loss(logits: &Tensor, labels: &Tensor) -> Result<Tensor> {
    let _ = (&logits, &labels);
    todo!("Exercise 7: GPT forward, next-token loss and activation checkpointing; run `cargo xtask hint 7`")
}
