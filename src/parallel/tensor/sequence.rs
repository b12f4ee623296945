//! Collectives along the sequence: sequence parallelism (exercise 27) keeps
//! each rank's chunk of the tokens, T/N of them, outside a block's split
//! matrices. A process group gathers and scatters along a tensor's first
//! dimension; these do it along T, the second of (B, T, C).

use candle_core::{Result, Tensor};

use crate::distributed::{ProcessGroup, ReduceOp};

/// Every rank's chunk (B, T/N, C) of the tokens, in rank order: (B, T, C),
/// the same on every rank. One all-gather.
pub fn gather_sequence(pg: &dyn ProcessGroup, chunk: &Tensor) -> Result<Tensor> {
    pg.all_gather(&chunk.transpose(0, 1)?.contiguous()?)?.transpose(0, 1)?.contiguous()
}

/// This rank's chunk (B, T/N, C) of the sum over the ranks of `t`, (B, T, C):
/// rank r gets tokens [r·T/N, (r+1)·T/N). One reduce-scatter.
pub fn scatter_sequence(pg: &dyn ProcessGroup, t: &Tensor) -> Result<Tensor> {
    pg.reduce_scatter(&t.transpose(0, 1)?.contiguous()?, ReduceOp::Sum)?.transpose(0, 1)?.contiguous()
}
