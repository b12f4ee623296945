//! The ways a run trains across ranks; the loop sees each through
//! [`workbook::train::Train`].

use workbook::parallel::fsdp::FsdpConfig;
use workbook::parallel::pipeline::PipelineSchedule;

/// How a run spreads over its ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Strategy {
    /// Phase 2: whole replicas, gradients all-reduced.
    Ddp,
    /// Phase 3: sharded units.
    Fsdp(FsdpConfig),
    /// Phase 4: the blocks cut into one pipeline stage per rank, stepped on
    /// GPipe's schedule (exercise 21) or 1F1B's (exercise 24).
    Pipeline(PipelineSchedule),
}

impl Strategy {
    /// How many ranks split the data among them, of `nproc`: all of them,
    /// except in a pipeline, whose stages all read the same batch.
    pub fn data_parallel_size(self, nproc: usize) -> usize {
        match self {
            Strategy::Pipeline(_) => 1,
            Strategy::Ddp | Strategy::Fsdp(_) => nproc,
        }
    }
}
