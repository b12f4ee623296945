//! Reference solution of exercise 7: GPT forward, next-token loss and activation checkpointing.

use candle_core::{DType, Module, Result, Tensor};

use crate::autograd::Recompute;
use crate::kernels;
use crate::model::{ForwardPass, Gpt};

impl Gpt {
    pub fn forward(&self, idx: &Tensor, labels: Option<&Tensor>) -> Result<ForwardPass> {
        let mut recompute = Recompute::default();
        let mut x = self.embed_tokens.forward(idx)?; // (B, T, C)
        for block in &self.blocks {
            x = if self.activation_checkpointing { recompute.checkpoint(block, &x)? } else { block.forward(&x)? };
        }
        let x = self.norm.forward(&x)?;
        let logits = self.lm_head.forward(&x)?; // (B, T, V)
        let loss = labels.map(|labels| next_token_loss(&logits, labels)).transpose()?;
        Ok(ForwardPass { logits, loss, recompute })
    }
}

/// Mean cross-entropy of the logits at positions 0..T-1 against the labels at 1..T.
pub fn next_token_loss(logits: &Tensor, labels: &Tensor) -> Result<Tensor> {
    let (b, t, v) = logits.dims3()?;
    let predictions = logits.narrow(1, 0, t - 1)?.reshape((b * (t - 1), v))?; // (B·(T-1), V)
    let targets = labels.narrow(1, 1, t - 1)?.reshape(b * (t - 1))?; // (B·(T-1))
    kernels::cross_entropy(&predictions.to_dtype(DType::F32)?, &targets)
}
