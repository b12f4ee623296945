//! # Exercise 13: the mixed-precision policy
//!
//! Computing in 16 bits halves the memory of parameters, gradients and
//! activations and, on GPUs, multiplies matmul throughput. Two 16-bit formats:
//!
//! ```text
//!          sign  exponent  mantissa   range            precision
//! fp32      1       8        23       ~1e-38 .. 3e38    ~7 digits
//! bf16      1       8         7       ~1e-38 .. 3e38    ~2-3 digits
//! fp16      1       5        10       ~6e-8 .. 65504    ~3 digits
//! ```
//!
//! **Loss scaling** multiplies the loss by a large S before backward, which
//! by the chain rule multiplies every gradient by S, and divides the
//! gradients by S again in f32 before the optimizer uses them; a step whose
//! scaled gradients overflow to inf is skipped while S is halved. It moves
//! the gradients within a format's exponent range; it does nothing for a
//! short mantissa. Which of the three formats needs it follows from the table.
//!
//! A policy says which dtype each part uses (PyTorch FSDP's `MixedPrecision`):
//! - `param_dtype`: parameters are gathered and computed in it;
//! - `reduce_dtype`: gradients are reduced across ranks and accumulated in it;
//! - `buffer_dtype`: buffers (here the rotary cos/sin tables) are kept in it.
//!
//! This workbook's policy computes, reduces and keeps buffers in the chosen
//! precision (so gradients travel at 2 bytes, as in the ZeRO paper's
//! accounting); master weights, optimizer state, loss and norms stay f32
//! whatever the policy — the runtime sees to that.
//!
//! One gradient element of 1e-8, in fp16: it is under half the smallest
//! subnormal (about 6e-8), so it rounds to 0; with a loss scale of 65536 it
//! is 6.6e-4, which fp16 holds, and dividing by the scale in f32 gives back
//! 1e-8. What happens to the same element in bf16 and in f32?
//!
//! Read first: Micikevicius et al. 2018, "Mixed Precision Training"; PyTorch's
//! `torch.distributed.fsdp.MixedPrecision` and `torch.amp.GradScaler` docs.
//! Guide: `guide/src/phase3/13-mixed-precision.md`. Test: `cargo test exercise_13`.

use crate::parallel::fsdp::{MixedPrecisionPolicy, Precision};

/// The policy of `precision`: one dtype, the precision's own format, for
/// all three fields, and `loss_scaling` on exactly for the formats that
/// lose small gradients without it and keep them with it. Which formats
/// those are is yours to work out from the table above.
///
/// Dtypes are `candle_core::DType::{F32, BF16, F16}`.
pub fn mixed_precision_policy(precision: Precision) -> MixedPrecisionPolicy {
    let _ = &precision;
    todo!("Exercise 13: Mixed-precision policy; run `cargo xtask hint 13`")
}
