//! `estimate`: memory per GPU for training a model, by component, for a
//! sharding strategy and a number of GPUs — the arithmetic behind choosing
//! DDP or a ZeRO stage, without running anything.
//!
//! Model states, per parameter (Ψ parameters, N GPUs; Rajbhandari et al. 2019):
//!
//! ```text
//!                         parameters  gradients  optimizer (AdamW)
//! fp32                         4          4       8  (m, v)
//! bf16/fp16 mixed precision    2          2      12  (fp32 master copy, m, v)
//! ```
//!
//! DDP keeps all of it on every GPU (16Ψ bytes with mixed-precision AdamW);
//! ZeRO-1 shards the optimizer state (4Ψ + 12Ψ/N), ZeRO-2 the gradients too
//! (2Ψ + 14Ψ/N), ZeRO-3 the parameters too (16Ψ/N).
//!
//! Activations per transformer layer, in 16-bit (Korthikanti et al. 2022, no
//! tensor parallelism): `s·b·h·(34 + 5·a·s/h)` bytes for sequence s, micro-batch
//! b, width h and a heads. With full activation checkpointing a layer keeps only
//! its input, `2·s·b·h` bytes, and one layer's activations are rebuilt at a time.
//! The logits add `4·b·s·V` bytes in fp32. Estimates for a GPT-style block;
//! a real run adds framework buffers and fragmentation.

use std::fmt;

use anyhow::{bail, Result};

/// How the model states are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Precision {
    Fp32,
    Bf16,
    Fp16,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Optimizer {
    /// Two moments per parameter.
    Adamw,
    /// One momentum buffer per parameter.
    Sgd,
}

/// What is sharded across the GPUs. FSDP's names are accepted too.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Strategy {
    /// Nothing sharded: every GPU holds everything (FSDP NO_SHARD).
    #[value(alias = "no_shard")]
    Ddp,
    /// Optimizer state sharded (ZeRO stage 1).
    Zero1,
    /// Optimizer state and gradients sharded (ZeRO stage 2, FSDP SHARD_GRAD_OP).
    #[value(alias = "shard_grad_op")]
    Zero2,
    /// Optimizer state, gradients and parameters sharded (ZeRO stage 3, FSDP FULL_SHARD).
    #[value(alias = "full_shard")]
    Zero3,
}

impl Strategy {
    pub const ALL: [Strategy; 4] = [Strategy::Ddp, Strategy::Zero1, Strategy::Zero2, Strategy::Zero3];
}

impl fmt::Display for Strategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Strategy::Ddp => "DDP (NO_SHARD)",
            Strategy::Zero1 => "ZeRO-1",
            Strategy::Zero2 => "ZeRO-2 (SHARD_GRAD_OP)",
            Strategy::Zero3 => "ZeRO-3 (FULL_SHARD)",
        })
    }
}

/// Everything the estimate depends on.
#[derive(Debug, Clone)]
pub struct Setup {
    pub params: f64,
    pub layers: usize,
    pub hidden: usize,
    pub heads: usize,
    pub vocab: usize,
    pub seq_len: usize,
    /// Sequences per GPU per micro-batch.
    pub micro_batch: usize,
    pub precision: Precision,
    pub optimizer: Optimizer,
    pub strategy: Strategy,
    pub gpus: usize,
    pub activation_checkpointing: bool,
}

/// Bytes per GPU, by component.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Estimate {
    pub parameters: f64,
    pub gradients: f64,
    pub optimizer: f64,
    pub activations: f64,
}

impl Estimate {
    pub fn model_states(&self) -> f64 {
        self.parameters + self.gradients + self.optimizer
    }

    pub fn total(&self) -> f64 {
        self.model_states() + self.activations
    }
}

/// Parameters of a GPT-style model: 12·L·h² in the blocks (a 4h MLP, or a
/// SwiGLU MLP of width 8h/3) plus an embedding and an untied head of V·h each.
pub fn count_params(layers: usize, hidden: usize, vocab: usize) -> f64 {
    let (l, h, v) = (layers as f64, hidden as f64, vocab as f64);
    12.0 * l * h * h + 2.0 * v * h
}

pub fn estimate(s: &Setup) -> Result<Estimate> {
    if s.gpus == 0 || s.heads == 0 || s.hidden == 0 {
        bail!("--gpus, --heads and --hidden must be at least 1");
    }
    let n = s.gpus as f64;
    let mixed = s.precision != Precision::Fp32;
    let (param_bytes, grad_bytes) = if mixed { (2.0, 2.0) } else { (4.0, 4.0) };
    let moments = match s.optimizer {
        Optimizer::Adamw => 8.0,
        Optimizer::Sgd => 4.0,
    };
    let optimizer_bytes = moments + if mixed { 4.0 } else { 0.0 }; // + the fp32 master copy
    let (p_shard, g_shard, o_shard) = match s.strategy {
        Strategy::Ddp => (1.0, 1.0, 1.0),
        Strategy::Zero1 => (1.0, 1.0, n),
        Strategy::Zero2 => (1.0, n, n),
        Strategy::Zero3 => (n, n, n),
    };
    Ok(Estimate {
        parameters: s.params * param_bytes / p_shard,
        gradients: s.params * grad_bytes / g_shard,
        optimizer: s.params * optimizer_bytes / o_shard,
        activations: activations(s),
    })
}

