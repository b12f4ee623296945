//! Exercise 13: the mixed-precision policy. The expected policies follow
//! PyTorch's `MixedPrecision` and the bf16/fp16 formats. Training with them
//! (bf16 tracking fp32, fp16 skipping overflows) is a whole-phase check
//! (`phase_3.rs`): it needs exercise 14 as well.

use candle_core::DType;
use rstest::rstest;
use workbook::parallel::fsdp::{MixedPrecisionPolicy, Precision};
use workbook::phase3_fsdp::mixed_precision_policy;

use crate::support::{cause, field_differences, mistake};

pub fn expected(precision: Precision) -> MixedPrecisionPolicy {
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

/// The mistake `got` shows for `precision`, if it is a known one.
fn diagnose(precision: Precision, got: &MixedPrecisionPolicy) -> Option<&'static str> {
    let id = match precision {
        Precision::Fp16 if !got.loss_scaling => "fp16_unscaled",
        Precision::Bf16 if got.loss_scaling => "bf16_scaled",
        Precision::Bf16 if got.param_dtype == DType::F16 => "bf16_fp16_swapped",
        Precision::Fp16 if got.param_dtype == DType::BF16 => "bf16_fp16_swapped",
        _ if got.reduce_dtype == DType::F32 && precision != Precision::Fp32 => "reduce_in_f32",
        _ => return None,
    };
    Some(mistake(13, id))
}

/// The fields in which two policies differ.
fn differences(got: &MixedPrecisionPolicy, want: &MixedPrecisionPolicy) -> String {
    let dtypes = field_differences(&[
        ("param_dtype", got.param_dtype, want.param_dtype),
        ("reduce_dtype", got.reduce_dtype, want.reduce_dtype),
        ("buffer_dtype", got.buffer_dtype, want.buffer_dtype),
    ]);
    let scaling = field_differences(&[("loss_scaling", got.loss_scaling, want.loss_scaling)]);
    [dtypes, scaling].into_iter().filter(|d| !d.is_empty()).collect::<Vec<_>>().join("; ")
}

#[rstest]
fn each_precision_gets_its_policy(#[values(Precision::Fp32, Precision::Bf16, Precision::Fp16)] precision: Precision) {
    let got = mixed_precision_policy(precision);
    let want = expected(precision);
    assert!(got == want, "{precision}: {}.{}", differences(&got, &want), cause(diagnose(precision, &got)));
}
