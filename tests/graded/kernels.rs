//! Ungraded checks of the fused kernels (`workbook::kernels`): each computes
//! what its composed candle counterpart computes, forward and backward, in
//! f32 and bf16, on the calling thread and split over the kernel threads.

use candle_core::{DType, Device, Tensor, D};
use workbook::{kernels, InitRng};

use crate::support::{expect_close, grad, l2_norm, surrogate, values, var, BF16, F32};

/// Gaussian values of `shape` with standard deviation `std`, the same on every
/// run: these checks compare two implementations, not against a fixture.
pub fn randn(shape: &[usize], std: f64) -> Tensor {
    InitRng::from_seed(shape.iter().product::<usize>() as u64).normal(&shape.into(), std, &Device::Cpu).unwrap()
}

fn ulps(a: f32, b: f32) -> i64 {
    (a.to_bits() as i64 - b.to_bits() as i64).abs()
}

#[test]
fn exp_is_within_two_ulps_of_f64_exp() {
    let mut worst = (0, 0f32);
    let mut x = -87.3f32;
    while x < 88.7 {
        let error = ulps(kernels::exp(x), (x as f64).exp() as f32);
        if error > worst.0 {
            worst = (error, x);
        }
        x += 0.001_37;
    }
    assert!(worst.0 <= 2, "exp({}) is {} ulps from f64's", worst.1, worst.0);
}

#[test]
fn exp_edges() {
    assert_eq!(kernels::exp(0.0), 1.0);
    assert_eq!(kernels::exp(f32::NEG_INFINITY), 0.0, "exp(-inf) must be exactly 0: masked scores get zero weight");
    assert_eq!(kernels::exp(-100.0), 0.0);
    assert_eq!(kernels::exp(f32::INFINITY), f32::INFINITY);
    assert_eq!(kernels::exp(100.0), f32::INFINITY);
    assert!(kernels::exp(f32::NAN).is_nan());
}

/// Scores (B, H, T, T) with the future masked to -inf, as attention makes them;
/// `t` = 128 puts 2^20 elements past the single-thread threshold.
fn masked_scores(t: usize) -> Tensor {
    let future = Tensor::tril2(t, DType::U8, &Device::Cpu).unwrap();
    let blocked = Tensor::full(f32::NEG_INFINITY, (t, t), &Device::Cpu).unwrap();
    let mask = future.where_cond(&Tensor::zeros((t, t), DType::F32, &Device::Cpu).unwrap(), &blocked).unwrap();
    randn(&[4, 2, t, t], 3.0).broadcast_add(&mask).unwrap()
}

#[test]
fn softmax_matches_candle_forward_and_backward() {
    for t in [7, 128] {
        let x = var(&masked_scores(t));
        let dy = randn(x.dims(), 1.0);
        let ours = kernels::softmax(&x).unwrap();
        let theirs = candle_nn::ops::softmax(&x, D::Minus1).unwrap();
        expect_close(&ours, &theirs, F32, &format!("kernels::softmax of ({t}, {t}) masked scores"), &[]);
        let above_diagonal = ours.narrow(2, 0, 1).unwrap().narrow(3, 1, t - 1).unwrap();
        assert_eq!(
            above_diagonal.abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap(),
            0.0,
            "masked weights must be exactly 0"
        );
        let g_ours = surrogate(&ours, &dy).backward().unwrap();
        let g_theirs = surrogate(&theirs, &dy).backward().unwrap();
        let if_missing = "the kernel lost its backward pass";
        expect_close(
            &grad(&g_ours, &x, "x", if_missing),
            &grad(&g_theirs, &x, "x", ""),
            F32,
            "gradient of kernels::softmax",
            &[],
        );
    }
}

#[test]
fn softmax_keeps_bf16_and_computes_in_f32() {
    let x = masked_scores(16);
    let ours = kernels::softmax(&x.to_dtype(DType::BF16).unwrap()).unwrap();
    assert_eq!(ours.dtype(), DType::BF16);
    let reference =
        candle_nn::ops::softmax(&x.to_dtype(DType::BF16).unwrap().to_dtype(DType::F32).unwrap(), D::Minus1).unwrap();
    expect_close(&ours.to_dtype(DType::F32).unwrap(), &reference, BF16, "bf16 kernels::softmax", &[]);
}

