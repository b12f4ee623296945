//! Exercise 4: the SwiGLU MLP. Reference: tests/fixtures/generate.py, `exercise_04`.

use candle_core::Tensor;
use workbook::model::Linear;
use workbook::Mlp;

use crate::support::{expect_close, fixture, grad, ok, surrogate, var, F32};

fn mlp(gate: &Tensor, up: &Tensor, down: &Tensor) -> Mlp {
    Mlp::new(Linear::new(gate.clone(), None), Linear::new(up.clone(), None), Linear::new(down.clone(), None))
}

#[test]
fn matches_pytorch() {
    let f = fixture(4);
    let m = mlp(&f.get("gate_proj.weight"), &f.get("up_proj.weight"), &f.get("down_proj.weight"));
    let out = ok(m.forward(&f.get("x")), "Mlp::forward(x)");
    expect_close(
        &out,
        &f.get("out"),
        F32,
        "Mlp::forward(x) for x (2, 5, 8)",
        &f.mistakes(&["silu_on_up", "gelu", "relu", "sigmoid", "no_gate"]),
    );
}

#[test]
fn keeps_batch_and_sequence_and_returns_model_width() {
    let f = fixture(4);
    let m = mlp(&f.get("gate_proj.weight"), &f.get("up_proj.weight"), &f.get("down_proj.weight"));
    let x = f.get("x").narrow(1, 0, 3).unwrap(); // (2, 3, 8)
    let out = ok(m.forward(&x), "Mlp::forward(x)");
    let want = f.get("out").narrow(1, 0, 3).unwrap();
    expect_close(&out, &want, F32, "Mlp::forward on (2, 3, 8), the first 3 positions of the fixture's x", &[]);
}

#[test]
fn gradients_match_pytorch() {
    let f = fixture(4);
    let (x, gate, up, down) = (
        var(&f.get("x")),
        var(&f.get("gate_proj.weight")),
        var(&f.get("up_proj.weight")),
        var(&f.get("down_proj.weight")),
    );
    let out = ok(mlp(&gate, &up, &down).forward(&x), "Mlp::forward(x)");
    let grads = ok(surrogate(&out, &f.get("grad_out")).backward(), "backward through Mlp");
    let unused = "Is every projection part of the output?";
    expect_close(&grad(&grads, &x, "x", unused), &f.get("grad_x"), F32, "gradient of x", &[]);
    for (name, w) in [("gate_proj.weight", &gate), ("up_proj.weight", &up), ("down_proj.weight", &down)] {
        let g = grad(&grads, w, name, unused);
        expect_close(&g, &f.get(&format!("grad_{name}")), F32, &format!("gradient of {name}"), &[]);
    }
}
