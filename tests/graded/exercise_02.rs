//! Exercise 2: rotate_half. Reference: tests/fixtures/generate.py, `exercise_02`.

use rstest::rstest;
use workbook::rotate_half;

use crate::support::{expect_close, fixture, grad, ok, surrogate, var, F32};

#[test]
fn rotates_the_four_element_example() {
    let f = fixture(2);
    let out = ok(rotate_half(&f.get("x_simple")), "rotate_half([1, 2, 3, 4])");
    expect_close(&out, &f.get("out_simple"), F32, "rotate_half([1, 2, 3, 4]) (expected [-3, -4, 1, 2])", &[]);
}

#[test]
fn matches_pytorch() {
    let f = fixture(2);
    let out = ok(rotate_half(&f.get("x")), "rotate_half(x)");
    expect_close(
        &out,
        &f.get("out"),
        F32,
        "rotate_half(x) for x of shape (2, 3, 4, 8)",
        &f.mistakes(&["swapped_no_sign", "sign_wrong_half", "interleaved", "wrong_dim"]),
    );
}

/// The rotation acts on the last dimension whatever comes before it.
#[rstest]
#[case::a_single_vector(&[8])]
#[case::rows(&[24, 8])]
#[case::four_dimensions(&[2, 3, 4, 8])]
fn works_for_any_leading_shape(#[case] shape: &[usize]) {
    let f = fixture(2);
    let rows = shape.iter().product::<usize>() / 8;
    let take = |key: &str| f.get(key).reshape((24, 8)).unwrap().narrow(0, 0, rows).unwrap().reshape(shape).unwrap();
    let out = ok(rotate_half(&take("x")), "rotate_half");
    expect_close(&out, &take("out"), F32, &format!("rotate_half on shape {shape:?}"), &[]);
}

#[test]
fn gradient_is_the_opposite_rotation() {
    let f = fixture(2);
    let x = var(&f.get("x"));
    let out = ok(rotate_half(&x), "rotate_half(x)");
    let grads = ok(surrogate(&out, &f.get("grad_out")).backward(), "backward through rotate_half");
    let grad_x = grad(&grads, &x, "x", "Build the result from x with narrow/neg/cat so that autograd can follow it.");
    expect_close(&grad_x, &f.get("grad_x"), F32, "gradient of x", &[]);
}