#[test]
fn silu_matches_candle_forward_and_backward() {
    for n in [5, 1 << 16] {
        let x = var(&randn(&[2, n], 4.0));
        let dy = randn(x.dims(), 1.0);
        let ours = kernels::silu(&x).unwrap();
        let theirs = candle_nn::ops::silu(&x).unwrap();
        expect_close(&ours, &theirs, F32, "kernels::silu", &[]);
        let g_ours = surrogate(&ours, &dy).backward().unwrap();
        let g_theirs = surrogate(&theirs, &dy).backward().unwrap();
        expect_close(
            &grad(&g_ours, &x, "x", "no backward"),
            &grad(&g_theirs, &x, "x", ""),
            F32,
            "gradient of kernels::silu",
            &[],
        );
    }
    let bf16 = kernels::silu(&randn(&[3, 4], 1.0).to_dtype(DType::BF16).unwrap()).unwrap();
    assert_eq!(bf16.dtype(), DType::BF16);
}

#[test]
fn cross_entropy_matches_candle_forward_and_backward() {
    for (n, v) in [(3, 5), (300, 257)] {
        let logits = var(&randn(&[n, v], 2.0));
        let targets =
            Tensor::from_vec((0..n as u32).map(|i| (i * 7919) % v as u32).collect(), n, &Device::Cpu).unwrap();
        let ours = kernels::cross_entropy(&logits, &targets).unwrap();
        let theirs = candle_nn::loss::cross_entropy(&logits, &targets).unwrap();
        expect_close(&ours, &theirs, F32, "kernels::cross_entropy", &[]);
        let (g_ours, g_theirs) =
            ((&ours * 3.0).unwrap().backward().unwrap(), (&theirs * 3.0).unwrap().backward().unwrap());
        expect_close(
            &grad(&g_ours, &logits, "logits", "no backward"),
            &grad(&g_theirs, &logits, "logits", ""),
            F32,
            "gradient of kernels::cross_entropy",
            &[],
        );
    }
}

#[test]
fn cross_entropy_rejects_bad_targets() {
    let logits = randn(&[2, 4], 1.0);
    let out_of_range = Tensor::new(&[1u32, 4], &Device::Cpu).unwrap();
    let err = kernels::cross_entropy(&logits, &out_of_range).unwrap_err().to_string();
    assert!(err.contains("target 4 is not a class index below 4"), "{err}");
    let wrong_shape = Tensor::new(&[1u32, 2, 3], &Device::Cpu).unwrap();
    let err = kernels::cross_entropy(&logits, &wrong_shape).unwrap_err().to_string();
    assert!(err.contains("targets have shape [3], expected (2)"), "{err}");
}

#[test]
fn linear_matches_candle_forward_and_backward() {
    // 1100 rows: the weight gradient sums them in three blocks, the last one short.
    for dims in [vec![5, 6], vec![3, 40, 64], vec![11, 100, 16]] {
        let in_features = *dims.last().unwrap();
        let x = var(&randn(&dims, 1.0));
        let w = var(&randn(&[24, in_features], 0.2));
        let ours = kernels::linear(&x, &w).unwrap();
        let theirs = candle_core::Module::forward(&candle_nn::Linear::new(w.as_tensor().clone(), None), &x).unwrap();
        expect_close(&ours, &theirs, F32, "kernels::linear", &[]);
        let dy = randn(ours.dims(), 1.0);
        let g_ours = surrogate(&ours, &dy).backward().unwrap();
        let g_theirs = surrogate(&theirs, &dy).backward().unwrap();
        for (name, t) in [("x", &x), ("w", &w)] {
            let what = format!("gradient of kernels::linear with respect to {name}");
            expect_close(&grad(&g_ours, t, name, "no backward"), &grad(&g_theirs, t, name, ""), F32, &what, &[]);
        }
    }
}

