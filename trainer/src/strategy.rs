//! The two ways a run trains across ranks, behind what the loop needs of them.

use std::path::Path;

use candle_core::{Result, Tensor};
use workbook::distributed::ProcessGroup;
use workbook::fsdp::{FsdpConfig, FsdpTrainer};
use workbook::train::{DataPosition, StepStats, Trainer};

/// How a run spreads over its ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Strategy {
    /// Phase 2: whole replicas, gradients all-reduced.
    Ddp,
    /// Phase 3: sharded units.
    Fsdp(FsdpConfig),
}

/// What the training loop needs of a trainer, whichever the strategy.
pub trait Train {
    fn train_step(&mut self, micro_batches: &[Tensor]) -> Result<StepStats>;
    fn save_checkpoint(&self, dir: &Path, data: Option<DataPosition>) -> Result<()>;
    fn load_checkpoint(&mut self, dir: &Path) -> Result<Option<DataPosition>>;
    /// Optimizer steps taken, skipped ones included.
    fn step(&self) -> usize;
    /// Updates skipped because a gradient was not finite.
    fn skipped_updates(&self) -> u64;
    fn process_group(&self) -> &dyn ProcessGroup;
    /// What the run should print at its end about how it used memory and the network.
    fn report(&self) -> Option<String>;
}

impl Train for Trainer {
    fn train_step(&mut self, micro_batches: &[Tensor]) -> Result<StepStats> {
        Trainer::train_step(self, micro_batches)
    }
    fn save_checkpoint(&self, dir: &Path, data: Option<DataPosition>) -> Result<()> {
        Trainer::save_checkpoint(self, dir, data)
    }
    fn load_checkpoint(&mut self, dir: &Path) -> Result<Option<DataPosition>> {
        Trainer::load_checkpoint(self, dir)
    }
    fn step(&self) -> usize {
        self.step
    }
    fn skipped_updates(&self) -> u64 {
        self.optimizer.skipped_steps()
    }
    fn process_group(&self) -> &dyn ProcessGroup {
        self.ddp.process_group()
    }
    fn report(&self) -> Option<String> {
        None
    }
}

impl Train for FsdpTrainer {
    fn train_step(&mut self, micro_batches: &[Tensor]) -> Result<StepStats> {
        FsdpTrainer::train_step(self, micro_batches)
    }
    fn save_checkpoint(&self, dir: &Path, data: Option<DataPosition>) -> Result<()> {
        FsdpTrainer::save_checkpoint(self, dir, data)
    }
    fn load_checkpoint(&mut self, dir: &Path) -> Result<Option<DataPosition>> {
        FsdpTrainer::load_checkpoint(self, dir)
    }
    fn step(&self) -> usize {
        self.step
    }
    fn skipped_updates(&self) -> u64 {
        self.skipped_steps
    }
    fn process_group(&self) -> &dyn ProcessGroup {
        FsdpTrainer::process_group(self)
    }
    fn report(&self) -> Option<String> {
        let plan = self.plan;
        Some(format!(
            "{} (ZeRO stage {}), {} precision, {} units; rank 0's last step:\n{}",
            self.fsdp.sharding,
            plan.zero_stage(),
            self.fsdp.precision,
            self.units.len(),
            self.ledger()
        ))
    }
}
