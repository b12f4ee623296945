//! Autograd machinery candle does not ship: gradients kept by parameter name
//! across backward passes, recomputation for activation checkpointing, and
//! a value recorded with the backward its caller names ([`with_backward`]),
//! how a collective enters the graph.

mod gradients;
mod recompute;

pub use gradients::{clip_factor, gradient_of, sum_of_squares, take_gradient_of, Gradients};
pub use recompute::{accumulate, vjp, Checkpointed, Recompute};

pub use crate::kernels::with_backward;