#[test]
fn linear_in_bf16_and_with_mismatched_features() {
    let x = randn(&[2, 3, 8], 1.0);
    let w = randn(&[4, 8], 0.3);
    let bf16 = kernels::linear(&x.to_dtype(DType::BF16).unwrap(), &w.to_dtype(DType::BF16).unwrap()).unwrap();
    assert_eq!(bf16.dtype(), DType::BF16);
    expect_close(
        &bf16.to_dtype(DType::F32).unwrap(),
        &kernels::linear(&x, &w).unwrap(),
        BF16,
        "bf16 kernels::linear",
        &[],
    );
    let err = kernels::linear(&x, &randn(&[4, 7], 0.3)).unwrap_err().to_string();
    assert!(err.contains("does not end in the weight's 7 input features"), "{err}");
}

#[test]
fn split_and_merge_heads_match_candle_forward_and_backward() {
    let (b, t, heads, d) = (2, 5, 3, 4);
    let x = var(&randn(&[b, t, heads * d], 1.0));
    let ours = kernels::split_heads(&x, heads).unwrap();
    let theirs = x.reshape((b, t, heads, d)).unwrap().transpose(1, 2).unwrap().contiguous().unwrap();
    assert_eq!(ours.dims(), &[b, heads, t, d]);
    assert_eq!(values(&ours), values(&theirs), "split_heads must equal reshape + transpose(1, 2)");
    let merged = kernels::merge_heads(&ours).unwrap();
    assert_eq!(merged.dims(), x.dims());
    assert_eq!(values(&merged), values(&x), "merge_heads must undo split_heads");

    let dy = randn(&[b, heads, t, d], 1.0);
    let weights = randn(&[b, heads, t, d], 1.0);
    // Through both ops and a product, so that each backward pass gets a gradient that is not all ones.
    let through = |split: &Tensor| kernels::merge_heads(&(split * &weights).unwrap()).unwrap();
    let g_ours = surrogate(&through(&ours), &kernels::merge_heads(&dy).unwrap()).backward().unwrap();
    let reference = (theirs * &weights).unwrap().transpose(1, 2).unwrap().reshape((b, t, heads * d)).unwrap();
    let g_theirs = surrogate(&reference, &kernels::merge_heads(&dy).unwrap()).backward().unwrap();
    expect_close(
        &grad(&g_ours, &x, "x", "no backward"),
        &grad(&g_theirs, &x, "x", ""),
        F32,
        "gradient through split_heads and merge_heads",
        &[],
    );
}

#[test]
fn split_heads_keeps_bf16_and_rejects_indivisible_channels() {
    let x = randn(&[1, 2, 8], 1.0).to_dtype(DType::BF16).unwrap();
    assert_eq!(kernels::split_heads(&x, 2).unwrap().dtype(), DType::BF16);
    let err = kernels::split_heads(&x, 3).unwrap_err().to_string();
    assert!(err.contains("8 channels do not split into 3 heads"), "{err}");
}

/// Scores (B, H, T, T) scaled, masked with a mask of 0 and -inf and softmaxed,
/// the way exercise 5 composes them.
fn composed_masked_softmax(scores: &Tensor, allowed: &Tensor, scale: f64) -> Tensor {
    let t = allowed.dim(0).unwrap();
    let blocked = Tensor::full(f32::NEG_INFINITY, (t, t), &Device::Cpu).unwrap();
    let mask = allowed.where_cond(&Tensor::zeros((t, t), DType::F32, &Device::Cpu).unwrap(), &blocked).unwrap();
    candle_nn::ops::softmax(&(scores * scale).unwrap().broadcast_add(&mask).unwrap(), D::Minus1).unwrap()
}

#[test]
fn scaled_masked_softmax_matches_the_composed_ops_forward_and_backward() {
    for t in [7, 128] {
        let allowed = Tensor::tril2(t, DType::U8, &Device::Cpu).unwrap();
        let x = var(&randn(&[4, 2, t, t], 3.0));
        let dy = randn(x.dims(), 1.0);
        let ours = kernels::scaled_masked_softmax(&x, &allowed, 0.25).unwrap();
        let theirs = composed_masked_softmax(&x, &allowed, 0.25);
        expect_close(&ours, &theirs, F32, &format!("kernels::scaled_masked_softmax of ({t}, {t}) scores"), &[]);
        let above_diagonal = ours.narrow(2, 0, 1).unwrap().narrow(3, 1, t - 1).unwrap();
        assert_eq!(
            above_diagonal.abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap(),
            0.0,
            "masked weights must be exactly 0"
        );
        let g_ours = surrogate(&ours, &dy).backward().unwrap();
        let g_theirs = surrogate(&theirs, &dy).backward().unwrap();
        let what = "gradient of kernels::scaled_masked_softmax";
        expect_close(
            &grad(&g_ours, &x, "x", "the kernel lost its backward pass"),
            &grad(&g_theirs, &x, "x", ""),
            F32,
            what,
            &[],
        );
    }
}

