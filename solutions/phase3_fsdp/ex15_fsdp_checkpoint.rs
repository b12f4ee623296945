//! Reference solution of exercise 15: FSDP checkpoints, gathered to whole tensors.

use std::collections::HashMap;
use std::path::Path;

use candle_core::{DType, Result, Tensor};

use crate::parallel::fsdp::{FsdpTrainer, LocalState};
use crate::train::{Checkpoint, CheckpointWriter, DataPosition};

const MOMENTS: [&str; 2] = ["exp_avg", "exp_avg_sq"];

impl FsdpTrainer {
    pub fn save_checkpoint(&self, dir: &Path, data: Option<DataPosition>) -> Result<()> {
        let pg = self.process_group();
        let moments = self.counters.optimizer_steps > 0;
        let mut writer = match pg.rank() {
            0 => Some(CheckpointWriter::create(dir, self.model_config(), DType::F32, moments)?),
            _ => None,
        };
        // A unit at a time, each whole tensor written and let go before the next
        // is gathered: no rank ever holds the whole model at once.
        for unit in &self.units {
            let local = unit.local_state()?;
            // Every rank takes part in every all-gather, even though only rank 0 writes.
            let whole = |t: &Tensor| if unit.is_sharded() { pg.all_gather(t) } else { Ok(t.clone()) };
            for (name, t) in unit.layout.unflatten(&whole(&local.params)?)? {
                if let Some(writer) = writer.as_mut() {
                    writer.put_param(&name, &t);
                }
            }
            if moments {
                for (kind, moment) in MOMENTS.into_iter().zip([&local.exp_avg, &local.exp_avg_sq]) {
                    for (name, t) in unit.layout.unflatten(&whole(moment)?)? {
                        if let Some(writer) = writer.as_mut() {
                            writer.put_optimizer(&format!("{kind}.{name}"), &t);
                        }
                    }
                }
            }
        }
        if let Some(writer) = writer {
            writer.finish(&self.trainer_state(data))?;
        }
        pg.barrier()
    }

    pub fn load_checkpoint(&mut self, dir: &Path) -> Result<Option<DataPosition>> {
        let checkpoint = Checkpoint::read(dir)?;
        checkpoint.ensure_fits(self.model_config())?;
        let moments = MOMENTS.map(|kind| {
            let prefix = format!("{kind}.");
            let named = checkpoint.optimizer.iter();
            named
                .filter_map(|(key, t)| Some((key.strip_prefix(&prefix)?.to_string(), t.clone())))
                .collect::<HashMap<_, _>>()
        });
        for index in 0..self.units.len() {
            let unit = &self.units[index];
            let range = unit.local_range();
            let mine = |named: &HashMap<String, Tensor>| {
                unit.layout.flatten(named, unit.device())?.narrow(0, range.start, range.len())
            };
            let params = mine(&checkpoint.params)?;
            let [exp_avg, exp_avg_sq] = match checkpoint.state.optimizer_steps {
                0 => [params.zeros_like()?, params.zeros_like()?],
                _ => [mine(&moments[0])?, mine(&moments[1])?],
            };
            self.set_local_state(index, LocalState { params, exp_avg, exp_avg_sq })?;
        }
        self.restore_counters(&checkpoint.state);
        Ok(checkpoint.state.data)
    }
}
