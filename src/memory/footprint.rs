//! What a run needs at the least, known before anything is allocated, so
//! that a model too large for the machine is an error and not an abort in
//! the allocator.

use crate::model::{param_specs, GptConfig};

/// The memory a run cannot do without, in bytes, by part.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Footprint {
    /// f32 parameters, their gradients and AdamW's two moments: 16 bytes per
    /// parameter, held once across the machine whatever the strategy.
    pub model_states: f64,
    /// The rotary cosine and sine tables, (max_seq_len, D) each in f32.
    pub rotary: f64,
    /// One layer's attention scores and their softmax, (B, H, T, T) in f32
    /// each, for the `micro_batch` sequences of `seq_len` tokens one rank runs.
    pub attention: f64,
}

impl Footprint {
    pub fn of(config: &GptConfig, micro_batch: usize, seq_len: usize) -> Self {
        let params = param_count(config);
        let f32_bytes = 4.0;
        Self {
            model_states: 4.0 * f32_bytes * params,
            rotary: 2.0 * f32_bytes * config.max_seq_len as f64 * config.head_dim() as f64,
            attention: 2.0 * f32_bytes * micro_batch as f64 * config.num_heads as f64 * (seq_len as f64).powi(2),
        }
    }

    pub fn total(&self) -> f64 {
        self.model_states + self.rotary + self.attention
    }
}

/// How many parameters a model of `config`'s shape has, counted without
/// listing them: one layer's count times the layers, so that an absurd
/// `num_layers` costs nothing to check (its list would not fit in memory),
/// and in `f64`, so that absurd widths cannot overflow.
fn param_count(config: &GptConfig) -> f64 {
    let with_layers = |num_layers| {
        let specs = param_specs(&GptConfig { num_layers, ..config.clone() });
        specs.iter().map(|s| s.shape.dims().iter().map(|&d| d as f64).product::<f64>()).sum::<f64>()
    };
    let (one, two) = (with_layers(1), with_layers(2));
    one + (two - one) * (config.num_layers as f64 - 1.0)
}

/// The memory the operating system says new allocations can have, in bytes
/// (`MemAvailable` on Linux); `None` where it does not say.
pub fn available_memory() -> Option<f64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024.0)
}
