//! Exercise 3: rotary position embedding. Reference: tests/fixtures/generate.py, `exercise_03`.

use candle_core::Tensor;
use workbook::apply_rotary_pos_emb;

use crate::support::{expect_close, expect_same, fixture, grad, mistake, ok, surrogate, var, Fixture, F32};

fn rotated(f: &Fixture, q: &Tensor, k: &Tensor) -> (Tensor, Tensor) {
    ok(apply_rotary_pos_emb(q, k, &f.get("cos"), &f.get("sin")), "apply_rotary_pos_emb(q, k, cos, sin)")
}

fn mistakes(f: &Fixture, side: &str) -> Vec<(&'static str, Tensor)> {
    f.mistakes_of(side, &["sign", "swapped", "interleaved"])
}

#[test]
fn rotates_q_like_pytorch() {
    let f = fixture(3);
    let (q_out, _) = rotated(&f, &f.get("q"), &f.get("k"));
    expect_close(&q_out, &f.get("q_out"), F32, "rotated q (2, 3, 5, 8)", &mistakes(&f, "q"));
}

#[test]
fn rotates_k_like_pytorch() {
    let f = fixture(3);
    let (_, k_out) = rotated(&f, &f.get("q"), &f.get("k"));
    let mut known = mistakes(&f, "k");
    known.push((mistake(3, "k_unrotated"), f.get("k")));
    expect_close(&k_out, &f.get("k_out"), F32, "rotated k (2, 3, 5, 8)", &known);
}

#[test]
fn gradients_match_pytorch() {
    let f = fixture(3);
    let (q, k) = (var(&f.get("q")), var(&f.get("k")));
    let (q_out, k_out) = rotated(&f, &q, &k);
    let loss = (surrogate(&q_out, &f.get("grad_q_out")) + surrogate(&k_out, &f.get("grad_k_out"))).unwrap();
    let grads = ok(loss.backward(), "backward through apply_rotary_pos_emb");
    let fused = mistake(3, "fused_rope");
    expect_close(&grad(&grads, &q, "q", fused), &f.get("grad_q"), F32, "gradient of q", &[]);
    expect_close(&grad(&grads, &k, "k", fused), &f.get("grad_k"), F32, "gradient of k", &[]);
}

/// The point of RoPE: after rotation, q at position m and k at position n
/// score q·k as a function of m - n only. Put the same q and k vector at
/// every position and check that each diagonal of the score matrix is constant.
#[test]
fn scores_depend_only_on_relative_position() {
    let f = fixture(3);
    let t = 5;
    let one_q = f.get("q").narrow(2, 0, 1).unwrap(); // (2, 3, 1, 8)
    let one_k = f.get("k").narrow(2, 0, 1).unwrap();
    let q = one_q.repeat((1, 1, t, 1)).unwrap(); // the same vector at every position
    let k = one_k.repeat((1, 1, t, 1)).unwrap();
    let (q_out, k_out) = rotated(&f, &q, &k);
    let scores = q_out.matmul(&k_out.t().unwrap()).unwrap(); // (2, 3, T, T)
    for m in 1..t {
        for n in 1..t {
            let here = scores.narrow(2, m, 1).unwrap().narrow(3, n, 1).unwrap();
            let back = scores.narrow(2, m - 1, 1).unwrap().narrow(3, n - 1, 1).unwrap();
            expect_same(
                &here,
                &back,
                &format!("score(q at {}, k at {})", m - 1, n - 1),
                F32,
                &format!("score(q at {m}, k at {n}), which RoPE makes equal to one position back for both"),
                None,
            );
        }
    }
}
