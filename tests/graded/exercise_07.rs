//! Exercise 7: GPT forward, next-token loss and activation checkpointing.
//! Reference: tests/fixtures/generate.py, `exercise_07` (a 2-layer model with random weights).

use candle_core::DType;
use workbook::{param_specs, ForwardPass, Gpt, GptConfig, ParamStore};

use crate::support::{
    cause, expect_close, expect_dtype, expect_same, fixture, mistake, ok, scalar, value_failure, Fixture, Tol, F32,
};

/// Two layers accumulate float32 rounding differently from PyTorch; gradients more so.
const LOGITS: Tol = Tol { atol: 1e-4, rtol: 1e-4 };
const GRADS: Tol = Tol { atol: 1e-5, rtol: 1e-3 };

fn config(f: &Fixture) -> GptConfig {
    f.model_config()
}

fn params(f: &Fixture) -> ParamStore {
    let names = param_specs(&config(f)).into_iter().map(|s| s.name);
    ParamStore::from_tensors(names.map(|name| {
        let t = f.get(&name);
        (name, t)
    }))
    .unwrap()
}

fn model(f: &Fixture, params: &ParamStore, checkpointing: bool) -> Gpt {
    Gpt::new(&config(f), params).unwrap().with_activation_checkpointing(checkpointing)
}

fn run(f: &Fixture, gpt: &Gpt) -> ForwardPass {
    ok(gpt.forward(&f.get("idx"), Some(&f.get("labels"))), "Gpt::forward(idx, Some(labels))")
}

fn loss_of(pass: &ForwardPass) -> f64 {
    let loss = pass.loss.as_ref().expect("forward with labels must return Some(loss)");
    assert!(loss.elem_count() == 1, "the loss must be a single number (the mean), got shape {:?}", loss.dims());
    loss.to_dtype(DType::F64).unwrap().flatten_all().unwrap().to_vec1::<f64>().unwrap()[0]
}

#[test]
fn logits_match_pytorch() {
    let f = fixture(7);
    let gpt = model(&f, &params(&f), false);
    let pass = ok(gpt.forward(&f.get("idx"), None), "Gpt::forward(idx, None)");
    expect_close(
        &pass.logits,
        &f.get("logits"),
        LOGITS,
        "logits (B=2, T=12, V=64)",
        &f.mistakes_of("logits", &["no_final_norm"]),
    );
    assert!(pass.loss.is_none(), "without labels there is nothing to compare against: loss must be None");
}

#[test]
fn loss_predicts_the_next_token() {
    let f = fixture(7);
    let pass = run(&f, &model(&f, &params(&f), false));
    let loss = loss_of(&pass);
    let want = f.scalar("loss");
    let known = f.mistakes_of("loss", &["unshifted", "shift_reversed", "no_final_norm"]);
    if (loss - want).abs() > 1e-4 {
        let matched = known.iter().find(|(_, output)| (loss - scalar(output)).abs() < 1e-4).map(|(cause, _)| *cause);
        panic!("{}", value_failure("the loss (PyTorch's is the expected one)", loss, want, matched));
    }
}

#[test]
fn gradients_match_pytorch() {
    let f = fixture(7);
    let p = params(&f);
    let pass = run(&f, &model(&f, &p, false));
    let grads = ok(pass.backward(), "ForwardPass::backward");
    for (name, var) in p.iter() {
        let Some(g) = grads.get(var) else {
            panic!("no gradient reached {name}: is every module on the path from idx to the loss?");
        };
        expect_close(g, &f.get(&format!("grad.{name}")), GRADS, &format!("gradient of {name}"), &[]);
    }
}

/// Recomputing blocks in backward must give the gradients of the plain pass.
#[test]
fn checkpointed_gradients_equal_plain_gradients() {
    let f = fixture(7);
    let p = params(&f);
    let plain = run(&f, &model(&f, &p, false));
    let checkpointed = run(&f, &model(&f, &p, true));
    let (checkpointed_blocks, blocks) = (checkpointed.recompute.len(), config(&f).num_layers);
    if checkpointed_blocks != blocks {
        // An empty tape alone does not say the flag was ignored: blocks run
        // through a tape that is not the one returned are cut from the graph
        // too. Only a plain forward, blocks and all, lets every gradient through.
        let grads = ok(checkpointed.backward(), "checkpointed backward");
        let cut_off: Vec<&str> = p.iter().filter(|(_, var)| grads.get(var).is_none()).map(|(name, _)| name).collect();
        let ignored = checkpointed_blocks == 0 && cut_off.is_empty();
        panic!(
            "activation checkpointing is on, and {checkpointed_blocks} of {blocks} blocks went through the \
             recompute tape ForwardPass returns; every block must, once per forward.{}{}",
            match cut_off.first() {
                Some(first) => format!(
                    " No gradient reached {} of the {} parameters ({first} first): the graph stops at a block \
                     that this tape cannot replay in backward.",
                    cut_off.len(),
                    p.iter().count()
                ),
                None => String::new(),
            },
            cause(ignored.then(|| mistake(7, "checkpointing_ignored")))
        );
    }
    assert!(plain.recompute.is_empty(), "checkpointing is off, yet blocks were checkpointed");
    let (with, without) = (loss_of(&checkpointed), loss_of(&plain));
    assert!(
        (with - without).abs() <= 1e-6 * without.abs(),
        "{}",
        value_failure("the loss with activation checkpointing", with, without, None)
    );
    let (plain_grads, ckpt_grads) =
        (ok(plain.backward(), "backward"), ok(checkpointed.backward(), "checkpointed backward"));
    for (name, var) in p.iter() {
        let want = plain_grads.get(var).unwrap_or_else(|| panic!("no plain gradient for {name}"));
        let Some(got) = ckpt_grads.get(var) else {
            panic!("no gradient reached {name} with activation checkpointing on");
        };
        expect_close(got, want, F32, &format!("checkpointed gradient of {name}"), &[]);
    }
}

/// A bf16 model still reports an f32 loss: a bf16 mean over many positions loses digits.
#[test]
fn loss_is_f32_for_a_bf16_model() {
    let f = fixture(7);
    let p = params(&f).to_dtype(DType::BF16).unwrap();
    let pass = run(&f, &model(&f, &p, false));
    let loss = pass.loss.as_ref().expect("forward with labels must return Some(loss)");
    expect_dtype(loss, DType::F32, "loss of a bf16 model", mistake(7, "bf16_loss"));
    let (got, want) = (loss_of(&pass), f.scalar("loss"));
    assert!(
        (got - want).abs() <= 0.02 * want.abs(),
        "{}",
        value_failure("the loss of the bf16 model (within 2% of the f32 one)", got, want, None)
    );
}

#[test]
fn logits_have_shape_batch_time_vocab() {
    let f = fixture(7);
    let gpt = model(&f, &params(&f), false);
    let idx = f.get("idx").narrow(1, 0, 5).unwrap(); // (2, 5)
    let pass = ok(gpt.forward(&idx, Some(&idx)), "Gpt::forward on (2, 5)");
    assert!(
        pass.logits.dims() == [2, 5, 64],
        "logits are {:?}: they must be (B, T, V) = [2, 5, 64]",
        pass.logits.dims()
    );
    // Causal: a position's logits ignore later tokens, so the first 5 come out
    // as in the learner's own full-length run, right or wrong (matches_pytorch
    // grades those against the reference).
    let whole = run(&f, &gpt).logits.narrow(1, 0, 5).unwrap();
    expect_same(
        &pass.logits,
        &whole,
        "the same positions in the full-length run",
        LOGITS,
        "logits of the first 5 positions of a (2, 5) input",
        None,
    );
}
