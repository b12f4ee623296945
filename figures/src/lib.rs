//! The workbook's figures, drawn as SVG from what its runs recorded: a run's
//! loss curve, and the guide's pictures (pipeline schedules, the FSDP
//! timeline, the ring's steps, memory per rank). Every figure is a pure
//! function of its data, so a figure committed to the guide can be checked
//! against what its data draws today.

pub mod catalog;
mod lanes;
pub mod loss;
mod megatron;
mod pipeline;
mod ranks;
mod ring;
mod style;
mod trace;
mod zero;
