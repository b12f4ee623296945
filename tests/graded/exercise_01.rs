//! Exercise 1: RMSNorm. Reference: tests/fixtures/generate.py, `exercise_01`.

use candle_core::{DType, Tensor};
use rstest::rstest;
use workbook::RmsNorm;

use crate::support::{
    expect_close, expect_close_or_explain, expect_dtype, fixture, grad, mistake, ok, surrogate, var, BF16, F32,
};

fn norm(weight: &Tensor) -> RmsNorm {
    RmsNorm::new(weight.clone(), fixture(1).scalar("eps"))
}

#[test]
fn matches_pytorch() {
    let f = fixture(1);
    let out = ok(norm(&f.get("weight")).forward(&f.get("x")), "RmsNorm::forward(x)");
    expect_close(
        &out,
        &f.get("out"),
        F32,
        "RmsNorm::forward(x)",
        &f.mistakes(&["mean_wrong_dim", "no_weight", "layer_norm", "no_rsqrt"]),
    );
}

/// On activations of size ~1e-3, mean(x²) ~ 1e-6 is smaller than eps = 1e-5,
/// so where eps goes decides the answer.
#[test]
fn eps_goes_inside_the_square_root() {
    let f = fixture(1);
    let out = ok(norm(&f.get("weight")).forward(&f.get("x_small")), "RmsNorm::forward(x_small)");
    expect_close(
        &out,
        &f.get("out_small"),
        F32,
        "RmsNorm::forward on tiny activations",
        &f.mistakes_of("small", &["no_eps", "eps_outside_sqrt"]),
    );
}

/// RMSNorm works on any number of leading dimensions: each row is normalised alone.
#[rstest]
#[case::a_single_vector(&[8])]
#[case::rows(&[6, 8])]
#[case::batch_time_channels(&[2, 3, 8])]
#[case::four_dimensions(&[3, 2, 1, 8])]
fn normalises_each_row_of_any_shape(#[case] shape: &[usize]) {
    let f = fixture(1);
    let rows = shape.iter().product::<usize>() / 8;
    let x = f.get("x").reshape((6, 8)).unwrap().narrow(0, 0, rows).unwrap().reshape(shape).unwrap();
    let want = f.get("out").reshape((6, 8)).unwrap().narrow(0, 0, rows).unwrap().reshape(shape).unwrap();
    let out = ok(norm(&f.get("weight")).forward(&x), "RmsNorm::forward");
    expect_close(&out, &want, F32, &format!("RmsNorm::forward on shape {shape:?}"), &[]);
}

#[test]
fn gradients_match_pytorch() {
    let f = fixture(1);
    let (x, weight) = (var(&f.get("x")), var(&f.get("weight")));
    let out = ok(norm(weight.as_tensor()).forward(&x), "RmsNorm::forward(x)");
    let grads = ok(surrogate(&out, &f.get("grad_out")).backward(), "backward through RmsNorm");
    let fused = mistake(1, "fused_rms_norm");
    expect_close(&grad(&grads, &x, "x", fused), &f.get("grad_x"), F32, "gradient of x", &[]);
    expect_close(
        &grad(&grads, &weight, "weight", "Is self.weight used in the output?"),
        &f.get("grad_weight"),
        F32,
        "gradient of weight",
        &[],
    );
}

/// 4096 channels of bf16: a bf16 sum of 4096 squares stalls far below its true
/// value, so the statistic must be computed in f32 and the result cast back.
#[test]
fn bf16_input_is_normalised_in_f32_and_returned_as_bf16() {
    let f = fixture(1);
    let x = f.get("x_long").to_dtype(DType::BF16).unwrap();
    let weight = f.get("weight_long").to_dtype(DType::BF16).unwrap();
    let out = ok(norm(&weight).forward(&x), "RmsNorm::forward(bf16 x)");
    expect_dtype(&out, DType::BF16, "RmsNorm::forward(bf16 x)", "Cast the result back to the input's dtype.");
    expect_close_or_explain(
        &out,
        &f.get("out_long_bf16"),
        BF16,
        "RmsNorm::forward(bf16 x)",
        mistake(1, "bf16_statistic"),
    );
}

/// Inside the model, blocks call `RmsNorm::forward_rows`, which runs this
/// forward on the rows (N, C) with the weight repeated over them, (N, C):
/// candle's gradient of a broadcast (C) weight is a slow sum, and a repeated
/// one sums fast (`kernels::broadcast_rows`). `broadcast_mul` takes both shapes.
#[test]
fn works_on_the_models_rows_with_the_weight_repeated() {
    let f = fixture(1);
    let (x, weight) = (var(&f.get("x")), var(&f.get("weight")));
    let cause = "the model hands forward the weight as (N, C), one copy per row (see RmsNorm::forward_rows); \
                 combine it with broadcast_mul and do not reshape it to (C)";
    let out = ok(norm(weight.as_tensor()).forward_rows(&x), &format!("RmsNorm::forward_rows(x) ({cause})"));
    expect_close_or_explain(&out, &f.get("out"), F32, "RmsNorm::forward_rows(x)", cause);
    let grads = ok(surrogate(&out, &f.get("grad_out")).backward(), "backward through RmsNorm::forward_rows");
    let weight_grad = grad(&grads, &weight, "weight", cause);
    expect_close_or_explain(&weight_grad, &f.get("grad_weight"), F32, "gradient of weight through forward_rows", cause);
}