fn activations(s: &Setup) -> f64 {
    let (sq, b, h, a, l) = (s.seq_len as f64, s.micro_batch as f64, s.hidden as f64, s.heads as f64, s.layers as f64);
    // The formula counts 16-bit activations; fp32 doubles every tensor.
    let width = if s.precision == Precision::Fp32 { 2.0 } else { 1.0 };
    let full_layer = sq * b * h * (34.0 + 5.0 * a * sq / h) * width;
    let kept = if s.activation_checkpointing { l * 2.0 * sq * b * h * width + full_layer } else { l * full_layer };
    let logits = 4.0 * b * sq * s.vocab as f64;
    kept + logits
}

/// Prints the estimate of `setup` and the totals of every strategy beside it.
pub fn report(setup: &Setup, gpu_memory_gb: Option<f64>) -> Result<bool> {
    let gb = |bytes: f64| bytes / 1e9;
    let e = estimate(setup)?;
    println!(
        "{:.2}B parameters, {:?}, {:?}, {} on {} GPU(s), micro-batch {} x {} tokens{}",
        setup.params / 1e9,
        setup.precision,
        setup.optimizer,
        setup.strategy,
        setup.gpus,
        setup.micro_batch,
        setup.seq_len,
        if setup.activation_checkpointing { ", activation checkpointing" } else { "" }
    );
    for (name, bytes) in [
        ("parameters", e.parameters),
        ("gradients", e.gradients),
        ("optimizer state", e.optimizer),
        ("activations", e.activations),
        ("total per GPU", e.total()),
    ] {
        println!("  {name:<16} {:>10.2} GB", gb(bytes));
    }
    println!("\n  every strategy, model states + activations per GPU:");
    for strategy in Strategy::ALL {
        let other = estimate(&Setup { strategy, ..setup.clone() })?;
        println!("  {:<24} {:>10.2} GB", strategy.to_string(), gb(other.total()));
    }
    let Some(capacity) = gpu_memory_gb else { return Ok(true) };
    let fits = gb(e.total()) <= capacity;
    println!("\n{} in {capacity:.0} GB of GPU memory", if fits { "fits" } else { "does not fit" });
    Ok(fits)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Figure 1 of the ZeRO paper: Ψ = 7.5B, N = 64, mixed-precision Adam.
    fn zero_paper(strategy: Strategy) -> Setup {
        Setup {
            params: 7.5e9,
            layers: 1,
            hidden: 1,
            heads: 1,
            vocab: 0,
            seq_len: 0,
            micro_batch: 0,
            precision: Precision::Bf16,
            optimizer: Optimizer::Adamw,
            strategy,
            gpus: 64,
            activation_checkpointing: false,
        }
    }

    #[test]
    fn model_states_match_the_zero_paper() {
        for (strategy, paper_gb) in
            [(Strategy::Ddp, 120.0), (Strategy::Zero1, 31.4), (Strategy::Zero2, 16.6), (Strategy::Zero3, 1.9)]
        {
            let gb = estimate(&zero_paper(strategy)).unwrap().model_states() / 1e9;
            assert!((gb - paper_gb).abs() < 0.05, "{strategy}: {gb:.2} GB, the paper says {paper_gb} GB");
        }
    }

    #[test]
    fn fp32_adamw_needs_16_bytes_per_parameter_without_a_master_copy() {
        let setup = Setup { precision: Precision::Fp32, gpus: 1, ..zero_paper(Strategy::Ddp) };
        assert_eq!(estimate(&setup).unwrap().model_states(), 16.0 * 7.5e9);
    }

    #[test]
    fn checkpointing_keeps_one_input_per_layer() {
        let setup =
            Setup { layers: 24, hidden: 1024, heads: 16, seq_len: 1024, micro_batch: 8, ..zero_paper(Strategy::Ddp) };
        let full = activations(&setup);
        let checkpointed = activations(&Setup { activation_checkpointing: true, ..setup.clone() });
        let layer = 1024.0 * 8.0 * 1024.0 * (34.0 + 5.0 * 16.0);
        assert_eq!(full, 24.0 * layer);
        assert_eq!(checkpointed, 24.0 * 2.0 * 1024.0 * 8.0 * 1024.0 + layer);
    }

    #[test]
    fn gpt2_small_has_about_124m_parameters() {
        let gpt2 = count_params(12, 768, 50257) - 50257.0 * 768.0; // GPT-2 ties its head to the embedding
        assert!((gpt2 / 1e6 - 124.0).abs() < 2.0, "{gpt2}");
    }
}
