//! The learner's exercise files, wired into the crate.
//!
//! Written by `cargo xtask update` from `exercises/info.toml`; edit that file,
//! not this one. Each exercise module is read from `exercises/`, or from
//! `solutions/` with `--features solutions`, for the exercises leaned on
//! (`cargo xtask lean`) and for those whose file does not parse:
//! `build/main.rs` sets `cfg(reference = "N")` for those. `cargo xtask
//! verify` compiles a copy with a planted mistake from `target/planted/`
//! instead (`cfg(planted = "N")`), never editing the tracked files.
//! Exercises are methods of the machinery's types or free functions; a phase
//! module re-exports the latter.
//! No lint is silenced: a shipped stub borrows its arguments, so rustc's
//! warnings (an unused variable is often a dropped result) reach the learner.

#[cfg_attr(not(any(reference = "1", planted = "1")), path = "../exercises/phase1_model/ex01_rms_norm.rs")]
#[cfg_attr(reference = "1", path = "../solutions/phase1_model/ex01_rms_norm.rs")]
#[cfg_attr(planted = "1", path = "../target/planted/solutions/phase1_model/ex01_rms_norm.rs")]
mod ex01_rms_norm;

#[cfg_attr(not(any(reference = "2", planted = "2")), path = "../exercises/phase1_model/ex02_rotate_half.rs")]
#[cfg_attr(reference = "2", path = "../solutions/phase1_model/ex02_rotate_half.rs")]
#[cfg_attr(planted = "2", path = "../target/planted/solutions/phase1_model/ex02_rotate_half.rs")]
mod ex02_rotate_half;

#[cfg_attr(not(any(reference = "3", planted = "3")), path = "../exercises/phase1_model/ex03_rotary_embedding.rs")]
#[cfg_attr(reference = "3", path = "../solutions/phase1_model/ex03_rotary_embedding.rs")]
#[cfg_attr(planted = "3", path = "../target/planted/solutions/phase1_model/ex03_rotary_embedding.rs")]
mod ex03_rotary_embedding;

#[cfg_attr(not(any(reference = "4", planted = "4")), path = "../exercises/phase1_model/ex04_swiglu_mlp.rs")]
#[cfg_attr(reference = "4", path = "../solutions/phase1_model/ex04_swiglu_mlp.rs")]
#[cfg_attr(planted = "4", path = "../target/planted/solutions/phase1_model/ex04_swiglu_mlp.rs")]
mod ex04_swiglu_mlp;

#[cfg_attr(not(any(reference = "5", planted = "5")), path = "../exercises/phase1_model/ex05_causal_attention.rs")]
#[cfg_attr(reference = "5", path = "../solutions/phase1_model/ex05_causal_attention.rs")]
#[cfg_attr(planted = "5", path = "../target/planted/solutions/phase1_model/ex05_causal_attention.rs")]
mod ex05_causal_attention;

#[cfg_attr(not(any(reference = "6", planted = "6")), path = "../exercises/phase1_model/ex06_weight_init.rs")]
#[cfg_attr(reference = "6", path = "../solutions/phase1_model/ex06_weight_init.rs")]
#[cfg_attr(planted = "6", path = "../target/planted/solutions/phase1_model/ex06_weight_init.rs")]
mod ex06_weight_init;

#[cfg_attr(not(any(reference = "7", planted = "7")), path = "../exercises/phase1_model/ex07_gpt_forward.rs")]
#[cfg_attr(reference = "7", path = "../solutions/phase1_model/ex07_gpt_forward.rs")]
#[cfg_attr(planted = "7", path = "../target/planted/solutions/phase1_model/ex07_gpt_forward.rs")]
mod ex07_gpt_forward;

#[cfg_attr(not(any(reference = "8", planted = "8")), path = "../exercises/phase2_training/ex08_optimizer_groups.rs")]
#[cfg_attr(reference = "8", path = "../solutions/phase2_training/ex08_optimizer_groups.rs")]
#[cfg_attr(planted = "8", path = "../target/planted/solutions/phase2_training/ex08_optimizer_groups.rs")]
mod ex08_optimizer_groups;

