//! The graded tests: one module per exercise, so that `cargo test exercise_05`
//! grades exercise 5. Expected numbers come from PyTorch (`tests/fixtures/generate.py`).
//! `scaffolding` holds ungraded checks of the code around the exercises.
//! The workbook's own checks build only some exercises' modules at times
//! (`WORKBOOK_ONLY_TESTS_OF`, see `tests/build.rs`); the helpers unused then are not
//! a defect.
#![cfg_attr(only_some_tests, allow(dead_code, unused_imports))]

/// Counts each thread's heap bytes: a rank's peak while it saves a
/// checkpoint (exercise 15) is measured with it.
#[global_allocator]
static ALLOCATOR: workbook::memory::CountingAllocator = workbook::memory::CountingAllocator;

mod all_reduce_log;
mod fsdp_runs;
mod pipeline_runs;
mod process_ranks;
mod support;
mod synchronous_sends;

// BEGIN exercise modules: written by `cargo xtask update` from exercises/info.toml
#[cfg(any(not(only_some_tests), tests_of = "1"))]
mod exercise_01;
#[cfg(any(not(only_some_tests), tests_of = "2"))]
mod exercise_02;
#[cfg(any(not(only_some_tests), tests_of = "3"))]
mod exercise_03;
#[cfg(any(not(only_some_tests), tests_of = "4"))]
mod exercise_04;
#[cfg(any(not(only_some_tests), tests_of = "5"))]
mod exercise_05;
#[cfg(any(not(only_some_tests), tests_of = "6"))]
mod exercise_06;
#[cfg(any(not(only_some_tests), tests_of = "7"))]
mod exercise_07;
#[cfg(any(not(only_some_tests), tests_of = "8"))]
mod exercise_08;
#[cfg(any(not(only_some_tests), tests_of = "9"))]
mod exercise_09;
#[cfg(any(not(only_some_tests), tests_of = "10", tests_of = "11"))]
mod exercise_10;
#[cfg(any(not(only_some_tests), tests_of = "11"))]
mod exercise_11;
#[cfg(any(not(only_some_tests), tests_of = "12", tests_of = "14"))]
mod exercise_12;
#[cfg(any(not(only_some_tests), tests_of = "13"))]
mod exercise_13;
#[cfg(any(not(only_some_tests), tests_of = "14"))]
mod exercise_14;
#[cfg(any(not(only_some_tests), tests_of = "15"))]
mod exercise_15;
#[cfg(any(not(only_some_tests), tests_of = "16"))]
mod exercise_16;
#[cfg(any(not(only_some_tests), tests_of = "17"))]
mod exercise_17;
#[cfg(any(not(only_some_tests), tests_of = "18"))]
mod exercise_18;
#[cfg(any(not(only_some_tests), tests_of = "19"))]
mod exercise_19;
#[cfg(any(not(only_some_tests), tests_of = "20"))]
mod exercise_20;
#[cfg(any(not(only_some_tests), tests_of = "21"))]
mod exercise_21;
#[cfg(any(not(only_some_tests), tests_of = "22"))]
mod exercise_22;
#[cfg(any(not(only_some_tests), tests_of = "23", tests_of = "27"))]
mod exercise_23;
#[cfg(any(not(only_some_tests), tests_of = "24"))]
mod exercise_24;
#[cfg(any(not(only_some_tests), tests_of = "25"))]
mod exercise_25;
#[cfg(any(not(only_some_tests), tests_of = "26"))]
mod exercise_26;
#[cfg(any(not(only_some_tests), tests_of = "27"))]
mod exercise_27;
// END exercise modules
#[cfg(not(only_some_tests))]
mod candle_primer;
#[cfg(not(only_some_tests))]
mod data;
#[cfg(not(only_some_tests))]
mod distributed;
#[cfg(all(feature = "cuda", not(only_some_tests)))]
mod gpu;
#[cfg(all(feature = "nccl", not(only_some_tests)))]
mod gpu_ranks;
#[cfg(not(only_some_tests))]
mod kernels;
#[cfg(not(only_some_tests))]
mod phase_2;
#[cfg(not(only_some_tests))]
mod phase_3;
#[cfg(not(only_some_tests))]
mod phase_4;
#[cfg(not(only_some_tests))]
mod processes;
#[cfg(not(only_some_tests))]
mod scaffolding;
#[cfg(not(only_some_tests))]
mod store;
#[cfg(not(only_some_tests))]
mod subgroups;
#[cfg(not(only_some_tests))]
mod watchdog;
