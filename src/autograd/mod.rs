//! Autograd machinery candle does not ship: gradients kept by parameter name
//! across backward passes, and recomputation for activation checkpointing.

mod gradients;
mod recompute;

pub use gradients::{clip_factor, gradient_of, sum_of_squares, take_gradient_of, Gradients};
pub use recompute::{accumulate, vjp, Checkpointed, Recompute};
