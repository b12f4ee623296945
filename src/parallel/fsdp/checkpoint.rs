//! The FSDP trainer's checkpoints: exercise 15 gathers each unit whole and
//! shards it again; around it, rank 0 of the first replica writes exercise
//! 11's format, a tensor at a time, and every rank reads it back.

use std::path::Path;

use candle_core::{DType, Result};

use super::FsdpTrainer;
use crate::phase3_fsdp::{gather_full_state, shard_full_state};
use crate::train::{AdamW, Checkpoint, CheckpointWriter, DataPosition};

impl FsdpTrainer {
    /// Writes the whole state to `dir`: every rank of the shard group joins
    /// the gathers, rank 0 writes each tensor as it comes and lets it go.
    /// Called on the ranks of one shard group; none returns before the file
    /// is complete.
    pub(super) fn write_whole_checkpoint(&self, dir: &Path, data: Option<DataPosition>) -> Result<()> {
        let pg = self.process_group();
        let with_moments = self.counters.optimizer_steps > 0;
        let mut writer = match pg.rank() {
            0 => Some(CheckpointWriter::create(dir, self.model_config(), DType::F32, with_moments)?),
            _ => None,
        };
        gather_full_state(&self.units, pg, with_moments, &mut |whole| {
            // A failed write is `finish`'s error: this rank goes on gathering with the others.
            if let Some(writer) = writer.as_mut() {
                writer.put_param(&whole.name, &whole.value);
                for (moment, t) in AdamW::moment_names(&whole.name).iter().zip(whole.moments.iter().flatten()) {
                    writer.put_optimizer(moment, t);
                }
            }
            Ok(())
        })?;
        if let Some(writer) = writer {
            writer.finish(&self.trainer_state(data))?;
        }
        pg.barrier()
    }

    /// Reads a whole checkpoint (written by any number of ranks, or by Phase
    /// 2's trainer) and keeps this rank's shard of each unit; returns the
    /// data position. A checkpoint of another model changes nothing.
    pub(super) fn read_whole_checkpoint(&mut self, dir: &Path) -> Result<Option<DataPosition>> {
        let checkpoint = Checkpoint::read(dir)?;
        checkpoint.ensure_fits(self.model_config())?;
        let [exp_avg, exp_avg_sq] = AdamW::moments_by_param(&checkpoint.optimizer);
        let moments = (checkpoint.state.optimizer_steps > 0).then_some([&exp_avg, &exp_avg_sq]);
        for index in 0..self.units.len() {
            let state = shard_full_state(&self.units[index], &checkpoint.params, moments)?;
            self.set_local_state(index, state)?;
        }
        self.restore_counters(&checkpoint.state);
        Ok(checkpoint.state.data)
    }
}
