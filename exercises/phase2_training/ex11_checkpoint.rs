//! # Exercise 11: saving and resuming training
//!
//! Long runs stop: preemption, a crash, a node swapped out. A checkpoint must
//! hold everything that decides what the next step does, or the resumed run
//! silently differs from an uninterrupted one:
//!
//! ```text
//! parameters              self.params (by name)
//! optimizer state         self.optimizer.state_tensors() and self.optimizer.steps()
//!                         (Adam's moments: without them the first resumed steps are wild)
//! step                    self.step (the schedule's position follows from it)
//! configs                 the model's and the trainer's, to refuse a mismatched resume
//! data position           where the sampler stands, so no batch is seen twice or skipped
//! ```
//!
//! Under data parallelism every rank holds the same state, so **only rank 0
//! writes**; the others wait at a barrier so nobody reads a half-written
//! checkpoint. In PyTorch the DDP wrapper also renames every parameter
//! (`module.` prefix) and must be unwrapped before saving; here DDP lives
//! beside the model, so `self.params` already carries the plain names a
//! single-process run loads. Loading runs on every rank.
//!
//! The test: train 2N steps; separately train N, save, load into a fresh
//! trainer, train N more. The two must agree bit for bit.
//!
//! Guide: `guide/src/phase2/11-checkpoint.md`. Test: `cargo test exercise_11`.

use std::path::Path;

use candle_core::Result;

use crate::train::{DataPosition, Trainer};

impl Trainer {
    /// Writes the training state to `dir` (rank 0 only), with `data`, the data
    /// the run reads and its position in it, then waits for every rank.
    ///
    /// What goes in is a `crate::train::Checkpoint { params, optimizer, state }`:
    /// every parameter by name, AdamW's moments by name, and a `TrainerState`
    /// (the step, AdamW's step count, the model's and the trainer's configs,
    /// `data`). The barrier is for every rank, rank 0 included.
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
    /// Refuse a checkpoint of another model before touching anything. Copy each
    /// saved value into the existing variable (the model shares those tensors,
    /// so never replace the store), restore AdamW's moments and step count
    /// together, and the trainer's step.
    ///
    /// Useful: `Checkpoint::read`, `checkpoint.ensure_fits(self.model.config())`,
    /// `checkpoint.params`, `.optimizer` and `.state` (`step`, `optimizer_steps`,
    /// `data`); `Var::set` (same shape, dtype and device as the variable);
    /// `self.optimizer.load_state(steps, &tensors, &self.params)`.
    pub fn load_checkpoint(&mut self, dir: &Path) -> Result<Option<DataPosition>> {
        let _ = &dir;
        todo!("Exercise 11: Checkpoint save and load; run `cargo xtask hint 11`")
    }
}
