//! What a run needs at the least, known before anything is allocated, so
//! that a model too large for the machine is an error and not an abort in
//! the allocator.

use crate::model::{param_specs, GptConfig};

/// The sizes a run multiplies its memory by, as the command line sets them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunShape {
    /// Sequences one rank runs per micro-batch (`--batch-size` over the
    /// data-parallel ranks); evaluation reads batches of the same size.
    pub micro_batch: usize,
    /// Tokens per sequence (`--seq-len`).
    pub seq_len: usize,
    /// Micro-batches per optimizer step (`--grad-accum`), whose tokens a
    /// step holds at once.
    pub grad_accum: usize,
    /// Ranks that run on this machine and share its memory.
    pub ranks_here: usize,
}

/// The memory a run cannot do without on one machine, in bytes, by part.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Footprint {
    /// f32 parameters, their gradients and AdamW's two moments: 16 bytes per
    /// parameter, held once across the machine whatever the strategy.
    pub model_states: f64,
    /// The rotary cosine and sine tables, (max_seq_len, D) each in f32, on
    /// every rank here.
    pub rotary: f64,
    /// One layer's attention scores and their softmax, (B, H, T, T) in f32
    /// each, for the micro-batch each rank here runs.
    pub attention: f64,
    /// The token ids of one step's micro-batches, (B, T + 1) in u32 each
    /// with the few hundred bytes a tensor costs besides, on every rank here.
    pub batches: f64,
}

/// What a tensor costs besides its elements (its shape, strides and
/// storage handles), at the least.
const TENSOR_OVERHEAD_BYTES: f64 = 128.0;

impl Footprint {
    pub fn of(config: &GptConfig, run: RunShape) -> Self {
        let params = param_count(config);
        let (f32_bytes, u32_bytes) = (4.0, 4.0);
        let ranks = run.ranks_here as f64;
        let micro_batch = run.micro_batch as f64;
        let tokens_per_batch = micro_batch * (run.seq_len as f64 + 1.0);
        Self {
            model_states: 4.0 * f32_bytes * params,
            rotary: ranks * 2.0 * f32_bytes * config.max_seq_len as f64 * config.head_dim() as f64,
            attention: ranks * 2.0 * f32_bytes * micro_batch * config.num_heads as f64 * (run.seq_len as f64).powi(2),
            batches: ranks * run.grad_accum as f64 * (u32_bytes * tokens_per_batch + TENSOR_OVERHEAD_BYTES),
        }
    }

    pub fn total(&self) -> f64 {
        self.model_states + self.rotary + self.attention + self.batches
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