#[test]
fn scaled_masked_softmax_checks_its_mask() {
    let x = randn(&[2, 3, 4, 4], 1.0);
    let bf16 = kernels::scaled_masked_softmax(
        &x.to_dtype(DType::BF16).unwrap(),
        &Tensor::tril2(4, DType::U8, &Device::Cpu).unwrap(),
        0.5,
    )
    .unwrap();
    assert_eq!(bf16.dtype(), DType::BF16);
    let nothing_allowed = Tensor::zeros((4, 4), DType::U8, &Device::Cpu).unwrap();
    let nan = kernels::scaled_masked_softmax(&x, &nothing_allowed, 1.0).unwrap();
    assert!(
        nan.flatten_all().unwrap().to_vec1::<f32>().unwrap().iter().all(|v| v.is_nan()),
        "a row with nothing allowed gives NaN, as the composed ops do"
    );
    let wrong_shape = kernels::scaled_masked_softmax(&x, &Tensor::tril2(3, DType::U8, &Device::Cpu).unwrap(), 1.0)
        .unwrap_err()
        .to_string();
    assert!(wrong_shape.contains("a mask of shape [3, 3] does not fit scores of shape [2, 3, 4, 4]"), "{wrong_shape}");
    let full_size = Tensor::ones((2, 3, 4, 4), DType::U8, &Device::Cpu).unwrap();
    let wrong_rank = kernels::scaled_masked_softmax(&x, &full_size, 1.0).unwrap_err().to_string();
    assert!(wrong_rank.contains("it must be (Tq, Tk)"), "{wrong_rank}");
    let additive = Tensor::zeros((4, 4), DType::F32, &Device::Cpu).unwrap();
    let wrong_dtype = kernels::scaled_masked_softmax(&x, &additive, 1.0).unwrap_err().to_string();
    assert!(wrong_dtype.contains("the mask must be u8"), "{wrong_dtype}");
}

#[test]
fn scale_channels_matches_candle_broadcast_mul_forward_and_backward() {
    let x = var(&randn(&[3, 100, 24], 1.0));
    let weight = var(&randn(&[24], 1.0));
    let ours = kernels::scale_channels(&x, &weight).unwrap();
    let theirs = x.broadcast_mul(&weight).unwrap();
    assert_eq!(ours.dims(), theirs.dims(), "scale_channels keeps the shape of x");
    assert_eq!(values(&ours), values(&theirs), "scale_channels must compute x * weight exactly");
    let dy = randn(&[3, 100, 24], 1.0);
    let g_ours = surrogate(&ours, &dy).backward().unwrap();
    let g_theirs = surrogate(&theirs, &dy).backward().unwrap();
    for (t, name) in [(&weight, "weight"), (&x, "x")] {
        expect_close(
            &grad(&g_ours, t, name, "no backward"),
            &grad(&g_theirs, t, name, ""),
            F32,
            &format!("gradient of {name} through kernels::scale_channels"),
            &[],
        );
    }
    let bf16 = |t: &Tensor| t.to_dtype(DType::BF16).unwrap();
    let half = kernels::scale_channels(&bf16(&x), &bf16(&weight)).unwrap();
    assert_eq!((half.dims(), half.dtype()), (&[3, 100, 24][..], DType::BF16));
    let err = kernels::scale_channels(&x, &randn(&[3, 24], 1.0)).unwrap_err().to_string();
    assert!(err.contains("it must be (24)"), "{err}");
}

