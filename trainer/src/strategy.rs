//! The two ways a run trains across ranks; the loop sees either through
//! [`workbook::train::Train`].

use workbook::parallel::fsdp::FsdpConfig;

/// How a run spreads over its ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Strategy {
    /// Phase 2: whole replicas, gradients all-reduced.
    Ddp,
    /// Phase 3: sharded units.
    Fsdp(FsdpConfig),
}
