//! Ungraded checks of the code around the exercises: they pass on the stubs too.

use candle_core::{Device, Module, Tensor, Var};
use candle_nn::Linear;
use workbook::{param_specs, GptConfig, ParamStore, Recompute, RotaryCache};

use crate::support::{expect_close, fixture, F32};

fn tiny() -> GptConfig {
    GptConfig {
        vocab_size: 64,
        hidden_size: 32,
        num_layers: 2,
        num_heads: 4,
        intermediate_size: 48,
        max_seq_len: 12,
        rope_theta: 10_000.0,
        norm_eps: 1e-5,
        bias: false,
    }
}

#[test]
fn rotary_cache_matches_pytorch() {
    let f = fixture(3);
    let cache = RotaryCache::new(8, 16, 10_000.0, &Device::Cpu).unwrap();
    let (cos, sin) = cache.get(5, candle_core::DType::F32).unwrap();
    expect_close(&cos, &f.get("cos"), F32, "rotary cos table", &[]);
    expect_close(&sin, &f.get("sin"), F32, "rotary sin table", &[]);
}

#[test]
fn rotary_cache_rejects_sequences_longer_than_max_seq_len() {
    let cache = RotaryCache::new(8, 4, 10_000.0, &Device::Cpu).unwrap();
    let err = cache.get(5, candle_core::DType::F32).unwrap_err().to_string();
    assert!(err.contains("longer than the model's max_seq_len 4"), "{err}");
}

#[test]
fn parameter_names_and_shapes() {
    let listing: Vec<String> =
        param_specs(&tiny()).iter().map(|s| format!("{} {:?} {:?}", s.name, s.shape.dims(), s.kind)).collect();
    insta::assert_snapshot!(listing.join("\n"));
}

#[test]
fn config_rejects_heads_that_do_not_divide_the_width() {
    let config = GptConfig { num_heads: 5, ..tiny() };
    let err = config.validate().unwrap_err().to_string();
    assert!(err.contains("not divisible by num_heads 5"), "{err}");
}

#[test]
fn parameters_that_do_not_fit_the_config_are_rejected() {
    let mut tensors: Vec<(String, Tensor)> = param_specs(&tiny())
        .into_iter()
        .map(|s| (s.name, Tensor::zeros(s.shape, candle_core::DType::F32, &Device::Cpu).unwrap()))
        .collect();
    tensors.retain(|(name, _)| name != "lm_head.weight");
    let params = ParamStore::from_tensors(tensors).unwrap();
    let err = workbook::Gpt::new(&tiny(), &params).unwrap_err().to_string();
    assert!(err.contains("`lm_head.weight` is missing"), "{err}");
}

/// A two-layer toy network: checkpointing must reproduce plain backprop exactly.
#[test]
fn recompute_gives_the_gradients_of_plain_backprop() {
    #[derive(Clone)]
    struct TanhLinear(Linear);
    impl Module for TanhLinear {
        fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
            self.0.forward(x)?.tanh()
        }
    }
    let dev = Device::Cpu;
    let w: Vec<Var> = (0..3).map(|i| Var::from_tensor(&(Tensor::randn(0f32, 0.5, (6, 6), &dev).unwrap() + i as f64).unwrap()).unwrap()).collect();
    let embed = Var::from_tensor(&Tensor::randn(0f32, 1.0, (4, 6), &dev).unwrap()).unwrap();
    let layers: Vec<TanhLinear> = w.iter().map(|w| TanhLinear(Linear::new(w.as_tensor().clone(), None))).collect();
    let x0 = (embed.as_tensor() * 2.0).unwrap(); // a tracked, non-leaf input

    let mut y = x0.clone();
    for layer in &layers {
        y = layer.forward(&y).unwrap();
    }
    let plain = y.sqr().unwrap().sum_all().unwrap().backward().unwrap();

    let mut recompute = Recompute::default();
    let mut y = x0.clone();
    for layer in &layers {
        y = recompute.checkpoint(layer, &y).unwrap();
    }
    let mut grads = y.sqr().unwrap().sum_all().unwrap().backward().unwrap();
    recompute.backward(&mut grads).unwrap();

    assert_eq!(recompute.len(), 3);
    for (name, var) in w.iter().map(|v| ("layer weight", v)).chain([("embedding", &embed)]) {
        expect_close(grads.get(var).unwrap(), plain.get(var).unwrap(), F32, name, &[]);
    }
}
