//! # Exercise 6: weight initialisation
//!
//! Training starts from the weights you give it. Too large, and activations and
//! gradients explode through the layers; all equal, and every unit learns the
//! same thing. GPT-2's recipe, used here, starts from one constant and one
//! correction for depth:
//!
//! - embeddings and linear weights ~ normal(0, 0.02²);
//! - except the linear weights whose output is added straight into the
//!   residual stream. Each such output adds to the stream a variance
//!   proportional to its weights' variance, and the contributions pile up
//!   over the depth; their std is scaled down so that all of them together, in
//!   the whole model, add what a single one of std 0.02 would, whatever
//!   `num_layers` is;
//! - norm weights start at the value that makes a fresh norm only normalise;
//! - biases start at the value that makes a fresh linear layer purely linear.
//!
//! Which parameters write into the residual stream, and how many such
//! contributions a model of `num_layers` blocks adds up, you read off the
//! block's data flow (`guide/src/phase1/index.md`). For a sense of scale: six
//! unscaled contributions, each of variance v, add 6v, six times the target.
//!
//! The model calls this function once per parameter, in a fixed order, with one
//! seeded generator: the same seed must give the same model, bit for bit. That
//! is what makes runs comparable and resumable.
//!
//! Read first: Radford et al. 2019 (GPT-2), section 2.3.
//! Guide: `guide/src/phase1/06-weight-init.md`. Test: `cargo test exercise_06`.

use candle_core::{Device, Result, Tensor};

use crate::model::{GptConfig, InitRng, ParamSpec};

/// The initial value of one parameter, of shape `spec.shape`, as f32.
///
/// - `spec.kind` says what module owns it (`ParamKind::Embedding`, `LinearWeight`,
///   `LinearBias`, `NormWeight`): the `isinstance` check of a PyTorch init.
/// - `spec.name` is its Hugging Face Llama name, such as
///   `model.layers.3.self_attn.q_proj.weight`; `str::ends_with` compares its end.
/// - Draw normals with `rng.normal(&spec.shape, std, device)`. Never `Tensor::randn`:
///   candle's CPU generator cannot be seeded, so the model would differ on every run.
/// - `Tensor::ones(&spec.shape, DType::F32, device)` and `Tensor::zeros(…)` for the rest.
pub fn init_parameter(spec: &ParamSpec, config: &GptConfig, rng: &mut InitRng, device: &Device) -> Result<Tensor> {
    let _ = (&spec, &config, &rng, &device);
    todo!("Exercise 6: Weight initialisation; run `cargo xtask hint 6`")
}
