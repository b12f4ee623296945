//! # Exercise 15: FSDP checkpoints — gather to save, shard to load
//!
//! Under FSDP no rank holds the whole model: each keeps, per unit, a shard of
//! a flat, padded buffer. A checkpoint that only the same number of ranks
//! could read back would be a poor one, so the state is **gathered** into
//! whole tensors, written by rank 0 in exactly the format of Phase 2's
//! checkpoints (PyTorch's `FULL_STATE_DICT` with `rank0_only`), and **sharded
//! again** on load — by however many ranks the loading run has.
//!
//! What a unit of 5 elements, `w` (2×2) and `g` (1,), looks like on 2 ranks
//! (padded to 6, a shard of 3), what the file holds, and what 4 ranks load:
//!
//! ```text
//! flat buffer, saving run      [ 1  2  3  4 | 5 | 0 ]     w = [[1, 2], [3, 4]], g = [5], 0 = padding
//! rank 0's local_state         params [1, 2, 3]           elements 0..3: three of w's four
//! rank 1's local_state         params [4, 5, 0]           elements 3..6: w's last, g, padding
//!                              (exp_avg, exp_avg_sq: the same ranges of the moments)
//!
//! the file (rank 0 alone)      w (2×2) = [[1, 2], [3, 4]], g (1) = [5]; no padding, f32;
//!                              exp_avg.w, exp_avg.g, exp_avg_sq.w, exp_avg_sq.g once t > 0
//!
//! loading on 4 ranks           padded to 8, a shard of 2:
//!                              rank 0 [1, 2], rank 1 [3, 4], rank 2 [5, 0], rank 3 [0, 0]
//! ```
//!
//! The contract, for every number of ranks and every strategy:
//!
//! - **The file does not depend on how the run was sharded**: whole tensors
//!   by name, f32, no padding, the file Phase 2's trainer writes for the
//!   same weights. Rank 0 alone writes it, and no rank returns before it is
//!   complete, for exercise 11's reasons; `CheckpointWriter` is the same
//!   atomic write as `Checkpoint::write`, a tensor at a time.
//! - **No rank holds the whole model to save it**: FSDP exists because one
//!   device cannot hold the model and its optimizer state, so rank 0 may not
//!   hold the gathered whole either. At GPT-2 124M's shape the parameters
//!   and two moments are 1.9 GB, one block's 85 MB: the tests measure
//!   rank 0's heap while it saves a model of 8 blocks and allow half of the
//!   whole.
//! - **A loaded run holds what a run of its own shape holds**: every rank's
//!   state is the saved state as that run's layout shards it, and the
//!   counters are the saved ones.
//!
//! The facts to derive the rest from: a rank's `local_state()` covers its
//! `local_range()` of the unit's padded flat buffer, so rank 0 holds 1/N of
//! each sharded unit; a unit may be unsharded (`is_sharded()` false, the
//! same on every rank), and then the range is the whole buffer; a
//! collective completes only when every rank calls it; an all-gather
//! concatenates the ranks' tensors in rank order; `unflatten` accepts only
//! the unit's padded length. Who gathers, which units need it, and how a loading rank
//! cuts out its part are yours to work out (the 3-rank case is a good test).
//!
//! What goes in the file (same keys as exercise 11; `CheckpointWriter`
//! fixes every tensor's place when it is created, from the model's config,
//! so they can be written in any order):
//! - `params`: every parameter by name, f32, whole;
//! - `optimizer`: `exp_avg.<name>` and `exp_avg_sq.<name>` for every
//!   parameter, but only once AdamW has stepped (the trainer's counters say
//!   whether it has): before that there are no moments, as in Phase 2's AdamW;
//! - `state`: `self.trainer_state(data)` (step, counters, configs, data
//!   position, and how the run was sharded, in words).
//!
//! Read first: PyTorch's FSDP `state_dict_type` docs (`FULL_STATE_DICT`,
//! `FullStateDictConfig(offload_to_cpu, rank0_only)`).
//! Guide: `guide/src/phase3/15-fsdp-checkpoint.md`. Test: `cargo test exercise_15`.

use std::path::Path;

use candle_core::Result;

use crate::parallel::fsdp::FsdpTrainer;
use crate::train::DataPosition;

impl FsdpTrainer {
    /// Gathers the sharded state and writes it to `dir` as a whole checkpoint,
    /// a unit at a time. Called on every rank; rank 0 alone writes, and no
    /// rank returns before the checkpoint is complete.
    ///
    /// Pieces: `self.process_group()` (`.rank()`, `.all_gather(&t)`,
    /// `.barrier()`); `self.units`, each a `ShardedUnit` with `.local_state()?`
    /// (a `LocalState { params, exp_avg, exp_avg_sq }` of flat f32 tensors),
    /// `.is_sharded()` and `.layout.unflatten(&whole)?` (name → tensor,
    /// padding dropped); `self.counters.optimizer_steps`;
    /// `crate::train::CheckpointWriter`: `::create(dir, self.model_config(),
    /// DType::F32, with_moments)?`, `.put_param(name, &t)`,
    /// `.put_optimizer(name, &t)` (a failed write is `finish`'s error, so a
    /// rank never leaves the others waiting in a gather) and
    /// `.finish(&self.trainer_state(data))?`.
    pub fn save_checkpoint(&self, dir: &Path, data: Option<DataPosition>) -> Result<()> {
        let _ = (&dir, &data);
        todo!("Exercise 15: FSDP checkpoint; run `cargo xtask hint 15`")
    }

    /// Reads a whole checkpoint (written by any number of ranks, or by Phase
    /// 2's trainer) and keeps this rank's shard of it. Returns the data position.
    ///
    /// On success, for every unit, this rank's `local_state()` (parameters
    /// and both moments) is what a rank of this run, with this run's layout
    /// and padding, holds of the saving run's state; the counters are the
    /// saved ones. Called on every rank. A checkpoint of another model is an
    /// error, before anything changes. A run that has not yet stepped holds
    /// zero moments, and its file holds none.
    ///
    /// Pieces: `Checkpoint::read`, `.ensure_fits(self.model_config())`; per unit,
    /// `.local_range()`, `.device()` and `.layout.flatten(&named, device)` (a
    /// `HashMap<String, Tensor>` by parameter name → the padded f32 buffer);
    /// `Tensor::narrow`, `zeros_like`; `self.set_local_state(index, LocalState { .. })`
    /// (it takes `&mut self`: let go of the unit first) and
    /// `self.restore_counters(&state)`.
    pub fn load_checkpoint(&mut self, dir: &Path) -> Result<Option<DataPosition>> {
        let _ = &dir;
        todo!("Exercise 15: FSDP checkpoint; run `cargo xtask hint 15`")
    }
}
