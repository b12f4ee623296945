//! The mesh trainer's checkpoints: whole tensors in exercise 11's format,
//! whatever the mesh, so a run resumes under DDP, FSDP or on another mesh.
//! Rank 0 writes what every stage of the first replica hands it a tensor at
//! a time; every rank reads back its stage's part (FSDP units through
//! exercise 15, in `units.rs`).

use std::path::Path;

use candle_core::{bail, DType, Error, Result, Tensor};

use super::{units, MeshTrainer};
use crate::model::{param_specs, ParamStore};
use crate::parallel::pipeline::stage_holding;
use crate::parallel::tensor::{moments_part, part_of};
use crate::train::{AdamW, Checkpoint, CheckpointWriter, DataPosition, StepCounters, Train, TrainerState};

impl MeshTrainer {
    /// Every stage of the first replica goes through its parameters in model
    /// order, each gathered whole across its tp group (when split) with its
    /// moments, and sends them to the first stage, rank 0, which writes each
    /// as it arrives into one whole checkpoint: no rank holds more than one
    /// tensor beyond its own part (and one FSDP unit, gathered across the
    /// replicas, which take part in that gather only and otherwise hold the
    /// same numbers).
    pub(super) fn write_checkpoint(&self, dir: &Path, data: Option<DataPosition>) -> Result<()> {
        let has_moments = self.counters().optimizer_steps > 0;
        // Under ZeRO-1 every replica takes part in gathering the moments.
        let moments = self.update.moments()?;
        let units = self.stage.sharded_units();
        let (pg, tp) = (self.mesh.pp(), self.mesh.tp());
        let first_replica = self.mesh.coords().dp == 0;
        let hands_on = first_replica && tp.rank() == 0;
        let mut writer = match hands_on && pg.rank() == 0 {
            true => Some(CheckpointWriter::create(dir, &self.model_config, DType::F32, has_moments)?),
            false => None,
        };
        let mut unit = units::WholeUnit::default();
        for (name, _) in self.names_of_stage(pg.rank()) {
            let in_unit = units.as_ref().and_then(|held| Some((held, units::WholeUnit::holding(held, &name)?)));
            let (param, param_moments) = match in_unit {
                Some((held, index)) => unit.take(held, index, &name, has_moments)?,
                // The other replicas take part in the units' gathers alone.
                None if !first_replica => continue,
                None => {
                    let names = if has_moments { AdamW::moment_names(&name).to_vec() } else { vec![] };
                    let moment =
                        |m: &String| moments.get(m).cloned().ok_or_else(|| Error::Msg(format!("AdamW holds no `{m}`")));
                    (
                        self.stage.params().get(&name)?.as_tensor().clone(),
                        names.iter().map(moment).collect::<Result<_>>()?,
                    )
                }
            };
            if !first_replica {
                continue;
            }
            let param = self.cuts.whole(tp, &name, &param)?;
            let param_moments =
                param_moments.iter().map(|m| self.cuts.whole(tp, &name, m)).collect::<Result<Vec<_>>>()?;
            match writer.as_mut() {
                Some(writer) => {
                    writer.put_param(&name, &param);
                    for (moment, t) in AdamW::moment_names(&name).iter().zip(&param_moments) {
                        writer.put_optimizer(moment, t);
                    }
                }
                None if hands_on => {
                    for t in std::iter::once(&param).chain(&param_moments) {
                        pg.send(t, 0)?;
                    }
                }
                None => {}
            }
        }
        drop((unit, units));
        if let Some(mut writer) = writer {
            for stage in 1..pg.world_size() {
                for (name, shape) in self.names_of_stage(stage) {
                    let like = Tensor::zeros(shape, DType::F32, &self.device)?;
                    writer.put_param(&name, &pg.recv(&like, stage)?);
                    if has_moments {
                        for moment in AdamW::moment_names(&name) {
                            writer.put_optimizer(&moment, &pg.recv(&like, stage)?);
                        }
                    }
                }
            }
            let StepCounters { step, optimizer_steps, .. } = self.counters;
            let mut state = TrainerState::new(step, optimizer_steps, self.model_config.clone(), self.config, data);
            state.layout = Some(self.layout());
            writer.finish(&state)?;
        }
        self.mesh.world().barrier()
    }

    /// Each rank reads its stage's parameters and moments only, and keeps
    /// its part of them: cut as the stage's shards are, when its blocks are
    /// split.
    pub(super) fn read_checkpoint(&mut self, dir: &Path) -> Result<Option<DataPosition>> {
        let (config, stages, stage) = (&self.model_config, self.mesh.pp().world_size(), self.mesh.pp().rank());
        let checkpoint = Checkpoint::read_where(dir, |name| stage_holding(config, stages, name) == stage)?;
        checkpoint.ensure_fits(&self.model_config)?;
        let (layers, rank, ranks) = (self.stage.layers(), self.mesh.tp().rank(), self.mesh.tp().world_size());
        let whole = ParamStore::from_tensors(checkpoint.params.clone())?;
        let part = part_of(&self.model_config, &whole, layers.clone(), rank, ranks)?;
        for (name, var) in self.stage.params().iter() {
            let Some(saved) = part.get(name) else {
                bail!("the checkpoint in {} has no parameter `{name}`", dir.display());
            };
            var.set(&saved.to_dtype(var.dtype())?.to_device(var.device())?)?;
        }
        // With a moment missing, AdamW's own check names it.
        let stage_names = checkpoint.params.keys().map(String::as_str);
        let moments = moments_part(&self.model_config, &checkpoint.optimizer, stage_names, (layers, rank, ranks))?
            .unwrap_or_else(|| checkpoint.optimizer.clone());
        let steps = checkpoint.state.optimizer_steps;
        self.update.load(steps, &moments, self.stage.params(), &self.device)?;
        if let Some(mut units) = self.stage.sharded_units() {
            units::load(&mut units, &part, (steps > 0).then_some(&moments))?;
        }
        self.counters.restore(&checkpoint.state);
        Ok(checkpoint.state.data)
    }

    /// The parameters stage `index` holds, in model order, with their shapes.
    fn names_of_stage(&self, index: usize) -> Vec<(String, candle_core::Shape)> {
        param_specs(&self.model_config)
            .into_iter()
            .filter(|spec| stage_holding(&self.model_config, self.mesh.pp().world_size(), &spec.name) == index)
            .map(|spec| (spec.name, spec.shape))
            .collect()
    }
}
