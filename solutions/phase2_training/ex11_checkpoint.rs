//! Reference solution of exercise 11: saving and resuming training.

use std::path::Path;

use candle_core::{bail, Result};

use crate::train::{Checkpoint, DataPosition, Trainer, TrainerState};

impl Trainer {
    pub fn save_checkpoint(&self, dir: &Path, data: Option<DataPosition>) -> Result<()> {
        if self.ddp.rank() == 0 {
            let checkpoint = Checkpoint {
                params: self.params.iter().map(|(name, var)| (name.to_string(), var.as_tensor().clone())).collect(),
                optimizer: self.optimizer.state_tensors().into_iter().collect(),
                state: TrainerState::new(
                    self.step,
                    self.optimizer.steps(),
                    self.model.config().clone(),
                    self.config,
                    data,
                ),
            };
            checkpoint.write(dir)?;
        }
        self.ddp.process_group().barrier()
    }

    pub fn load_checkpoint(&mut self, dir: &Path) -> Result<Option<DataPosition>> {
        let checkpoint = Checkpoint::read(dir)?;
        checkpoint.ensure_fits(self.model.config())?;
        for (name, var) in self.params.iter() {
            let Some(saved) = checkpoint.params.get(name) else {
                bail!("the checkpoint in {} has no parameter `{name}`", dir.display());
            };
            var.set(&saved.to_dtype(var.dtype())?.to_device(var.device())?)?;
        }
        self.optimizer.load_state(checkpoint.state.optimizer_steps, &checkpoint.optimizer, &self.params)?;
        self.step = checkpoint.state.step;
        Ok(checkpoint.state.data)
    }
}
