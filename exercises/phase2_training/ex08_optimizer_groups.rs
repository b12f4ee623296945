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
//! So the parameters are split into two groups: one with the `weight_decay`
//! you are given, for the matrices and embeddings, and one with 0, for the
//! norm weights and biases. Every parameter belongs to exactly one group; one
//! left out would never be updated. The groups are what PyTorch's
//! `torch.optim.AdamW(groups)` takes; here both `AdamW::new` and FSDP's
//! sharded optimizer take them.
//!
//! Some of the test model's parameters:
//!
//! ```text
//! model.embed_tokens.weight               decays
//! model.layers.0.self_attn.q_proj.weight  decays
//! model.layers.0.self_attn.q_proj.bias    no decay
//! model.layers.0.input_layernorm.weight   no decay
//! lm_head.weight                          decays
//! ```
//!
//! The rule must sort every parameter of every model this workbook builds,
//! with biases or without, and names it has never seen. What does every
//! parameter tell you about itself that separates the two kinds? A list of
//! names, or a search for "norm" in them, is easy to get almost right.
//!
//! Read first: Loshchilov & Hutter 2019, "Decoupled Weight Decay Regularization".
//! Guide: `guide/src/phase2/08-optimizer-groups.md`. Test: `cargo test exercise_08`.

use crate::model::ParamStore;
use crate::train::ParamGroup;

/// The two parameter groups of `params`: the matrices and embeddings with
/// `weight_decay`, the norm weights and biases with 0. Every parameter is in
/// exactly one group.
///
/// - `params.iter()` yields `(name, var)` in name order; a `Var` derefs to
///   its `Tensor`, so every `Tensor` method answers for it.
/// - A [`ParamGroup`] holds the names (as `String`s) and the group's weight decay.
pub fn param_groups(params: &ParamStore, weight_decay: f64) -> Vec<ParamGroup> {
    let _ = (&params, &weight_decay);
    todo!("Exercise 8: AdamW parameter groups; run `cargo xtask hint 8`")
}