#[cfg_attr(not(any(reference = "9", planted = "9")), path = "../exercises/phase2_training/ex09_lr_schedule.rs")]
#[cfg_attr(reference = "9", path = "../solutions/phase2_training/ex09_lr_schedule.rs")]
#[cfg_attr(planted = "9", path = "../target/planted/solutions/phase2_training/ex09_lr_schedule.rs")]
mod ex09_lr_schedule;

#[cfg_attr(not(any(reference = "10", planted = "10")), path = "../exercises/phase2_training/ex10_train_step.rs")]
#[cfg_attr(reference = "10", path = "../solutions/phase2_training/ex10_train_step.rs")]
#[cfg_attr(planted = "10", path = "../target/planted/solutions/phase2_training/ex10_train_step.rs")]
mod ex10_train_step;

#[cfg_attr(not(any(reference = "11", planted = "11")), path = "../exercises/phase2_training/ex11_checkpoint.rs")]
#[cfg_attr(reference = "11", path = "../solutions/phase2_training/ex11_checkpoint.rs")]
#[cfg_attr(planted = "11", path = "../target/planted/solutions/phase2_training/ex11_checkpoint.rs")]
mod ex11_checkpoint;

#[cfg_attr(not(any(reference = "12", planted = "12")), path = "../exercises/phase3_fsdp/ex12_sharding_strategy.rs")]
#[cfg_attr(reference = "12", path = "../solutions/phase3_fsdp/ex12_sharding_strategy.rs")]
#[cfg_attr(planted = "12", path = "../target/planted/solutions/phase3_fsdp/ex12_sharding_strategy.rs")]
mod ex12_sharding_strategy;

#[cfg_attr(not(any(reference = "13", planted = "13")), path = "../exercises/phase3_fsdp/ex13_mixed_precision.rs")]
#[cfg_attr(reference = "13", path = "../solutions/phase3_fsdp/ex13_mixed_precision.rs")]
#[cfg_attr(planted = "13", path = "../target/planted/solutions/phase3_fsdp/ex13_mixed_precision.rs")]
mod ex13_mixed_precision;

#[cfg_attr(not(any(reference = "14", planted = "14")), path = "../exercises/phase3_fsdp/ex14_wrap_policy.rs")]
#[cfg_attr(reference = "14", path = "../solutions/phase3_fsdp/ex14_wrap_policy.rs")]
#[cfg_attr(planted = "14", path = "../target/planted/solutions/phase3_fsdp/ex14_wrap_policy.rs")]
mod ex14_wrap_policy;

#[cfg_attr(not(any(reference = "15", planted = "15")), path = "../exercises/phase3_fsdp/ex15_fsdp_checkpoint.rs")]
#[cfg_attr(reference = "15", path = "../solutions/phase3_fsdp/ex15_fsdp_checkpoint.rs")]
#[cfg_attr(planted = "15", path = "../target/planted/solutions/phase3_fsdp/ex15_fsdp_checkpoint.rs")]
mod ex15_fsdp_checkpoint;

#[cfg_attr(
    not(any(reference = "16", planted = "16")),
    path = "../exercises/phase4_under_the_hood/ex16_ring_all_reduce.rs"
)]
#[cfg_attr(reference = "16", path = "../solutions/phase4_under_the_hood/ex16_ring_all_reduce.rs")]
#[cfg_attr(planted = "16", path = "../target/planted/solutions/phase4_under_the_hood/ex16_ring_all_reduce.rs")]
mod ex16_ring_all_reduce;

#[cfg_attr(
    not(any(reference = "17", planted = "17")),
    path = "../exercises/phase4_under_the_hood/ex17_sharded_adamw.rs"
)]
#[cfg_attr(reference = "17", path = "../solutions/phase4_under_the_hood/ex17_sharded_adamw.rs")]
#[cfg_attr(planted = "17", path = "../target/planted/solutions/phase4_under_the_hood/ex17_sharded_adamw.rs")]
mod ex17_sharded_adamw;

