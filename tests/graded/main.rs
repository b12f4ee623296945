//! The graded tests: one module per exercise, so that `cargo test exercise_05`
//! grades exercise 5. Expected numbers come from PyTorch (`tests/fixtures/generate.py`).
//! `scaffolding` holds ungraded checks of the code around the exercises.

mod support;

// BEGIN exercise modules: written by `cargo xtask update` from exercises/info.toml
mod exercise_01;
mod exercise_02;
mod exercise_03;
mod exercise_04;
mod exercise_05;
mod exercise_06;
mod exercise_07;
mod exercise_08;
mod exercise_09;
mod exercise_10;
mod exercise_11;
mod exercise_12;
mod exercise_13;
mod exercise_14;
mod exercise_15;
mod exercise_16;
mod exercise_17;
mod exercise_18;
mod exercise_19;
mod exercise_20;
mod exercise_21;
mod exercise_22;
mod exercise_23;
mod exercise_24;
// END exercise modules
mod data;
mod distributed;
mod fsdp_runs;
#[cfg(feature = "cuda")]
mod gpu;
#[cfg(feature = "nccl")]
mod gpu_ranks;
mod kernels;
mod phase_2;
mod phase_3;
mod phase_4;
mod pipeline_runs;
mod process_ranks;
mod processes;
mod scaffolding;
mod store;
mod watchdog;
