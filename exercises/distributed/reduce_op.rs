//! How a reducing collective combines the ranks' tensors.

use std::fmt;

use candle_core::{bail, DType, Result, Tensor};

/// The combination an `all_reduce` or `reduce_scatter` applies elementwise
/// across ranks (NCCL's `ncclRedOp_t`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ReduceOp {
    /// `t₀ + t₁ + ... + t_{N-1}` (NCCL: `ncclSum`).
    #[default]
    Sum,
    /// The sum divided by the world size (NCCL: `ncclAvg`): what gradient
    /// averaging in data parallelism needs.
    Avg,
}

impl fmt::Display for ReduceOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Avg => "avg",
        })
    }
}

/// Reduces one tensor per rank, given in rank order, into an f32 tensor.
///
/// Floating-point addition is not associative: summing in a fixed order, in
/// f32 whatever the inputs' dtype, is what makes the result the same on every
/// rank and in every run (and keeps bf16 gradients from losing their small
/// contributions along the way).
pub(crate) fn reduce(inputs: &[Tensor], op: ReduceOp) -> Result<Tensor> {
    let Some((first, rest)) = inputs.split_first() else {
        bail!("reduce: no tensors to reduce");
    };
    let mut total = first.to_dtype(DType::F32)?;
    for t in rest {
        total = (total + t.to_dtype(DType::F32)?)?;
    }
    match op {
        ReduceOp::Sum => Ok(total),
        ReduceOp::Avg => total / inputs.len() as f64,
    }
}

/// The dtypes a reduction accepts: those that survive a trip through f32.
pub(crate) fn check_reducible(collective: &str, dtype: DType) -> Result<()> {
    match dtype {
        DType::F32 | DType::BF16 | DType::F16 => Ok(()),
        other => bail!(
            "{collective} reduces f32, bf16 or f16 tensors, got {}: convert it first",
            other.as_str()
        ),
    }
}
