//! Exercise 8: AdamW parameter groups. Reference: tests/fixtures/generate.py, `exercise_08`
//! (three `torch.optim.AdamW` steps with a decay and a no-decay group).

use candle_core::{DType, Device, Tensor};
use workbook::autograd::Gradients;
use workbook::phase2_training::param_groups;
use workbook::train::{AdamW, AdamWConfig, OptimizerConfig, ParamGroup};
use workbook::{param_specs, GptConfig, ParamStore};

use crate::support::{all_close, expect_close, fixture, mistake, ok, Fixture, F32};

/// Every kind of parameter the model has, biases included.
fn model_params() -> ParamStore {
    let config = GptConfig {
        vocab_size: 16,
        hidden_size: 8,
        num_layers: 2,
        num_heads: 2,
        num_kv_heads: None,
        intermediate_size: 12,
        max_seq_len: 8,
        rope_theta: 10_000.0,
        norm_eps: 1e-5,
        bias: true,
        tie_word_embeddings: false,
    };
    ParamStore::from_tensors(
        param_specs(&config).into_iter().map(|s| (s.name, Tensor::zeros(s.shape, DType::F32, &Device::Cpu).unwrap())),
    )
    .unwrap()
}

/// Not the trainer's default of 0.1, so that a decay typed in is caught.
const WEIGHT_DECAY: f64 = 0.037;

/// The weight decay of the group that holds `name`, or None.
fn decay_of(groups: &[ParamGroup], name: &str) -> Option<f64> {
    groups.iter().find(|g| g.names.iter().any(|n| n == name)).map(|g| g.weight_decay)
}

#[test]
fn every_parameter_is_in_exactly_one_group() {
    let params = model_params();
    let groups = param_groups(&params, WEIGHT_DECAY);
    for (name, _) in params.iter() {
        let count = groups.iter().flat_map(|g| &g.names).filter(|n| *n == name).count();
        assert!(count > 0, "`{name}` is in no group: {}", mistake(8, "left_out"));
        assert!(count == 1, "`{name}` is in {count} groups: {}", mistake(8, "in_two_groups"));
    }
    let (total, model) = (groups.iter().map(|g| g.names.len()).sum::<usize>(), params.iter().count());
    assert!(total == model, "the groups name {total} parameters, the model has {model}: some are not the model's");
}

/// A norm's weight or a bias, known by its Hugging Face name.
fn scale_or_offset(name: &str) -> bool {
    name.ends_with("norm.weight") || name.ends_with(".bias")
}

#[test]
fn norm_weights_and_biases_do_not_decay() {
    let params = model_params();
    let groups = param_groups(&params, WEIGHT_DECAY);
    for (name, var) in params.iter().filter(|(name, _)| scale_or_offset(name)) {
        let decay = decay_of(&groups, name).unwrap_or_else(|| panic!("`{name}` is in no group"));
        assert!(
            decay == 0.0,
            "`{name}` ({:?}) has weight decay {decay}: norm weights and biases must not decay, \
             they are scales and offsets, not weights to shrink",
            var.dims()
        );
    }
}

#[test]
fn matrices_and_embeddings_decay() {
    let params = model_params();
    let groups = param_groups(&params, WEIGHT_DECAY);
    // "No parameter decays" is the cause only when it is true of every parameter.
    let none_decays = params.iter().all(|(name, _)| decay_of(&groups, name).is_none_or(|decay| decay == 0.0));
    for (name, _) in params.iter().filter(|(name, _)| !scale_or_offset(name)) {
        let decay = decay_of(&groups, name).unwrap_or_else(|| panic!("`{name}` is in no group"));
        let cause = match decay {
            0.0 if none_decays => mistake(8, "decay_none"),
            0.0 => "it is in a group without decay",
            0.1 => mistake(8, "typed_in_decay"),
            _ => "a weight decay other than the `weight_decay` argument",
        };
        assert!(
            decay == WEIGHT_DECAY,
            "`{name}` has weight decay {decay}, expected the argument weight_decay = {WEIGHT_DECAY} ({cause}): \
             matrices and embeddings are what weight decay regularises"
        );
    }
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
    let mut opt =
        ok(AdamW::new(param_groups(&params, config.weight_decay), config.adamw), "AdamW::new(param_groups(..))");
    step_three_times(f, &params, &mut opt);
    params
}

#[test]
fn three_steps_match_pytorch_adamw() {
    let f = fixture(8);
    let params = run_three_steps(&f);
    // A mistake is named only where every parameter came out as it would have
    // made them: one parameter alone cannot tell "all decay" from "this one decays".
    let everywhere = |id: &str| {
        params.iter().all(|(name, var)| all_close(var.as_tensor(), &f.get(&format!("mistake_{id}.{name}")), F32))
    };
    let named: Vec<&str> = ["decay_all", "decay_none"].into_iter().filter(|id| everywhere(id)).collect();
    for (name, var) in params.iter() {
        let known: Vec<_> = named.iter().map(|id| (mistake(8, id), f.get(&format!("mistake_{id}.{name}")))).collect();
        expect_close(
            var.as_tensor(),
            &f.get(&format!("after.{name}")),
            F32,
            &format!("`{name}` after three AdamW steps"),
            &known,
        );
    }
}
