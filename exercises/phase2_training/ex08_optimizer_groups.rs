//! # Exercise 8: AdamW with parameter groups
//!
//! Weight decay pulls every weight a little toward zero each step
//! (`p ← p − lr · wd · p`), which keeps the large matrices from growing without
//! bound. It is wrong for two kinds of parameters:
//!
//! - **norm weights** are scales that start at 1; decaying them pulls every
//!   normalised activation toward zero;
//! - **biases** are offsets; shrinking them regularises nothing useful.
//!
//! So the parameters are split into two groups: matrices and embeddings (2-D
//! tensors) decay, norm weights and biases (1-D tensors) do not. Every parameter
//! belongs to exactly one group; one left out would never be updated.
//!
//! ```text
//! group 0: weight_decay = config.weight_decay   embed_tokens, q/k/v/o_proj, gate/up/down_proj, lm_head weights
//! group 1: weight_decay = 0                     *_layernorm.weight, model.norm.weight, *.bias
//! ```
//!
//! Read first: Loshchilov & Hutter 2019, "Decoupled Weight Decay Regularization".
//! Guide: `guide/src/phase2/08-optimizer-groups.md`. Test: `cargo test exercise_08`.

use candle_core::Result;

use crate::model::ParamStore;
use crate::train::{AdamW, OptimizerConfig};

/// Builds AdamW over every parameter in `params`, in two [`ParamGroup`](crate::train::ParamGroup)s:
/// 2-D and larger tensors with `config.weight_decay`, the rest with 0.
///
/// - `params.iter()` yields `(name, var)` in name order; `var.rank()` is the number of dimensions.
/// - `AdamW::new(groups, config.adamw)` creates the optimizer.
pub fn build_optimizer(params: &ParamStore, config: &OptimizerConfig) -> Result<AdamW> {
    todo!("Exercise 8: AdamW parameter groups; run `cargo xtask hint 8`")
}
