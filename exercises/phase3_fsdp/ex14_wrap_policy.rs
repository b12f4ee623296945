//! # Exercise 14: the wrap policy — which modules become FSDP units
//!
//! FSDP gathers, frees and reduces parameters a *unit* at a time. The unit
//! size sets the trade-off:
//! - one unit for the whole model: one big all-gather, but every parameter is
//!   whole at once — no memory saved during compute;
//! - one unit per parameter: minimal memory, but hundreds of small collectives,
//!   each paying a fixed latency;
//! - one unit per transformer block (PyTorch's `transformer_auto_wrap_policy`):
//!   a block's weights are gathered just before it runs and freed after, so at
//!   most a block or two are whole at once, in a few dozen large collectives.
//!
//! Whatever is left outside the blocks — the token embedding, the final norm
//! and the head — goes to the **root** unit.
//!
//! ```text
//! unit "root":            model.embed_tokens.weight, model.norm.weight, lm_head.weight
//! unit "model.layers.0":  every parameter of block 0 (its norms, attention and MLP)
//! unit "model.layers.1":  every parameter of block 1
//! ...
//! ```
//!
//! With 2 blocks, no biases and an untied head, that is 3 units: the root
//! with 3 parameters, then 9 for each block (2 norm weights, q/k/v/o,
//! gate/up/down). Every
//! parameter is in exactly one unit. A model of 12 blocks has 13 units, and
//! block 1's unit must hold nothing of blocks 10 and 11.
//!
//! Under FULL_SHARD each block unit is all-gathered before its forward and
//! again before its backward, and its gradient reduce-scattered after its
//! backward; the root stays gathered from its forward to the end of backward.
//!
//! Read first: PyTorch's FSDP tutorial (auto-wrap policies) and
//! `torch.distributed.fsdp.wrap.transformer_auto_wrap_policy`.
//! Guide: `guide/src/phase3/14-wrap-policy.md`. Test: `cargo test exercise_14`.

use crate::model::GptConfig;
use crate::parallel::fsdp::FsdpUnit;

/// The FSDP units of a model with `config`: the root unit first (named
/// `ROOT_UNIT`), then one unit per block in layer order, named by
/// `block_unit_name(layer)` (`"model.layers.{layer}"`). Each lists its
/// parameter names in module order, the order of `param_specs(config)`.
///
/// Pieces: `crate::model::param_specs(config)` (each `ParamSpec` has a
/// `.name`), `crate::parallel::fsdp::{FsdpUnit, ROOT_UNIT, block_unit_name}`.
pub fn wrap_policy(config: &GptConfig) -> Vec<FsdpUnit> {
    let _ = &config;
    todo!("Exercise 14: Wrap policy; run `cargo xtask hint 14`")
}
