//! Autograd machinery candle does not ship: recomputation for activation checkpointing.

mod recompute;

pub use recompute::{accumulate, vjp, Recompute};
