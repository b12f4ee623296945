//! Phase 1: the model (exercises 1–7).
//!
//! The files here are yours to edit. Each holds one exercise; the structs they
//! extend live in [`crate::model`]. With `--features solutions`, each module is
//! read from `solutions/phase1_model/` instead.

// A shipped stub leaves its arguments unused until the exercise is done.
#![allow(unused_variables)]

#[cfg_attr(feature = "solutions", path = "../../solutions/phase1_model/ex01_rms_norm.rs")]
mod ex01_rms_norm;
#[cfg_attr(feature = "solutions", path = "../../solutions/phase1_model/ex02_rotate_half.rs")]
mod ex02_rotate_half;
#[cfg_attr(
    feature = "solutions",
    path = "../../solutions/phase1_model/ex03_rotary_embedding.rs"
)]
mod ex03_rotary_embedding;
#[cfg_attr(feature = "solutions", path = "../../solutions/phase1_model/ex04_swiglu_mlp.rs")]
mod ex04_swiglu_mlp;
#[cfg_attr(
    feature = "solutions",
    path = "../../solutions/phase1_model/ex05_causal_attention.rs"
)]
mod ex05_causal_attention;
#[cfg_attr(feature = "solutions", path = "../../solutions/phase1_model/ex06_weight_init.rs")]
mod ex06_weight_init;
#[cfg_attr(feature = "solutions", path = "../../solutions/phase1_model/ex07_gpt_forward.rs")]
mod ex07_gpt_forward;

pub use ex02_rotate_half::rotate_half;
pub use ex03_rotary_embedding::apply_rotary_pos_emb;
pub use ex05_causal_attention::causal_attention;
pub use ex06_weight_init::init_parameter;
pub use ex07_gpt_forward::next_token_loss;
