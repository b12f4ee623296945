//! Collectives along the sequence: sequence parallelism (exercise 27) keeps
//! each rank's chunk of the tokens, T/N of them, outside a block's split
//! matrices. A process group gathers and scatters along a tensor's first
//! dimension; these do it along T, the second of (B, T, C).
//!
//! [`gather_sequence`] and [`scatter_sequence`] record nothing; exercise 27
//! gives them their backward. [`split_tokens`] and [`join_tokens`] are where
//! a pipeline stage's whole activations enter and leave the chunks: there
//! every rank holds the same whole tensor, and the same whole gradient.

use candle_core::{bail, Result, Tensor};

use crate::autograd::with_backward;
use crate::distributed::{ProcessGroup, ReduceOp, SharedGroup};

/// Every rank's chunk (B, T/N, C) of the tokens, in rank order: (B, T, C),
/// the same on every rank. One all-gather.
pub fn gather_sequence(pg: &dyn ProcessGroup, chunk: &Tensor) -> Result<Tensor> {
    pg.all_gather(&chunk.transpose(0, 1)?.contiguous()?)?.transpose(0, 1)?.contiguous()
}

/// This rank's chunk (B, T/N, C) of the sum over the ranks of `t`, (B, T, C):
/// rank r gets tokens [r·T/N, (r+1)·T/N). One reduce-scatter.
pub fn scatter_sequence(pg: &dyn ProcessGroup, t: &Tensor) -> Result<Tensor> {
    let (ranks, seq_len) = (pg.world_size(), t.dim(1)?);
    if !seq_len.is_multiple_of(ranks) {
        bail!(
            "scatter_sequence cuts T, dimension 1 of (B, T, C), into {ranks} chunks, one per rank, and got a \
             tensor of shape {:?}, whose {seq_len} tokens do not divide by {ranks}: it takes every token, \
             (B, T, C), and gives this rank's chunk, (B, T/N, C)",
            t.dims()
        );
    }
    pg.reduce_scatter(&t.transpose(0, 1)?.contiguous()?, ReduceOp::Sum)?.transpose(0, 1)?.contiguous()
}

/// This rank's chunk of `t` (B, T, C), the same whole tensor on every rank
/// of `tp`; backward puts the ranks' chunks of the gradient together (one
/// all-gather), the whole gradient of `t` on every rank.
pub fn split_tokens(tp: &SharedGroup, t: &Tensor) -> Result<Tensor> {
    let back = tp.clone();
    with_backward(t, &own_tokens(tp, t)?, move |grad| gather_sequence(&back, grad))
}

/// This rank's chunk of the tokens of `t`, (B, T, C): tokens
/// [r·T/N, (r+1)·T/N) on rank r of `pg`. Records nothing.
pub fn own_tokens(pg: &dyn ProcessGroup, t: &Tensor) -> Result<Tensor> {
    let (rank, ranks, seq_len) = (pg.rank(), pg.world_size(), t.dim(1)?);
    if !seq_len.is_multiple_of(ranks) {
        bail!(
            "--sequence-parallel cuts each sequence into {ranks} chunks, one per tensor-parallel rank, and \
             {seq_len} tokens do not split into {ranks}: use a --seq-len that {ranks} divides"
        );
    }
    t.narrow(1, rank * seq_len / ranks, seq_len / ranks)
}

/// Every rank's chunk put together, (B, T, C), the same on every rank of
/// `tp`, for work every rank repeats whole (the next stage, the head);
/// backward keeps this rank's chunk of the gradient, which every rank holds
/// whole.
pub fn join_tokens(tp: &SharedGroup, chunk: &Tensor) -> Result<Tensor> {
    let (rank, len) = (tp.rank(), chunk.dim(1)?);
    with_backward(chunk, &gather_sequence(tp, chunk)?, move |grad| grad.narrow(1, rank * len, len))
}
