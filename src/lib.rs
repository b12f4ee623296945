//! # Distributed LLM training, by doing
//!
//! The library a learner completes. Each exercise is one function in
//! `exercises/phase*/exNN_*.rs` whose body is a `todo!()`; everything around
//! it is complete and lives here, in folders that follow the architecture:
//!
//! | module            | what it holds                                                        |
//! |-------------------|----------------------------------------------------------------------|
//! | [`model`]         | the Llama-style GPT: config, parameters, modules (exercises 1–7)     |
//! | [`autograd`]      | gradients by name, recomputation for activation checkpointing        |
//! | [`train`]         | optimizer, schedule, checkpoints, the trainer (exercises 8–11)       |
//! | [`parallel`]      | how ranks share the work: [`parallel::ddp`], [`parallel::fsdp`] (12–15) |
//! | [`distributed`]   | process groups and their backends, the launcher, `env://`           |
//! | [`data`]          | tokenizer, token files, datasets, the distributed sampler            |
//! | [`memory`]        | heap accounting per thread, allocator tuning                          |
//! | [`gpu`]           | opening a GPU: one compute stream that every thread queues on          |
//! | [`timeline`]      | what each rank did when, as a Chrome trace                            |
//! | [`words`]         | counts in words for what the programs print: "1 step", "2 steps"      |
//!
//! The exercise files are wired in as [`phase1_model`], [`phase2_training`],
//! [`phase3_fsdp`] and [`phase4_under_the_hood`] (see `src/exercises.rs`).
//! With `--features solutions` they are swapped for the reference bodies in
//! `solutions/`, and the crate is a working reference implementation. Run `cargo xtask next` to see where to
//! start.

pub mod autograd;
pub mod data;
pub mod distributed;
pub mod error;
mod exercises;
pub mod gpu;
pub mod hf;
pub mod memory;
pub mod model;
pub mod parallel;
pub mod timeline;
pub mod train;
pub mod words;

pub use exercises::{
    bodies as exercise_bodies, called_early, phase1_model, phase2_training, phase3_fsdp, phase4_under_the_hood,
};

/// Fused CPU kernels with their own backward pass (the `workbook-kernels` crate in `kernels/`).
pub use workbook_kernels as kernels;

pub use autograd::Recompute;
pub use model::{
    init_params, param_specs, Block, CausalSelfAttention, ForwardPass, Gpt, GptConfig, InitRng, Mlp, ParamKind,
    ParamSpec, ParamStore, RmsNorm, RotaryCache,
};
pub use phase1_model::{apply_rotary_pos_emb, causal_attention, init_parameter, rotate_half};
