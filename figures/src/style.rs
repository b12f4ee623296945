//! The colours and sizes every figure shares, so that a forward pass or a
//! collective looks the same on every page.

use plotters::style::RGBColor;

/// Computing forward.
pub const FORWARD: RGBColor = RGBColor(0x4c, 0x78, 0xa8);
/// Computing backward.
pub const BACKWARD: RGBColor = RGBColor(0xf5, 0x85, 0x18);
/// Communication.
pub const COMM: RGBColor = RGBColor(0x54, 0xa2, 0x4b);
/// Communication that reduces (reduce-scatter, all-reduce).
pub const REDUCE: RGBColor = RGBColor(0x17, 0x6d, 0x5a);
/// Anything else that takes time (a step's optimizer update, a save).
pub const OTHER: RGBColor = RGBColor(0x9d, 0x75, 0x5d);
/// Idle time: a pipeline's bubble.
pub const IDLE: RGBColor = RGBColor(0xe4, 0xe4, 0xe4);
/// A second series beside the first (the learning rate beside the loss).
pub const SECOND: RGBColor = RGBColor(0xb2, 0x79, 0xa2);

pub const FONT: &str = "sans-serif";
/// The guide's text column is about 750 px wide.
pub const WIDTH: u32 = 720;
