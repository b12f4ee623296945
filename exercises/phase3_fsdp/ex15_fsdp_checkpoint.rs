//! # Exercise 15: FSDP checkpoints — gather to save, shard to load
//!
//! Under FSDP no rank holds the whole model: each keeps, per unit, a shard of
//! a flat, padded buffer. A checkpoint that only the same number of ranks
//! could read back would be a poor one, so the state is **gathered** into
//! whole tensors, written by rank 0 in exactly the format of Phase 2's
//! checkpoints (PyTorch's `FULL_STATE_DICT` with `rank0_only`), and **sharded
//! again** on load — by however many ranks the loading run has.
//!
//! ```text
//! save, for every unit:                          load, for every unit:
//!   local = unit.local_state()   (f32, shards)     whole = layout.flatten(named tensors)  (padded)
//!   whole = all_gather(local)    ← EVERY rank      mine  = whole.narrow(0, range.start, range.len())
//!   named = layout.unflatten(whole)  (no padding)  trainer.set_local_state(unit index, mine)
//! rank 0 writes; every rank waits at a barrier
//! ```
//!
//! The trap: every rank must take part in every all-gather. "Only rank 0
//! saves, so only rank 0 gathers" leaves rank 0 waiting for ranks that never
//! come — a hang on GPUs, a timeout error here.
//!
//! What goes in the file (same keys as exercise 11):
//! - `params`: every parameter by name, f32, whole;
//! - `optimizer`: `exp_avg.<name>` and `exp_avg_sq.<name>` for every
//!   parameter, but only once AdamW has stepped (`self.counters.optimizer_steps > 0`):
//!   before that there are no moments, as in Phase 2's AdamW;
//! - `state`: `self.trainer_state(data)` (step, counters, configs, data position).
//!
//! Read first: PyTorch's FSDP `state_dict_type` docs (`FULL_STATE_DICT`,
//! `FullStateDictConfig(offload_to_cpu, rank0_only)`).
//! Guide: `guide/src/phase3/15-fsdp-checkpoint.md`. Test: `cargo test exercise_15`.

use std::path::Path;

use candle_core::Result;

use crate::parallel::fsdp::FsdpTrainer;
use crate::train::DataPosition;

impl FsdpTrainer {
    /// Gathers the sharded state and writes it to `dir` as a whole checkpoint
    /// (rank 0 writes, then every rank meets at a barrier).
    ///
    /// Pieces: `self.process_group()` (`.rank()`, `.all_gather(&t)`,
    /// `.barrier()`); `self.units`, each a `ShardedUnit` with `.local_state()?`
    /// (a `LocalState { params, exp_avg, exp_avg_sq }` of flat f32 tensors),
    /// `.is_sharded()` (false when this rank already holds the whole buffer:
    /// gathering it would repeat it N times) and `.layout.unflatten(&whole)?`
    /// (name → tensor, padding dropped); `Checkpoint { params, optimizer, state }`
    /// and its `.write(dir)` from `crate::train`.
    pub fn save_checkpoint(&self, dir: &Path, data: Option<DataPosition>) -> Result<()> {
        let _ = (&dir, &data);
        todo!("Exercise 15: FSDP checkpoint; run `cargo xtask hint 15`")
    }

    /// Reads a whole checkpoint (written by any number of ranks, or by Phase
    /// 2's trainer) and keeps this rank's shard of it. Returns the data position.
    ///
    /// The moments are keyed `exp_avg.<name>` in the file but looked up by
    /// parameter name in a layout; a checkpoint written before AdamW's first
    /// step (`state.optimizer_steps == 0`) holds none, and a fresh AdamW's are zeros.
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
