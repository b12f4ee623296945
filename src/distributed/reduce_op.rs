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

/// Reduces one tensor per rank, given in rank order, in their own dtype.
///
/// Floating-point addition is not associative: summing in a fixed order is
/// what makes the result the same on every rank and in every run. The sum
/// stays in the inputs' dtype, as NCCL's does, so bf16 gradients reduced in
/// bf16 are rounded at every addition: the precision that a mixed-precision
/// policy's `reduce_dtype` trades for halved traffic.
pub(crate) fn reduce(inputs: &[Tensor], op: ReduceOp) -> Result<Tensor> {
    let Some((first, rest)) = inputs.split_first() else {
        bail!("reduce: no tensors to reduce");
    };
    let mut total = first.clone();
    for t in rest {
        total = (total + t)?;
    }
    finish(total, op, inputs.len())
}

/// Applies what is left of `op` once the sum over `world_size` ranks is done.
pub(crate) fn finish(sum: Tensor, op: ReduceOp, world_size: usize) -> Result<Tensor> {
    match op {
        ReduceOp::Sum => Ok(sum),
        ReduceOp::Avg => sum / world_size as f64,
    }
}

/// The dtypes a reduction accepts: those that survive a trip through f32.
pub(crate) fn check_reducible(collective: &str, dtype: DType) -> Result<()> {
    match dtype {
        DType::F32 | DType::BF16 | DType::F16 => Ok(()),
        other => bail!("{collective} reduces f32, bf16 or f16 tensors, got {}: convert it first", other.as_str()),
    }
}
