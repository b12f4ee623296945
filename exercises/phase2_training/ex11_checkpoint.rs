//! # Exercise 11: saving and resuming training
//!
//! Long runs stop: preemption, a crash, a node swapped out. A checkpoint must
//! hold everything that decides what the next step does, or the resumed run
//! silently differs from an uninterrupted one. The parameters are the obvious
//! part, not the only one: go through the trainer's state (`self.params`,
//! `self.optimizer`, `self.step`, the configs, the data position you are
//! handed) and ask, for each, what the first resumed step would do without
//! it. The learning rate is no state of its own: it is a function of the step.
//!
//! The contract under data parallelism, with the reason for each part:
//!
//! - **One writer.** Every rank holds the same state, so W writers would
//!   cost W times the I/O and race on the same paths: rank 0 writes, and no
//!   other rank creates anything under `dir`.
//! - **No rank returns before the checkpoint is complete.** Another rank may
//!   go on to read what rank 0 wrote. A barrier holds ranks back until all
//!   have reached it, and one that some ranks never call never completes.
//!   The test counts the barriers each rank meets in `save_checkpoint`:
//!   exactly one each. Where it must stand, and whose code reaches it, so
//!   that no rank gets past it before the checkpoint exists, is yours to
//!   work out.
//! - **A crash keeps the last good checkpoint.** `Checkpoint::write` stages
//!   the files and renames the directory into place only when it is
//!   complete; a rename is atomic, so a reader sees the old checkpoint or
//!   the new one, never half of one.
//! - **Plain names.** In PyTorch the DDP wrapper renames every parameter
//!   (`module.` prefix) and must be unwrapped before saving; here DDP lives
//!   beside the model, so `self.params` already carries the plain names a
//!   single-process run loads.
//! - **Loading runs on every rank**, and ends with every rank in the same
//!   state.
//!
//! Two ranks save at step 4, after AdamW has stepped once (a step can skip
//! the optimizer: FSDP's loss scaler does on overflow):
//!
//! ```text
//! dir/          written by rank 0: model.safetensors, optimizer.safetensors,
//!               trainer_state.json (step 4, optimizer steps 1, configs, data), ...
//! rank 1        wrote nothing
//! barriers      rank 0 met 1, rank 1 met 1
//! after load    self.step == 4, self.optimizer.steps() == 1,
//!               every variable bit-equal to the saved tensor of its name
//! ```
//!
//! The test: train 2N steps; separately train N, save, load into a fresh
//! trainer, train N more. The two must agree bit for bit.
//!
//! Guide: `guide/src/phase2/11-checkpoint.md`. Test: `cargo test exercise_11`.

use std::path::Path;

use candle_core::Result;

use crate::train::{DataPosition, Trainer};

impl Trainer {
    /// Writes the training state to `dir`, with `data`, the data the run reads
    /// and its position in it. Called on every rank; rank 0 alone writes, and
    /// no rank returns before the checkpoint is complete.
    ///
    /// The checkpoint is a `crate::train::Checkpoint { params, optimizer, state }`:
    /// every parameter by name, AdamW's moments by name (none before its first
    /// step), and a `TrainerState` (the step, AdamW's step count, the model's
    /// and the trainer's configs, `data`).
    ///
    /// Useful: `self.params.iter()`, `Var::as_tensor`, `self.optimizer.state_tensors()`
    /// (a `BTreeMap`; the checkpoint holds `HashMap`s), `self.optimizer.steps()`,
    /// `TrainerState::new`, `self.model.config()`, `Checkpoint::write` (atomic),
    /// `self.ddp.rank()`, `self.ddp.process_group().barrier()`.
    pub fn save_checkpoint(&self, dir: &Path, data: Option<DataPosition>) -> Result<()> {
        let _ = (&dir, &data);
        todo!("Exercise 11: Checkpoint save and load; run `cargo xtask hint 11`")
    }

    /// Restores the state written by [`Trainer::save_checkpoint`] from `dir`
    /// and returns the data position it holds.
    ///
    /// On success: every variable of `self.params` holds its saved values bit
    /// for bit, in its own dtype and on its own device (the checkpoint reads
    /// onto the CPU in the saved dtype), and it is the same variable as
    /// before (the model was built on those tensors and reads no others);
    /// AdamW's moments and step count are
    /// the saved ones; `self.step` is the saved step. A checkpoint of another
    /// model (other shapes, or the same shapes and another config) is an
    /// error that says so, and leaves the trainer as it was. A parameter
    /// missing from the checkpoint is an error that names it.
    ///
    /// Useful: `Checkpoint::read`, `checkpoint.ensure_fits(self.model.config())`,
    /// `checkpoint.params`, `.optimizer` and `.state` (`step`, `optimizer_steps`,
    /// `data`); `Var::set` (it accepts only the variable's shape, dtype and
    /// device), `Tensor::to_dtype`, `Tensor::to_device`;
    /// `self.optimizer.load_state(steps, &tensors, &self.params)`.
    pub fn load_checkpoint(&mut self, dir: &Path) -> Result<Option<DataPosition>> {
        let _ = &dir;
        todo!("Exercise 11: Checkpoint save and load; run `cargo xtask hint 11`")
    }
}
