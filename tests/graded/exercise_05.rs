//! Exercise 5: causal scaled dot-product attention. Reference: tests/fixtures/generate.py, `exercise_05`.

use candle_core::{DType, Tensor};
use workbook::causal_attention;

use crate::support::{
    expect_close, expect_close_because, expect_same, explain_error, fixture, grad, mistake, ok, surrogate, var, BF16,
    F32,
};

fn attend(q: &Tensor, k: &Tensor, v: &Tensor) -> Tensor {
    ok(causal_attention(q, k, v), "causal_attention(q, k, v)")
}

#[test]
fn matches_pytorch() {
    let f = fixture(5);
    let out = attend(&f.get("q"), &f.get("k"), &f.get("v"));
    expect_close(
        &out,
        &f.get("out"),
        F32,
        "causal_attention(q, k, v) for (2, 2, 6, 8)",
        &f.mistakes(&["no_mask", "next_visible", "anti_causal", "scale_by_d", "no_scale", "softmax_wrong_dim"]),
    );
}

/// Position 0 may attend only to itself, so its output is exactly its value.
#[test]
fn first_position_attends_only_to_itself() {
    let f = fixture(5);
    let first = |t: Tensor| t.narrow(2, 0, 1).unwrap();
    let out = first(attend(&f.get("q"), &f.get("k"), &f.get("v")));
    let want = first(f.get("v"));
    let what = "output at position 0";
    let nan = out.flatten_all().unwrap().to_vec1::<f32>().unwrap().iter().any(|v| v.is_nan());
    if nan {
        // Position 0's row of scores holds one key; NaN means it was masked too.
        expect_close_because(&out, &want, F32, what, Some(mistake(5, "diagonal_hidden")));
    }
    let seen_later = f
        .mistakes(&["no_mask", "next_visible", "anti_causal"])
        .into_iter()
        .map(|(m, t)| (m, first(t)))
        .collect::<Vec<_>>();
    expect_close(&out, &want, F32, what, &seen_later);
}

/// Changing the keys and values of the last positions must not change the
/// outputs of earlier ones: information may only flow forward in time.
#[test]
fn future_positions_do_not_leak_into_the_past() {
    let f = fixture(5);
    let (q, k, v) = (f.get("q"), f.get("k"), f.get("v"));
    let keep = 3;
    let scramble = |t: &Tensor| {
        let past = t.narrow(2, 0, keep).unwrap();
        let future = (t.narrow(2, keep, 3).unwrap() * -3.0).unwrap();
        Tensor::cat(&[&past, &future], 2).unwrap()
    };
    let before = attend(&q, &k, &v).narrow(2, 0, keep).unwrap();
    let after = attend(&q, &scramble(&k), &scramble(&v)).narrow(2, 0, keep).unwrap();
    // Only keys and values at 3..6 changed: if the outputs at 0..3 did, they saw them.
    expect_same(
        &after,
        &before,
        "the outputs there before the change",
        F32,
        "outputs at positions 0..3 after changing keys and values at positions 3..6",
        Some("the mask lets a position see later ones; key j must be hidden from query i whenever j > i"),
    );
}

#[test]
fn gradients_match_pytorch() {
    let f = fixture(5);
    let (q, k, v) = (var(&f.get("q")), var(&f.get("k")), var(&f.get("v")));
    let out = attend(&q, &k, &v);
    let grads = ok(surrogate(&out, &f.get("grad_out")).backward(), "backward through causal_attention");
    let fused = mistake(5, "fused_softmax");
    expect_close(&grad(&grads, &q, "q", fused), &f.get("grad_q"), F32, "gradient of q", &[]);
    expect_close(&grad(&grads, &k, "k", fused), &f.get("grad_k"), F32, "gradient of k", &[]);
    expect_close(&grad(&grads, &v, "v", fused), &f.get("grad_v"), F32, "gradient of v", &[]);
}

/// bf16 attention runs end to end and stays close to the f32 reference.
#[test]
fn runs_in_bf16() {
    let f = fixture(5);
    let want = f.get("out");
    // The f32 path first: a failure there is not about bf16.
    let f32_out = attend(&f.get("q"), &f.get("k"), &f.get("v"));
    expect_close(&f32_out, &want, F32, "causal_attention in f32 (see matches_pytorch)", &[]);
    let bf16 = |key: &str| f.get(key).to_dtype(DType::BF16).unwrap();
    let out = match causal_attention(&bf16("q"), &bf16("k"), &bf16("v")) {
        Ok(out) => out,
        Err(e) => {
            // A mask or scale in f32 meets the bf16 scores in the op that applies it; a
            // mismatch in a product is another mistake (weights or values left in f32).
            let text = e.to_string();
            let mixed = text.contains("dtype mismatch") && !text.contains("dtype mismatch in matmul");
            panic!(
                "causal_attention(bf16 q, k, v) returned an error:\n  {}{}",
                explain_error(&e),
                crate::support::cause(mixed.then(|| mistake(5, "mask_dtype")))
            )
        }
    };
    assert!(
        out.dtype() == DType::BF16,
        "bf16 inputs gave a {:?} output: cast the result back to the inputs' dtype",
        out.dtype()
    );
    expect_close(&out, &want, BF16, "bf16 causal_attention, whose f32 path is right", &[]);
}
