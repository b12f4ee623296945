//! Reference solution of exercise 6: weight initialisation.

use candle_core::{DType, Device, Result, Tensor};

use crate::model::{GptConfig, InitRng, ParamKind, ParamSpec};

const STD: f64 = 0.02;

pub fn init_parameter(spec: &ParamSpec, config: &GptConfig, rng: &mut InitRng, device: &Device) -> Result<Tensor> {
    let writes_to_residual =
        spec.name.ends_with("self_attn.o_proj.weight") || spec.name.ends_with("mlp.down_proj.weight");
    match spec.kind {
        ParamKind::Embedding => rng.normal(&spec.shape, STD, device),
        ParamKind::LinearWeight if writes_to_residual => {
            let std = STD / (2.0 * config.num_layers as f64).sqrt();
            rng.normal(&spec.shape, std, device)
        }
        ParamKind::LinearWeight => rng.normal(&spec.shape, STD, device),
        ParamKind::LinearBias => Tensor::zeros(&spec.shape, DType::F32, device),
        ParamKind::NormWeight => Tensor::ones(&spec.shape, DType::F32, device),
    }
}
