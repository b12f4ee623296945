//! Reproducible initialisation: a seeded generator and the loop that asks
//! exercise 6 how each parameter starts.

use candle_core::{bail, Device, Result, Shape, Tensor};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, Normal};

use super::{param_specs, GptConfig, ParamStore};
use crate::phase1_model::init_parameter;

/// A seeded random generator for weights.
///
/// candle's CPU generator cannot be seeded (`Device::Cpu.set_seed` fails), so
/// `Tensor::randn` gives different weights on every run. This one is ChaCha8:
/// the same seed gives the same numbers on every machine.
pub struct InitRng {
    rng: ChaCha8Rng,
}

impl InitRng {
    pub fn from_seed(seed: u64) -> Self {
        Self { rng: ChaCha8Rng::seed_from_u64(seed) }
    }

    /// A tensor of `shape` drawn from normal(0, std²), as f32.
    pub fn normal(&mut self, shape: &Shape, std: f64, device: &Device) -> Result<Tensor> {
        let normal = match Normal::new(0.0f32, std as f32) {
            Ok(normal) => normal,
            Err(e) => bail!("normal(0, {std}) is not a distribution: {e}"),
        };
        let values: Vec<f32> = (0..shape.elem_count()).map(|_| normal.sample(&mut self.rng)).collect();
        Tensor::from_vec(values, shape, device)
    }
}

/// Creates every parameter of the model, in [`param_specs`] order, with
/// [`init_parameter`] (exercise 6) and a generator seeded with `seed`.
pub fn init_params(config: &GptConfig, seed: u64, device: &Device) -> Result<ParamStore> {
    config.validate()?;
    let mut rng = InitRng::from_seed(seed);
    let mut tensors = Vec::new();
    for spec in param_specs(config) {
        let tensor = init_parameter(&spec, config, &mut rng, device)?;
        if tensor.shape() != &spec.shape {
            bail!(
                "init_parameter returned shape {:?} for `{}`, which needs {:?}",
                tensor.shape(),
                spec.name,
                spec.shape
            );
        }
        tensors.push((spec.name, tensor));
    }
    ParamStore::from_tensors(tensors)
}
