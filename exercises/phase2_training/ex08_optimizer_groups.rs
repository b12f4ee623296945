//! # Exercise 8: AdamW parameter groups
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
//! belongs to exactly one group; one left out would never be updated. The
//! groups are what PyTorch's `torch.optim.AdamW(groups)` takes; here both
//! `AdamW::new` and FSDP's sharded optimizer take them.
//!
//! ```text
//! group 0: weight_decay = weight_decay   embed_tokens, q/k/v/o_proj, gate/up/down_proj, lm_head weights
//! group 1: weight_decay = 0              *_layernorm.weight, model.norm.weight, *.bias
//! ```
//!
//! Read first: Loshchilov & Hutter 2019, "Decoupled Weight Decay Regularization".
//! Guide: `guide/src/phase2/08-optimizer-groups.md`. Test: `cargo test exercise_08`.

use crate::model::ParamStore;
use crate::train::ParamGroup;

/// The two parameter groups of `params`: 2-D and larger tensors with
/// `weight_decay`, the rest with 0. Every parameter is in exactly one group.
///
/// - `params.iter()` yields `(name, var)` in name order; `var.rank()` is the number of dimensions.
/// - A [`ParamGroup`] holds the names (as `String`s) and the group's weight decay.
pub fn param_groups(params: &ParamStore, weight_decay: f64) -> Vec<ParamGroup> {
    let _ = (&params, &weight_decay);
    todo!("Exercise 8: AdamW parameter groups; run `cargo xtask hint 8`")
}
