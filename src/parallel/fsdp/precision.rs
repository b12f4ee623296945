//! Mixed precision: the precisions a run can choose, the policy each implies
//! (exercise 13), and the dynamic loss scaling that fp16 needs.

use std::fmt;
use std::str::FromStr;

use candle_core::{DType, Result};
use serde::{Deserialize, Serialize};

/// The precision a run computes in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Precision {
    Fp32,
    Bf16,
    Fp16,
}

impl Precision {
    pub const ALL: [Precision; 3] = [Self::Fp32, Self::Bf16, Self::Fp16];

    pub fn name(self) -> &'static str {
        match self {
            Self::Fp32 => "fp32",
            Self::Bf16 => "bf16",
            Self::Fp16 => "fp16",
        }
    }
}

impl fmt::Display for Precision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Precision {
    type Err = candle_core::Error;

    fn from_str(s: &str) -> Result<Self> {
        Self::ALL
            .into_iter()
            .find(|p| p.name() == s.to_ascii_lowercase())
            .ok_or_else(|| candle_core::Error::Msg(format!("unknown precision `{s}`: use fp32, bf16 or fp16")))
    }
}

/// Which dtype each part of a step uses, as PyTorch FSDP's `MixedPrecision`
/// says it, plus whether the loss must be scaled. Master weights, optimizer
/// state, the loss and norms stay f32 whatever the policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MixedPrecisionPolicy {
    /// The dtype parameters are gathered and computed in.
    pub param_dtype: DType,
    /// The dtype gradients are reduced across ranks and accumulated in.
    pub reduce_dtype: DType,
    /// The dtype of buffers (here: the rotary cos/sin tables).
    pub buffer_dtype: DType,
    /// Whether the loss is multiplied by a dynamic scale before backward, so
    /// that small gradients do not underflow.
    pub loss_scaling: bool,
}

impl MixedPrecisionPolicy {
    /// Everything in f32: no mixed precision at all.
    pub fn f32() -> Self {
        Self { param_dtype: DType::F32, reduce_dtype: DType::F32, buffer_dtype: DType::F32, loss_scaling: false }
    }

    /// This policy with gradients reduced and accumulated in f32, whatever
    /// it computes in (PyTorch: `MixedPrecision(param_dtype=torch.bfloat16,
    /// reduce_dtype=torch.float32)`): twice a 16-bit reduce's gradient
    /// traffic and memory, and none of its rounding as the ranks' gradients
    /// add up.
    pub fn reducing_in_f32(self) -> Self {
        Self { reduce_dtype: DType::F32, ..self }
    }
}

/// Dynamic loss scaling, as PyTorch's `GradScaler` does it: multiply the loss
/// by `scale` before backward; when a gradient overflows, skip the step and
/// halve the scale; after `growth_interval` good steps in a row, double it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct LossScaler {
    pub scale: f64,
    pub growth_interval: u32,
    good_steps: u32,
}

impl Default for LossScaler {
    /// PyTorch's defaults: 2^16, doubled after 2000 good steps.
    fn default() -> Self {
        Self::new(65536.0, 2000)
    }
}

impl LossScaler {
    pub fn new(scale: f64, growth_interval: u32) -> Self {
        Self { scale, growth_interval, good_steps: 0 }
    }

    /// Adjusts the scale after a step whose gradients did (`overflowed`) or
    /// did not hold an inf or NaN.
    pub fn update(&mut self, overflowed: bool) {
        if overflowed {
            self.scale /= 2.0;
            self.good_steps = 0;
        } else {
            self.good_steps += 1;
            if self.good_steps >= self.growth_interval {
                self.scale *= 2.0;
                self.good_steps = 0;
            }
        }
    }
}
