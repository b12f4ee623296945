//! Reference solution of exercise 13: the mixed-precision policy of a precision.

use candle_core::DType;

use crate::parallel::fsdp::{MixedPrecisionPolicy, Precision};

pub fn mixed_precision_policy(precision: Precision) -> MixedPrecisionPolicy {
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
