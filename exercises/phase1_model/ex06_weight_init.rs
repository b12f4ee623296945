//! # Exercise 6: weight initialisation
//!
//! Training starts from the weights you give it. Too large, and activations and
//! gradients explode through the layers; all equal, and every unit learns the
//! same thing. GPT-2's recipe, used here:
//!
//! ```text
//! embeddings, linear weights       ~ normal(0, 0.02)
//! residual output projections      ~ normal(0, 0.02 / sqrt(2 · num_layers))
//! norm weights                     = 1
//! biases                           = 0
//! ```
//!
//! The residual stream adds two outputs per block (attention's `o_proj` and the
//! MLP's `down_proj`), so 2·L random contributions pile up; scaling those two
//! projections by 1/sqrt(2L) keeps the stream's variance independent of depth.
//! With 4 layers their std is 0.02 / sqrt(8) ≈ 0.00707; with 12, ≈ 0.00408.
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
/// - `spec.name` is its Hugging Face Llama name; the residual output projections
///   end in `self_attn.o_proj.weight` and `mlp.down_proj.weight`.
/// - Draw normals with `rng.normal(&spec.shape, std, device)`. Never `Tensor::randn`:
///   candle's CPU generator cannot be seeded, so the model would differ on every run.
/// - `Tensor::ones(&spec.shape, DType::F32, device)` and `Tensor::zeros(…)` for the rest.
pub fn init_parameter(spec: &ParamSpec, config: &GptConfig, rng: &mut InitRng, device: &Device) -> Result<Tensor> {
    let _ = (&spec, &config, &rng, &device);
    todo!("Exercise 6: Weight initialisation; run `cargo xtask hint 6`")
}
