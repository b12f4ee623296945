//! The workbook's figures, drawn as SVG from what its runs recorded: a run's
//! loss curve, and the guide's pictures (pipeline schedules, the FSDP
//! timeline, the ring's steps, ZeRO's optimizer step, memory per rank, the
//! device mesh); a few derived from rules alone (the schedules one slot per
//! pass, the sequence-parallel block, the bits of the float formats); and
//! the measured numbers the guide's chapters quote. Every figure and number
//! file is a pure function of its data, so one committed to the guide can
//! be checked against what its data gives today.

mod bars;
pub mod catalog;
mod diagram;
mod formats;
mod lanes;
pub mod loss;
mod megatron;
mod mesh;
mod mixed_memory;
pub mod numbers;
mod pipeline;
mod ranks;
mod ring;
mod schedule;
mod sequence;
mod spike;
mod style;
mod trace;
mod zero;
mod zero_flow;
