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
    init_params_where(config, seed, device, |_| true)
}

/// The parameters named by `keep` of what [`init_params`] creates, the same
/// numbers: every parameter is still drawn, in order, and the others let go
/// one at a time, so a rank that runs a part of the model (a pipeline stage)
/// never holds the whole of it.
pub fn init_params_where(
    config: &GptConfig,
    seed: u64,
    device: &Device,
    keep: impl Fn(&str) -> bool,
) -> Result<ParamStore> {
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
        if keep(&spec.name) {
            tensors.push((spec.name, tensor));
        }
    }
    ParamStore::from_tensors(tensors)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::layer_of;

    /// One block's parameters, kept alone, are the very numbers of the whole model's.
    #[test]
    fn a_part_kept_is_the_same_numbers_as_in_the_whole() {
        let config = GptConfig {
            vocab_size: 32,
            hidden_size: 16,
            num_layers: 3,
            num_heads: 2,
            num_kv_heads: None,
            intermediate_size: 40,
            max_seq_len: 8,
            rope_theta: 10000.0,
            norm_eps: 1e-5,
            bias: false,
            tie_word_embeddings: false,
        };
        let whole = init_params(&config, 5, &Device::Cpu).unwrap();
        let part = init_params_where(&config, 5, &Device::Cpu, |name| layer_of(name) == Some(1)).unwrap();
        let names: Vec<_> = whole.iter().map(|(name, _)| name.to_string()).filter(|n| layer_of(n) == Some(1)).collect();
        assert_eq!(part.iter().count(), names.len());
        for name in names {
            let (a, b) = (whole.get(&name).unwrap().as_tensor().clone(), part.get(&name).unwrap().as_tensor().clone());
            let same = (&a - &b).unwrap().abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap() == 0.0;
            assert!(same, "`{name}` differs");
        }
    }
}
