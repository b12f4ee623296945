//! Exercise 8: AdamW parameter groups. Reference: tests/fixtures/generate.py, `exercise_08`
//! (three `torch.optim.AdamW` steps with a decay and a no-decay group).

use candle_core::{DType, Device, Tensor};
use workbook::autograd::Gradients;
use workbook::phase2_training::build_optimizer;
use workbook::train::{AdamW, AdamWConfig, OptimizerConfig};
use workbook::{param_specs, GptConfig, ParamStore};

use crate::support::{expect_close, fixture, ok, Fixture, F32};

/// Every kind of parameter the model has, biases included.
fn model_params() -> ParamStore {
    let config = GptConfig {
        vocab_size: 16,
        hidden_size: 8,
        num_layers: 2,
        num_heads: 2,
        intermediate_size: 12,
        max_seq_len: 8,
        rope_theta: 10_000.0,
        norm_eps: 1e-5,
        bias: true,
    };
    ParamStore::from_tensors(
        param_specs(&config).into_iter().map(|s| (s.name, Tensor::zeros(s.shape, DType::F32, &Device::Cpu).unwrap())),
    )
    .unwrap()
}

const CONFIG: OptimizerConfig =
    OptimizerConfig { weight_decay: 0.1, adamw: AdamWConfig { beta1: 0.9, beta2: 0.95, eps: 1e-8 } };

fn optimizer(params: &ParamStore, config: &OptimizerConfig) -> AdamW {
    ok(build_optimizer(params, config), "build_optimizer(params, config)")
}

/// The weight decay of the group that holds `name`, or None.
fn decay_of(opt: &AdamW, name: &str) -> Option<f64> {
    opt.groups().iter().find(|g| g.names.iter().any(|n| n == name)).map(|g| g.weight_decay)
}

#[test]
fn every_parameter_is_in_exactly_one_group() {
    let params = model_params();
    let opt = optimizer(&params, &CONFIG);
    for (name, _) in params.iter() {
        let count = opt.groups().iter().flat_map(|g| &g.names).filter(|n| *n == name).count();
        assert!(count > 0, "`{name}` is in no group: the optimizer would never update it");
        assert_eq!(count, 1, "`{name}` is in {count} groups: it would be updated {count} times per step");
    }
    let total: usize = opt.groups().iter().map(|g| g.names.len()).sum();
    assert_eq!(total, params.iter().count(), "the groups name parameters that are not in the model");
}

#[test]
fn norm_weights_and_biases_do_not_decay() {
    let params = model_params();
    let opt = optimizer(&params, &CONFIG);
    for (name, var) in params.iter().filter(|(_, v)| v.rank() < 2) {
        let decay = decay_of(&opt, name).unwrap_or_else(|| panic!("`{name}` is in no group"));
        assert!(
            decay == 0.0,
            "`{name}` ({:?}) has weight decay {decay}: norm weights and biases must not decay (they are scales and offsets, not weights to shrink)",
            var.dims()
        );
    }
}

#[test]
fn matrices_and_embeddings_decay() {
    let params = model_params();
    let opt = optimizer(&params, &CONFIG);
    for (name, _) in params.iter().filter(|(_, v)| v.rank() >= 2) {
        let decay = decay_of(&opt, name).unwrap_or_else(|| panic!("`{name}` is in no group"));
        assert!(
            decay == CONFIG.weight_decay,
            "`{name}` has weight decay {decay}, expected config.weight_decay = {}: matrices and embeddings are what weight decay regularises",
            CONFIG.weight_decay
        );
    }
}

#[test]
fn passes_the_configured_betas_and_eps_on() {
    let config = OptimizerConfig { weight_decay: 0.05, adamw: AdamWConfig { beta1: 0.8, beta2: 0.99, eps: 1e-6 } };
    let opt = optimizer(&model_params(), &config);
    assert_eq!(opt.config(), config.adamw, "build AdamW with config.adamw, not with defaults");
}

/// The fixture's six parameters (named like the model's) and its optimizer settings.
pub fn adamw_fixture(f: &Fixture) -> (ParamStore, OptimizerConfig) {
    let names = [
        "model.embed_tokens.weight",
        "model.layers.0.input_layernorm.weight",
        "model.layers.0.self_attn.q_proj.weight",
        "model.layers.0.self_attn.q_proj.bias",
        "model.norm.weight",
        "lm_head.weight",
    ];
    let params = ParamStore::from_tensors(names.map(|n| (n, f.get(&format!("param.{n}"))))).unwrap();
    let hyper = f.get("hyper").to_vec1::<f64>().unwrap();
    let config = OptimizerConfig {
        weight_decay: hyper[3],
        adamw: AdamWConfig { beta1: hyper[0], beta2: hyper[1], eps: hyper[2] },
    };
    (params, config)
}

/// The fixture's three steps: its gradients at its learning rates.
pub fn step_three_times(f: &Fixture, params: &ParamStore, opt: &mut AdamW) {
    for (k, lr) in f.get("lr").to_vec1::<f64>().unwrap().into_iter().enumerate() {
        let mut grads = Gradients::default();
        for (name, _) in params.iter() {
            grads.insert(name, f.get(&format!("grad{k}.{name}")));
        }
        ok(opt.step(params, &grads, lr), "AdamW::step");
    }
}

fn run_three_steps(f: &Fixture) -> ParamStore {
    let (params, config) = adamw_fixture(f);
    let mut opt = optimizer(&params, &config);
    step_three_times(f, &params, &mut opt);
    params
}

#[test]
fn three_steps_match_pytorch_adamw() {
    let f = fixture(8);
    let params = run_three_steps(&f);
    let matches = |prefix: &str| {
        params.iter().all(|(n, v)| {
            let want = f.get(&format!("{prefix}.{n}"));
            (v.as_tensor() - want).unwrap().abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap() < 1e-5
        })
    };
    let diagnosis = if matches("mistake_decay_all") {
        "every parameter decays, norm weights and biases included"
    } else if matches("mistake_decay_none") {
        "no parameter decays: the matrices' group needs config.weight_decay"
    } else {
        "compare each parameter's group and weight decay with the rule: 2-D decays, 1-D does not"
    };
    for (name, var) in params.iter() {
        let what = format!("`{name}` after three AdamW steps (likely cause if wrong: {diagnosis})");
        expect_close(var.as_tensor(), &f.get(&format!("after.{name}")), F32, &what, &[]);
    }
}