/// The one-pass AdamW update gives candle's composed ops' results bit for
/// bit (a non-contiguous gradient takes the composed path), over several
/// chunks of work, and a worked value: m = 0.1, v = 0.001, g = 0.5 at step 3.
#[test]
fn adamw_update_matches_the_composed_update_bit_for_bit() {
    use workbook::kernels::{adamw_update, AdamWStep};
    let n = (3 << 16) + 5;
    let (rows, cols) = (n / 5, 5);
    let normal = |seed, std| InitRng::from_seed(seed).normal(&(rows, cols).into(), std, &Device::Cpu).unwrap();
    let (p, g, m, v) = (normal(1, 1.0), normal(2, 0.5), normal(3, 0.1), normal(4, 0.01).sqr().unwrap());
    let step = AdamWStep { lr: 3e-3, beta1: 0.9, beta2: 0.95, eps: 1e-8, correction1: 0.271, correction2: 0.142625 };
    let fused = adamw_update(&p, &g, &m, &v, step).unwrap();
    let strided = g.t().unwrap().contiguous().unwrap().t().unwrap();
    assert!(!strided.is_contiguous());
    let composed = adamw_update(&p, &strided, &m, &v, step).unwrap();
    for (what, a, b) in
        [("parameter", &fused.0, &composed.0), ("m", &fused.1, &composed.1), ("v", &fused.2, &composed.2)]
    {
        expect_same_bits(a, b, &format!("the new {what}"), "the composed update's");
    }
    let one = |x: f32| Tensor::new(&[x], &Device::Cpu).unwrap();
    let (p, m, v) = adamw_update(&one(1.0), &one(0.5), &one(0.1), &one(0.001), step).unwrap();
    let value = |t: Tensor| t.to_vec1::<f32>().unwrap()[0] as f64;
    let (m_want, v_want) = (0.9 * 0.1 + 0.1 * 0.5, 0.95 * 0.001 + 0.05 * 0.25);
    let p_want = 1.0 - 3e-3 * (m_want / 0.271) / ((v_want / 0.142625f64).sqrt() + 1e-8);
    assert!((value(m) - m_want).abs() < 1e-7 && (value(v) - v_want).abs() < 1e-7);
    assert!((value(p) - p_want).abs() < 1e-6, "a worked update: {p_want}");
}

/// Fails unless `ours` and `theirs` have one shape and the same bits in every element.
pub fn expect_same_bits(ours: &Tensor, theirs: &Tensor, what: &str, whose: &str) {
    assert_eq!(ours.dims(), theirs.dims(), "{what} has the wrong shape");
    let (ours, theirs) = (values(ours), values(theirs));
    let first = ours.iter().zip(&theirs).position(|(a, b)| a.to_bits() != b.to_bits());
    assert_eq!(first, None, "{what} differs from {whose} at element {first:?}");
}

/// The passes between the model's passes give candle's results bit for bit:
/// `add` is candle's `a + b`, `scale` its `a * factor` (an affine op, which
/// turns −0 into +0), on the calling thread for a small tensor and over
/// threads of their own for one of several chunks of work; a strided input
/// takes candle's path.
#[test]
fn add_and_scale_between_passes_match_candles_ops_bit_for_bit() {
    kernels::set_threads_between_passes(3).unwrap();
    let same = |ours: &Tensor, theirs: &Tensor, what: &str| expect_same_bits(ours, theirs, what, "candle's");
    for n in [1000, (3 << 16) + 7] {
        let (a, b) = (randn(&[n / 7, 7], 1.0), randn(&[n / 7, 7], 0.3).affine(-1.0, 0.0).unwrap());
        let with_negative_zero = a.maximum(0.0).unwrap().neg().unwrap();
        same(&kernels::add(&a, &b).unwrap(), &(&a + &b).unwrap(), &format!("add of {n} elements"));
        same(&kernels::scale(&a, 0.37).unwrap(), &(&a * 0.37).unwrap(), &format!("scale of {n} elements"));
        same(&kernels::scale(&with_negative_zero, 2.0).unwrap(), &(&with_negative_zero * 2.0).unwrap(), "scale of -0");
        let strided = b.t().unwrap().contiguous().unwrap().t().unwrap();
        same(&kernels::add(&a, &strided).unwrap(), &(&a + &b).unwrap(), "add of a strided tensor");
    }
    let err = kernels::add(&randn(&[4, 3], 1.0), &randn(&[3, 4], 1.0)).unwrap_err().to_string();
    assert!(err.contains("shape mismatch"), "{err}");
}

