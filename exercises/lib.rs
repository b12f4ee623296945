//! # Distributed LLM training, by doing
//!
//! The library a learner completes. Each exercise is one function in
//! `phase*/exNN_*.rs` whose body is a `todo!()`; everything around it — the
//! model's structs, the parameter store, the recompute engine — is complete.
//! Run `cargo xtask next` to see where to start.
//!
//! With `--features solutions` the exercise files are swapped for the reference
//! bodies in `solutions/`, and the crate is a working reference implementation.

pub mod autograd;
pub mod data;
pub mod distributed;
pub mod fsdp;
pub mod memory;
pub mod model;
pub mod phase1_model;
pub mod phase2_training;
pub mod phase3_fsdp;
pub mod train;

/// Fused CPU kernels with their own backward pass (the `workbook-kernels` crate in `kernels/`).
pub use workbook_kernels as kernels;

pub use autograd::Recompute;
pub use model::{
    init_params, param_specs, Block, CausalSelfAttention, ForwardPass, Gpt, GptConfig, InitRng,
    Mlp, ParamKind, ParamSpec, ParamStore, RmsNorm, RotaryCache,
};
pub use phase1_model::{apply_rotary_pos_emb, causal_attention, init_parameter, rotate_half};
