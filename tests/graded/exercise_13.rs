//! Exercise 13: the mixed-precision policy. The expected policies follow
//! PyTorch's `MixedPrecision` and the bf16/fp16 formats. Training with them
//! (bf16 tracking fp32, fp16 skipping overflows) is a whole-phase check
//! (`phase_3.rs`): it needs exercise 14 as well.

use candle_core::DType;
use rstest::rstest;
use workbook::parallel::fsdp::{MixedPrecisionPolicy, Precision};
use workbook::phase3_fsdp::mixed_precision_policy;

use crate::support::mistake;

fn expected(precision: Precision) -> MixedPrecisionPolicy {
    let dtype = match precision {
        Precision::Fp32 => DType::F32,
        Precision::Bf16 => DType::BF16,
        Precision::Fp16 => DType::F16,
    };
    MixedPrecisionPolicy {
        param_dtype: dtype,
        reduce_dtype: dtype,
        buffer_dtype: dtype,
        loss_scaling: precision == Precision::Fp16,
    }
}

fn diagnose(precision: Precision, got: &MixedPrecisionPolicy) -> &'static str {
    match precision {
        Precision::Fp16 if !got.loss_scaling => mistake(13, "fp16_unscaled"),
        Precision::Bf16 if got.loss_scaling => mistake(13, "bf16_scaled"),
        Precision::Fp32 if got.loss_scaling => "f32 needs no loss scaling",
        Precision::Bf16 if got.param_dtype == DType::F16 => mistake(13, "bf16_fp16_swapped"),
        Precision::Fp16 if got.param_dtype == DType::BF16 => mistake(13, "bf16_fp16_swapped"),
        _ if got.reduce_dtype == DType::F32 && precision != Precision::Fp32 => mistake(13, "reduce_in_f32"),
        _ => "every dtype of the policy is the precision's own dtype",
    }
}

#[rstest]
fn each_precision_gets_its_policy(#[values(Precision::Fp32, Precision::Bf16, Precision::Fp16)] precision: Precision) {
    let got = mixed_precision_policy(precision);
    let want = expected(precision);
    assert!(got == want, "{precision}: got {got:?}\n expected {want:?}\nLikely cause: {}.", diagnose(precision, &got));
}
