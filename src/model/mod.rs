//! The Llama-style GPT the exercises complete: configuration, parameters and modules.
//!
//! Parameter names follow Hugging Face's Llama (`model.layers.0.self_attn.q_proj.weight`,
//! ...) so a checkpoint reads the same on either side.

mod attention;
mod block;
mod config;
mod gpt;
mod init;
mod linear;
mod mlp;
mod norm;
mod params;
mod rope;
mod staged_backward;

pub use attention::CausalSelfAttention;
pub use block::{Block, Layers};
pub use config::GptConfig;
pub use gpt::{lm_head, ForwardPass, Gpt, Outer};
pub use init::{init_params, init_params_where, InitRng};
pub use linear::{autocast_bf16, set_autocast_bf16, Linear};
pub use mlp::Mlp;
pub use norm::RmsNorm;
pub use params::{layer_of, param_specs, ParamKind, ParamSpec, ParamStore, Weights};
pub use rope::RotaryCache;
pub use staged_backward::gradients_handed_over;
