//! Exercise 6: weight initialisation. The expected values are the recipe's own
//! numbers (std 0.02, 0.02 / sqrt(2 · num_layers), ones, zeros), checked on
//! matrices large enough that the sample statistics are within 1% of the truth.

use candle_core::Device;
use workbook::{init_params, GptConfig, ParamStore};

use crate::support::{mistake, ok, value_failure};

/// Five layers with biases, and eight heads, so that a depth scaling by the
/// wrong count is caught; 256×256 projections hold 65,536 draws each.
fn config() -> GptConfig {
    GptConfig {
        vocab_size: 512,
        hidden_size: 256,
        num_layers: 5,
        num_heads: 8,
        num_kv_heads: None,
        intermediate_size: 512,
        max_seq_len: 16,
        rope_theta: 10_000.0,
        norm_eps: 1e-5,
        bias: true,
        tie_word_embeddings: false,
    }
}

fn params(seed: u64) -> ParamStore {
    ok(init_params(&config(), seed, &Device::Cpu), "init_params (which calls init_parameter for every parameter)")
}

fn values(params: &ParamStore, name: &str) -> Vec<f32> {
    let var = params.get(name).unwrap();
    var.flatten_all().unwrap().to_vec1::<f32>().unwrap()
}

fn mean_and_std(v: &[f32]) -> (f64, f64) {
    let n = v.len() as f64;
    let mean = v.iter().map(|&x| x as f64).sum::<f64>() / n;
    let var = v.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / n;
    (mean, var.sqrt())
}

const STD: f64 = 0.02;

/// The mistake that gives the standard deviation `std` to a parameter that
/// should have `want`, if `std` is one a known mistake gives.
fn diagnose(std: f64, want: f64) -> Option<&'static str> {
    let layers = config().num_layers as f64;
    let near = |x: f64| (std / x - 1.0).abs() < 0.05;
    let id = if near(1.0) {
        "std_one"
    } else if near(STD) && want < STD {
        "residual_unscaled"
    } else if near(STD / layers.sqrt()) {
        "residual_by_layers"
    } else if near(STD / (2.0 * layers).sqrt()) && want == STD {
        "all_scaled"
    } else {
        return None;
    };
    Some(mistake(6, id))
}

fn assert_normal(params: &ParamStore, name: &str, want_std: f64) {
    let v = values(params, name);
    let (mean, std) = mean_and_std(&v);
    assert!(
        (std / want_std - 1.0).abs() < 0.03,
        "{}",
        value_failure(&format!("the std of {name}"), std, want_std, diagnose(std, want_std))
    );
    assert!(mean.abs() < 0.1 * want_std, "{}", value_failure(&format!("the mean of {name}"), mean, 0.0, None));
}

#[test]
fn embeddings_and_linear_weights_are_normal_with_std_0_02() {
    let p = params(0);
    for name in [
        "model.embed_tokens.weight",
        "model.layers.0.self_attn.q_proj.weight",
        "model.layers.3.self_attn.v_proj.weight",
        "model.layers.2.mlp.gate_proj.weight",
        "model.layers.1.mlp.up_proj.weight",
        "lm_head.weight",
    ] {
        assert_normal(&p, name, STD);
    }
}

#[test]
fn residual_output_projections_are_scaled_by_depth() {
    let p = params(0);
    let want = STD / (2.0 * config().num_layers as f64).sqrt();
    for layer in 0..config().num_layers {
        assert_normal(&p, &format!("model.layers.{layer}.self_attn.o_proj.weight"), want);
        assert_normal(&p, &format!("model.layers.{layer}.mlp.down_proj.weight"), want);
    }
}

/// A normal puts 68.3% of its mass within one std of the mean; a uniform of the same std puts 57.7%.
#[test]
fn weights_are_drawn_from_a_normal_distribution() {
    let p = params(0);
    let v = values(&p, "model.layers.0.self_attn.k_proj.weight");
    let (mean, std) = mean_and_std(&v);
    let within = v.iter().filter(|&&x| ((x as f64) - mean).abs() <= std).count() as f64 / v.len() as f64;
    assert!(
        (within / 0.6827 - 1.0).abs() <= 0.02,
        "{}",
        value_failure(
            "the share of k_proj's weights within one std of the mean (a normal's is 0.6827)",
            within,
            0.6827,
            None
        )
    );
}

#[test]
fn norm_weights_start_at_one() {
    let p = params(0);
    for name in
        ["model.layers.0.input_layernorm.weight", "model.layers.3.post_attention_layernorm.weight", "model.norm.weight"]
    {
        assert!(values(&p, name).iter().all(|&x| x == 1.0), "{name}: {}", mistake(6, "norm_not_one"));
    }
}

#[test]
fn biases_start_at_zero() {
    let p = params(0);
    for name in ["model.layers.0.self_attn.q_proj.bias", "model.layers.2.mlp.down_proj.bias"] {
        assert!(values(&p, name).iter().all(|&x| x == 0.0), "{name}: {}", mistake(6, "bias_not_zero"));
    }
}

#[test]
fn the_same_seed_gives_the_same_model() {
    let (a, b) = (params(7), params(7));
    for (name, var) in a.iter() {
        let same = var.eq(b.get(name).unwrap().as_tensor()).unwrap().flatten_all().unwrap().min(0).unwrap();
        assert!(
            same.to_scalar::<u8>().unwrap() == 1,
            "{name} differs between two runs with seed 7: {}",
            mistake(6, "unseeded")
        );
    }
}

#[test]
fn different_seeds_give_different_models() {
    let (a, b) = (params(1), params(2));
    let name = "model.layers.0.self_attn.q_proj.weight";
    let diff = (a.get(name).unwrap().as_tensor() - b.get(name).unwrap().as_tensor()).unwrap();
    let max = diff.abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap();
    assert!(max > 0.0, "{name} is the same for seeds 1 and 2: use the rng you are given");
}

/// Every parameter comes back as f32 with the shape it was asked for.
#[test]
fn every_parameter_has_its_shape() {
    let p = params(0);
    let expected: Vec<(String, Vec<usize>)> =
        workbook::param_specs(&config()).into_iter().map(|s| (s.name, s.shape.dims().to_vec())).collect();
    for (name, dims) in expected {
        let var = p.get(&name).unwrap();
        assert!(var.dims() == dims.as_slice(), "{name} is {:?}, expected {dims:?}", var.dims());
        assert!(var.dtype() == candle_core::DType::F32, "{name} is {:?}: initialise in f32", var.dtype());
    }
}