#[cfg_attr(not(any(reference = "18", planted = "18")), path = "../exercises/phase4_under_the_hood/ex18_powersgd.rs")]
#[cfg_attr(reference = "18", path = "../solutions/phase4_under_the_hood/ex18_powersgd.rs")]
#[cfg_attr(planted = "18", path = "../target/planted/solutions/phase4_under_the_hood/ex18_powersgd.rs")]
mod ex18_powersgd;

#[cfg_attr(
    not(any(reference = "19", planted = "19")),
    path = "../exercises/phase4_under_the_hood/ex19_overlapped_ddp.rs"
)]
#[cfg_attr(reference = "19", path = "../solutions/phase4_under_the_hood/ex19_overlapped_ddp.rs")]
#[cfg_attr(planted = "19", path = "../target/planted/solutions/phase4_under_the_hood/ex19_overlapped_ddp.rs")]
mod ex19_overlapped_ddp;

#[cfg_attr(
    not(any(reference = "20", planted = "20")),
    path = "../exercises/phase4_under_the_hood/ex20_tensor_parallel_mlp.rs"
)]
#[cfg_attr(reference = "20", path = "../solutions/phase4_under_the_hood/ex20_tensor_parallel_mlp.rs")]
#[cfg_attr(planted = "20", path = "../target/planted/solutions/phase4_under_the_hood/ex20_tensor_parallel_mlp.rs")]
mod ex20_tensor_parallel_mlp;

#[cfg_attr(not(any(reference = "21", planted = "21")), path = "../exercises/phase4_under_the_hood/ex21_gpipe.rs")]
#[cfg_attr(reference = "21", path = "../solutions/phase4_under_the_hood/ex21_gpipe.rs")]
#[cfg_attr(planted = "21", path = "../target/planted/solutions/phase4_under_the_hood/ex21_gpipe.rs")]
mod ex21_gpipe;

#[cfg_attr(
    not(any(reference = "22", planted = "22")),
    path = "../exercises/phase4_under_the_hood/ex22_fsdp_unit_step.rs"
)]
#[cfg_attr(reference = "22", path = "../solutions/phase4_under_the_hood/ex22_fsdp_unit_step.rs")]
#[cfg_attr(planted = "22", path = "../target/planted/solutions/phase4_under_the_hood/ex22_fsdp_unit_step.rs")]
mod ex22_fsdp_unit_step;

/// Exercise 22's reference, which the FSDP trainer (Phase 3) runs while the exercise holds its stub.
#[cfg(stand_in = "22")]
#[path = "../solutions/phase4_under_the_hood/ex22_fsdp_unit_step.rs"]
mod ex22_fsdp_unit_step_stand_in;

#[cfg_attr(
    not(any(reference = "23", planted = "23")),
    path = "../exercises/phase4_under_the_hood/ex23_tensor_parallel_block.rs"
)]
#[cfg_attr(reference = "23", path = "../solutions/phase4_under_the_hood/ex23_tensor_parallel_block.rs")]
#[cfg_attr(planted = "23", path = "../target/planted/solutions/phase4_under_the_hood/ex23_tensor_parallel_block.rs")]
mod ex23_tensor_parallel_block;

#[cfg_attr(not(any(reference = "24", planted = "24")), path = "../exercises/phase4_under_the_hood/ex24_one_f_one_b.rs")]
#[cfg_attr(reference = "24", path = "../solutions/phase4_under_the_hood/ex24_one_f_one_b.rs")]
#[cfg_attr(planted = "24", path = "../target/planted/solutions/phase4_under_the_hood/ex24_one_f_one_b.rs")]
mod ex24_one_f_one_b;

#[cfg_attr(not(any(reference = "25", planted = "25")), path = "../exercises/phase4_under_the_hood/ex25_device_mesh.rs")]
#[cfg_attr(reference = "25", path = "../solutions/phase4_under_the_hood/ex25_device_mesh.rs")]
#[cfg_attr(planted = "25", path = "../target/planted/solutions/phase4_under_the_hood/ex25_device_mesh.rs")]
mod ex25_device_mesh;

