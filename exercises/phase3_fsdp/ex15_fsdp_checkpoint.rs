//! # Exercise 15: FSDP checkpoints — gather to save, shard to load
//!
//! Under FSDP no rank holds the whole model: each keeps, per unit, a shard of
//! a flat, padded buffer. A checkpoint that only the same number of ranks
//! could read back would be a poor one, so the state is **gathered** into
//! whole tensors, written in exactly the format of Phase 2's checkpoints
//! (PyTorch's `FULL_STATE_DICT`), and **sharded again** on load, by however
//! many ranks the loading run has. You write those two halves; the trainer
//! around them writes the file (rank 0 alone, as in exercise 11) and reads
//! it. Every FSDP run uses them: plain `--strategy fsdp` and FSDP on a
//! device mesh (`--pp`, `--tp`), whose units are a pipeline stage's.
//!
//! What a unit of 5 elements, `w` (2×2) and `g` (1,), looks like on 2 ranks
//! (padded to 6, a shard of 3), what the save hands on, and what 4 ranks load:
//!
//! ```text
//! flat buffer, saving run      [ 1  2  3  4 | 5 | 0 ]     w = [[1, 2], [3, 4]], g = [5], 0 = padding
//! rank 0's local_state         params [1, 2, 3]           elements 0..3: three of w's four
//! rank 1's local_state         params [4, 5, 0]           elements 3..6: w's last, g, padding
//!                              (exp_avg, exp_avg_sq: the same ranges of the moments)
//!
//! handed to `keep`, on both    WholeParam { name: "w", value: [[1, 2], [3, 4]], moments }
//! ranks                        WholeParam { name: "g", value: [5], moments }
//!                              moments: Some([exp_avg, exp_avg_sq]) of the same shape, when asked for
//!
//! loading on 4 ranks           padded to 8, a shard of 2:
//!                              rank 0 [1, 2], rank 1 [3, 4], rank 2 [5, 0], rank 3 [0, 0]
//! ```
//!
//! The contract, for every number of ranks and every strategy:
//!
//! - **What the save hands on does not depend on how the run was sharded**:
//!   every parameter of every unit once, by name, whole, f32, no padding,
//!   the values Phase 2's trainer holds for the same weights; with
//!   `with_moments`, AdamW's two moments of it too (the trainer asks for
//!   them once AdamW has stepped: before that there are none, as in Phase
//!   2's AdamW).
//! - **It is called on every rank of `group`** (the ranks the units are
//!   sharded across) with the same units, and every rank's `keep` is handed
//!   the same whole tensors: the trainer's `keep` writes them on rank 0 and
//!   drops them elsewhere.
//! - **No rank holds the whole model to save it**: FSDP exists because one
//!   device cannot hold the model and its optimizer state, so no rank may
//!   hold the gathered whole either. At GPT-2 124M's shape the parameters
//!   and two moments are 1.9 GB, one block's 85 MB. Whatever `keep` is
//!   handed, the caller lets go of; the tests measure rank 0's heap while it
//!   gathers a model of 8 blocks for a `keep` that drops each tensor, and
//!   allow half of the whole.
//! - **A loaded rank holds what a rank of its own run holds**: its
//!   `LocalState` is the saved state as this run's layout and this rank's
//!   range cut it, zero moments when the checkpoint holds none.
//!
//! The facts to derive the rest from: a rank's `local_state()` covers its
//! `local_range()` of the unit's padded flat buffer, so it holds 1/N of each
//! sharded unit; a unit may be unsharded (`is_sharded()` false, the same on
//! every rank), and then the range is the whole buffer; a collective
//! completes only when every rank calls it; an all-gather concatenates the
//! ranks' tensors in rank order; `unflatten` accepts only the unit's padded
//! length and gives the parameters in the layout's order, the same for each
//! buffer of the unit. Which units need a gather, when a tensor may be handed
//! on, and how a loading rank cuts out its part are yours to work out (the
//! 3-rank case is a good test).
//!
//! Read first: PyTorch's FSDP `state_dict_type` docs (`FULL_STATE_DICT`,
//! `FullStateDictConfig(offload_to_cpu, rank0_only)`).
//! Guide: `guide/src/phase3/15-fsdp-checkpoint.md`. Test: `cargo test exercise_15`.

use std::collections::HashMap;

use candle_core::{Result, Tensor};

use crate::distributed::ProcessGroup;
use crate::parallel::fsdp::{LocalState, ShardedUnit, WholeParam};

/// Hands `keep` every parameter of `units`, whole (and, with `with_moments`,
/// its two AdamW moments), gathered across `group` a unit at a time. Called
/// on every rank of `group`.
///
/// Pieces: `group.all_gather(&t)`; per unit, `.local_state()?` (a
/// `LocalState { params, exp_avg, exp_avg_sq }` of flat f32 tensors),
/// `.is_sharded()`, `.name` and `.layout.unflatten(&whole)?` ((name, tensor)
/// pairs, padding dropped); `WholeParam { name, value, moments }`.
pub fn gather_full_state<'a>(
    units: impl IntoIterator<Item = &'a ShardedUnit>,
    group: &dyn ProcessGroup,
    with_moments: bool,
    keep: &mut dyn FnMut(WholeParam) -> Result<()>,
) -> Result<()> {
    let _ = (&units, &group, &with_moments, &keep);
    todo!("Exercise 15: FSDP checkpoint; run `cargo xtask hint 15`")
}

/// This rank's `LocalState` of `unit` from whole tensors by parameter name:
/// `params` and, when the checkpoint holds moments, `moments` (`exp_avg`,
/// `exp_avg_sq`, each by parameter name); without them, zero moments.
///
/// Pieces: `unit.local_range()`, `.device()` and `.layout.flatten(&named,
/// device)?` (the unit's padded f32 buffer from a map by name);
/// `Tensor::narrow`, `zeros_like`.
pub fn shard_full_state(
    unit: &ShardedUnit,
    params: &HashMap<String, Tensor>,
    moments: Option<[&HashMap<String, Tensor>; 2]>,
) -> Result<LocalState> {
    let _ = (&unit, &params, &moments);
    todo!("Exercise 15: FSDP checkpoint; run `cargo xtask hint 15`")
}