/// The gradient norm's sum of squares is the f64 sum's to f32 rounding, the
/// same on every call, and the finiteness check finds one NaN or inf among
/// several chunks of work, and is not fooled by finite values whose sum of
/// magnitudes overflows f32; a strided tensor takes candle's path.
#[test]
fn sum_of_squares_and_all_finite_over_chunks_of_work() {
    kernels::set_threads_between_passes(3).unwrap();
    let n = 7 * 28_090; // more than 3 chunks of 2^16
    let x = randn(&[n], 1.0);
    let exact: f64 = x.to_vec1::<f32>().unwrap().iter().map(|&v| v as f64 * v as f64).sum();
    let ours = kernels::sum_of_squares(&[&x]).unwrap();
    assert!((ours - exact).abs() < 1e-5 * exact, "sum of squares {ours}, the f64 sum is {exact}");
    assert_eq!(ours.to_bits(), kernels::sum_of_squares(&[&x]).unwrap().to_bits(), "the same input gave another sum");
    // A strided tensor is summed by rows of 1,024 and a remainder, as on a GPU.
    let strided = x.reshape((n / 7, 7)).unwrap().t().unwrap();
    assert!((kernels::sum_of_squares(&[&strided]).unwrap() - exact).abs() < 1e-4 * exact);
    let both = kernels::sum_of_squares(&[&x, &strided, &x]).unwrap();
    assert!((both - 3.0 * exact).abs() < 3e-4 * exact, "three tensors' sum of squares {both}, want {}", 3.0 * exact);
    let with = |at: usize, value: f32| {
        let mut values = vec![1e30f32; n];
        values[at] = value;
        Tensor::from_vec(values, (n / 7, 7), &Device::Cpu).unwrap()
    };
    for (t, name) in [(with(n - 3, 2.0), "finite"), (with(n - 3, f32::NAN), "NaN"), (with(5, f32::INFINITY), "inf")] {
        let finite = name == "finite";
        assert_eq!(kernels::all_finite(&[&t]).unwrap(), finite, "all_finite of a tensor with an {name} element");
        let strided = t.t().unwrap();
        assert_eq!(kernels::all_finite(&[&strided]).unwrap(), finite, "all_finite of a strided tensor ({name})");
        let clean = Tensor::ones(7, DType::F32, &Device::Cpu).unwrap();
        let listed = kernels::all_finite(&[&clean, &strided, &clean]).unwrap();
        assert_eq!(listed, finite, "all_finite of three tensors, the middle one strided ({name})");
    }
}

/// ‖a − b‖ / ‖b‖ over all elements.
fn relative_l2(a: &Tensor, b: &Tensor) -> f64 {
    l2_norm(&(a - b).unwrap()) / l2_norm(b)
}

#[test]
fn linear_under_bf16_autocast_multiplies_in_bf16_and_keeps_f32_gradients() {
    use candle_core::Module;
    use workbook::model::{set_autocast_bf16, Linear};

    // bf16 keeps 8 bits of mantissa: each rounding is off by up to 2^-9 ≈ 0.2%.
    let bf16_error = 1e-2;
    let x = var(&randn(&[3, 5, 64], 1.0));
    let w = var(&randn(&[24, 64], 0.2));
    let layer = Linear::new(w.as_tensor().clone(), None);
    let exact = layer.forward(&x).unwrap();
    set_autocast_bf16(true);
    let cast = layer.forward(&x);
    set_autocast_bf16(false);
    let cast = cast.unwrap();
    assert_eq!(cast.dtype(), DType::F32, "autocast hands back f32");
    let error = relative_l2(&cast, &exact);
    assert!(error > 0.0, "under autocast the product must be computed in bf16, and it equals f32's");
    assert!(error < bf16_error, "Linear under bf16 autocast is off from f32 by {error} (relative L2)");
    let dy = randn(cast.dims(), 1.0);
    let (g_cast, g_exact) = (surrogate(&cast, &dy).backward().unwrap(), surrogate(&exact, &dy).backward().unwrap());
    for (name, t) in [("x", &x), ("w", &w)] {
        let got = grad(&g_cast, t, name, "autocast lost the backward pass");
        assert_eq!(got.dtype(), DType::F32, "the gradient of {name} under autocast must stay f32");
        let error = relative_l2(&got, &grad(&g_exact, t, name, ""));
        assert!(error < bf16_error, "the gradient of {name} under bf16 autocast is off from f32's by {error}");
    }
}