#[cfg_attr(
    not(any(reference = "26", planted = "26")),
    path = "../exercises/phase4_under_the_hood/ex26_data_parallel.rs"
)]
#[cfg_attr(reference = "26", path = "../solutions/phase4_under_the_hood/ex26_data_parallel.rs")]
#[cfg_attr(planted = "26", path = "../target/planted/solutions/phase4_under_the_hood/ex26_data_parallel.rs")]
mod ex26_data_parallel;

#[cfg_attr(
    not(any(reference = "27", planted = "27")),
    path = "../exercises/phase4_under_the_hood/ex27_sequence_parallel.rs"
)]
#[cfg_attr(reference = "27", path = "../solutions/phase4_under_the_hood/ex27_sequence_parallel.rs")]
#[cfg_attr(planted = "27", path = "../target/planted/solutions/phase4_under_the_hood/ex27_sequence_parallel.rs")]
mod ex27_sequence_parallel;

/// Phase 1: Model (exercises 1–7).
pub mod phase1_model {
    pub use super::ex02_rotate_half::rotate_half;
    pub use super::ex03_rotary_embedding::apply_rotary_pos_emb;
    pub use super::ex05_causal_attention::causal_attention;
    pub use super::ex06_weight_init::init_parameter;
    pub use super::ex07_gpt_forward::next_token_loss;
}

/// Phase 2: Training (exercises 8–11).
pub mod phase2_training {
    pub use super::ex08_optimizer_groups::param_groups;
    pub use super::ex09_lr_schedule::get_lr;
}

/// Phase 3: FSDP (exercises 12–15).
pub mod phase3_fsdp {
    pub use super::ex12_sharding_strategy::sharding_plan;
    pub use super::ex13_mixed_precision::mixed_precision_policy;
    pub use super::ex14_wrap_policy::wrap_policy;
    pub use super::ex15_fsdp_checkpoint::gather_full_state;
    pub use super::ex15_fsdp_checkpoint::shard_full_state;
}

/// Phase 4: Under the hood (exercises 16–27).
pub mod phase4_under_the_hood {
    pub use super::ex16_ring_all_reduce::ring_all_reduce;
    pub use super::ex19_overlapped_ddp::overlapped_all_reduce;
    pub use super::ex20_tensor_parallel_mlp::copy_to_tensor_parallel;
    pub use super::ex20_tensor_parallel_mlp::reduce_from_tensor_parallel;
    pub use super::ex21_gpipe::gpipe_step;
    pub use super::ex22_fsdp_unit_step::fsdp_backward;
    pub use super::ex22_fsdp_unit_step::fsdp_forward;
    pub use super::ex23_tensor_parallel_block::tensor_parallel_block;
    pub use super::ex24_one_f_one_b::one_f_one_b_step;
    pub use super::ex25_device_mesh::axis_group;
    pub use super::ex25_device_mesh::mesh_coords;
    pub use super::ex26_data_parallel::DataParallel;
    pub use super::ex27_sequence_parallel::all_gather_tokens;
    pub use super::ex27_sequence_parallel::reduce_scatter_tokens;
    pub use super::ex27_sequence_parallel::sequence_parallel_block;
}

/// The exercises a runtime calls before their phase: the learner's body once
/// started, the reference while the file still holds its stub.
pub mod called_early {
    #[cfg(not(stand_in = "22"))]
    pub use super::ex22_fsdp_unit_step::{fsdp_backward, fsdp_forward};
    #[cfg(stand_in = "22")]
    pub use super::ex22_fsdp_unit_step_stand_in::{fsdp_backward, fsdp_forward};
}

/// The rule that chose each exercise's body, the build script's own.
#[path = "../build/body.rs"]
mod body;

/// Which body each exercise runs, as `build/main.rs` chose it.
pub mod bodies {
    include!(concat!(env!("OUT_DIR"), "/exercise_bodies.rs"));

    pub use super::body::Body;

    /// Which body exercise `number` runs in this build, by the build script's rule.
    pub fn body(number: u32) -> Body {
        let parses = !UNPARSABLE.iter().any(|(n, _)| *n == number);
        Body::of(REFERENCE.contains(&number), parses, UNFINISHED.contains(&number))
    }
}
