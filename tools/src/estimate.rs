//! `estimate`: memory per GPU for training the workbook's model, by component,
//! for a sharding strategy and a number of GPUs — the arithmetic behind
//! choosing DDP or a ZeRO stage, without running anything. Each component is
//! one the FSDP runtime's ledger measures (`trainer`'s `ledger` binary,
//! `cargo xtask bench fsdp`), and the formulas are checked against it below.
//!
//! Parameters Ψ of the workbook's Llama-style GPT (`param_specs` in
//! src/model/params.rs), for L layers, width C, SwiGLU width I, vocabulary V:
//! `L·(4C² + 3CI + 2C) + 2VC + C` (q, k, v, o; gate, up, down; two RMSNorm
//! scales; the embedding and the untied head; the final norm).
//!
//! Model states, per parameter (N GPUs; Rajbhandari et al. 2019):
//!
//! ```text
//!                         parameters  gradients  optimizer (AdamW)
//! fp32                         4          4       8  (m, v)
//! bf16/fp16 mixed precision    2          2      12  (fp32 master copy, m, v)
//! ```
//!
//! The master copy is reported apart from the moments, as the ledger's
//! `master_params` is, and sharded with them.
//!
//! DDP keeps all of it on every GPU (16Ψ bytes with mixed-precision AdamW);
//! ZeRO-1 shards the optimizer state (4Ψ + 12Ψ/N), ZeRO-2 the gradients too
//! (2Ψ + 14Ψ/N), ZeRO-3 the parameters too (16Ψ/N).
//!
//! Activations are what the forward pass leaves allocated for backward.
//! candle's autograd graph keeps every tensor the forward made, not only the
//! ones backward reads, so they are counted tensor by tensor as the
//! workbook's model makes them ([`block_bytes`], [`outer_bytes`]). Per block,
//! for B sequences of T tokens and H heads:
//!
//! ```text
//! fp32   B·T·(116·C + 16·I + 40) + 8·B·H·T² + T²
//! bf16   B·T·(86·C + 8·I + 40) + 4·B·H·T² + T²     (RMSNorm computes in f32)
//! ```
//!
//! and outside the blocks the embedding's output, the final norm and the
//! logits, B·T·V in the compute dtype, which the loss copies to f32 in 16-bit.
//! Megatron-LM's kernels save only what backward reads: Korthikanti et al.
//! (2022) count `T·B·C·(34 + 5·H·T/C)` 16-bit bytes per layer for it, about
//! two thirds of this at Llama-7B's shape.
//!
//! With activation checkpointing a block keeps only its input, B·T·C, and
//! backward rebuilds one block at a time: that block is reported apart, as
//! `recompute`.
//!
//! Counted for the workbook's fused kernels, which run on the CPU and, in f32,
//! on a GPU. In other dtypes on a GPU, or with `WORKBOOK_CUDA_KERNELS=composed`,
//! candle's composed ops run instead and keep more (seven (B, H, T, T) tensors
//! for the masked softmax instead of two): read the activations there as a
//! floor. Not counted anywhere, though peak resident memory includes
//! them: the temporaries of backward (activation gradients; each parameter's
//! gradient, padded to its FSDP unit's flat length before it reaches the
//! gradient buffer) and of the optimizer step (a new tensor per AdamW
//! operation), and the freed memory the allocator keeps for reuse. At GPT-2
//! small's shape on the CPU (B = 2, T = 256, fp32) this counts 3.7 GB; the
//! peak resident memory was 5.1 GB under the DDP trainer and 7.7 GB under
//! FSDP's NO_SHARD, whose flat buffers make larger temporaries.

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

impl Precision {
    /// Bytes per element of the dtype the forward pass computes in.
    fn compute_bytes(self) -> f64 {
        match self {
            Precision::Fp32 => 4.0,
            Precision::Bf16 | Precision::Fp16 => 2.0,
        }
    }
}

/// Everything the estimate depends on.
#[derive(Debug, Clone)]
pub struct Setup {
    pub params: f64,
    pub layers: usize,
    pub hidden: usize,
    /// The SwiGLU MLP's width (see [`llama_intermediate`]).
    pub intermediate: usize,
    pub heads: usize,
    pub vocab: usize,
    pub seq_len: usize,
    /// Sequences per GPU per micro-batch.
    pub micro_batch: usize,
    pub precision: Precision,
    pub optimizer: Optimizer,
    pub strategy: Strategy,
    pub gpus: usize,
    /// Tensor-parallel ranks each block is split across (Megatron's; 1: none).
    pub tp: usize,
    /// Pipeline stages the blocks are cut into (1: none); the other
    /// `gpus / (tp · pp)` ranks are data-parallel, and ZeRO shards across them.
    pub pp: usize,
    pub activation_checkpointing: bool,
}

/// Bytes per GPU, by component.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Estimate {
    pub parameters: f64,
    pub gradients: f64,
    /// The f32 master weights mixed precision keeps beside its 16-bit
    /// parameters; 0 in fp32, where the parameters are their own master.
    pub master: f64,
    /// The optimizer's moments (AdamW's m and v, SGD's momentum).
    pub optimizer: f64,
    /// What the forward pass leaves for backward, as the ledger measures it.
    pub activations: f64,
    /// Under activation checkpointing, the one block backward rebuilds at a time; 0 without.
    pub recompute: f64,
}

impl Estimate {
    pub fn model_states(&self) -> f64 {
        self.parameters + self.gradients + self.master + self.optimizer
    }

    pub fn total(&self) -> f64 {
        self.model_states() + self.activations + self.recompute
    }
}

/// Llama's SwiGLU width for a model of width `hidden`: 8h/3 rounded up to a
/// multiple of 256. It gives Llama-7B's 11008 and the small and medium
/// configs' widths; the tiny config picks its own (352).
pub fn llama_intermediate(hidden: usize) -> usize {
    (8 * hidden / 3).div_ceil(256) * 256
}

/// Parameters of the workbook's GPT without biases or grouped-query attention,
/// as the configs have it: exactly what `param_specs` lists.
pub fn model_params(layers: usize, hidden: usize, intermediate: usize, vocab: usize) -> f64 {
    let (l, c, i, v) = (layers as f64, hidden as f64, intermediate as f64, vocab as f64);
    let attention = 4.0 * c * c; // q, k, v, o: (C, C) each
    let mlp = 3.0 * c * i; // gate, up: (I, C); down: (C, I)
    let norms = 2.0 * c; // before attention and before the MLP
    l * (attention + mlp + norms) + 2.0 * v * c + c // embedding, untied head, final norm
}

/// Bytes per GPU of `s`: of the first pipeline stage's GPUs when there are
/// stages (it holds the most micro-batches in flight under 1F1B).
pub fn estimate(s: &Setup) -> Result<Estimate> {
    if s.gpus == 0 || s.heads == 0 || s.hidden == 0 || s.tp == 0 || s.pp == 0 {
        bail!("--gpus, --heads, --hidden, --tp and --pp must be at least 1");
    }
    if !s.gpus.is_multiple_of(s.tp * s.pp) {
        bail!(
            "{} GPUs do not make whole replicas of tp {} × pp {}: use a multiple of {}",
            s.gpus,
            s.tp,
            s.pp,
            s.tp * s.pp
        );
    }
    if !s.heads.is_multiple_of(s.tp) || !s.intermediate.is_multiple_of(s.tp) {
        bail!("tp {} must divide the {} heads and the MLP's {} units", s.tp, s.heads, s.intermediate);
    }
    if s.pp > s.layers {
        bail!("pp {} is more stages than the {} layers", s.pp, s.layers);
    }
    let n = (s.gpus / (s.tp * s.pp)) as f64; // the data-parallel ranks ZeRO shards across
    let held = s.params * held_fraction(s);
    let mixed = s.precision != Precision::Fp32;
    let (param_bytes, grad_bytes) = if mixed { (2.0, 2.0) } else { (4.0, 4.0) };
    let moments = match s.optimizer {
        Optimizer::Adamw => 8.0,
        Optimizer::Sgd => 4.0,
    };
    let master_bytes = if mixed { 4.0 } else { 0.0 };
    let (p_shard, g_shard, o_shard) = match s.strategy {
        Strategy::Ddp => (1.0, 1.0, 1.0),
        Strategy::Zero1 => (1.0, 1.0, n),
        Strategy::Zero2 => (1.0, n, n),
        Strategy::Zero3 => (n, n, n),
    };
    let block = block_bytes(s, s.intermediate);
    // A stage's blocks, times the micro-batches 1F1B keeps in flight on the first stage (pp):
    // as many block activations as one micro-batch through the whole model.
    let layers = stage_layers(s) * s.pp as f64;
    let (blocks, recompute) = if s.activation_checkpointing {
        // Each block's output, copied into the variable the next block starts from.
        let input = s.micro_batch as f64 * s.seq_len as f64 * s.hidden as f64 * s.precision.compute_bytes();
        (layers * input, block)
    } else {
        (layers * block, 0.0)
    };
    Ok(Estimate {
        parameters: held * param_bytes / p_shard,
        gradients: held * grad_bytes / g_shard,
        // The master weights are the optimizer's: sharded with its moments.
        master: held * master_bytes / o_shard,
        optimizer: held * moments / o_shard,
        activations: blocks + outer_bytes(s),
        recompute,
    })
}

/// The most blocks one stage holds: the first stages take the remainder.
fn stage_layers(s: &Setup) -> f64 {
    s.layers.div_ceil(s.pp) as f64
}

/// The share of the model's parameters one GPU of the first stage holds:
/// its blocks, their attention and MLP weights split `tp` ways and their
/// norms whole, and the embedding (with the final norm and the head too when
/// there is one stage); the root stays whole on every tensor-parallel rank.
/// Counted on the shape, then applied to `s.params` (which may be given).
fn held_fraction(s: &Setup) -> f64 {
    let (c, i, v, tp) = (s.hidden as f64, s.intermediate as f64, s.vocab as f64, s.tp as f64);
    let block = (4.0 * c * c + 3.0 * c * i) / tp + 2.0 * c;
    let root = if s.pp == 1 { 2.0 * v * c + c } else { v * c };
    let held = stage_layers(s) * block + root;
    held / model_params(s.layers, s.hidden, s.intermediate, s.vocab)
}

/// What one block's forward leaves for backward, in bytes: every tensor it
/// makes, as the workbook's model makes them on the CPU.
fn block_bytes(s: &Setup, intermediate: usize) -> f64 {
    let (t, c, h, i) = (s.seq_len as f64, s.hidden as f64, s.heads as f64, intermediate as f64);
    let rows = s.micro_batch as f64 * t; // one per token
    let e = s.precision.compute_bytes();
    let tp = s.tp as f64; // a tensor-parallel rank keeps only its heads' and units' tensors
    let per_token = (3.0 * c // q, k, v projections, (B, T, C)
        + 3.0 * c // the same split into heads, (B, H, T, D)
        + 2.0 * 4.5 * c // RoPE of q and of k: x·cos, rotate_half's negated half (C/2) and concatenation, ·sin, sum
        + 2.0 * h * t // attention scores q·kᵀ and their masked softmax, (B, H, T, T)
        + c // softmax · v, (B, H, T, D)
        + c) // heads merged, (B, T, C)
        / tp
        + c // o_proj (a rank's share, then the all-reduced sum: the same size)
        + 4.0 * i / tp // gate, silu(gate), up, silu(gate) · up, (B, T, I)
        + c // down_proj
        + 2.0 * c; // the residual sums after attention and after the MLP
    let causal_mask = t * t; // (T, T) u8, built by each block
    2.0 * rms_norm_bytes(rows, c, e) + rows * e * per_token + causal_mask
}

/// What one RMSNorm over (rows, C) keeps: it computes in f32 whatever the dtype.
fn rms_norm_bytes(rows: f64, c: f64, e: f64) -> f64 {
    let f32 = 4.0;
    let per_row = 4.0 * f32 * c // x², x · 1/rms, the scale repeated per row, the scaled result
        + 5.0 * f32 // per row: Σx², its mean, + eps, sqrt, 1/sqrt
        + if e < f32 { f32 * c + e * c } else { 0.0 }; // the input cast to f32, the output cast back
    rows * per_row
}

/// What the forward leaves outside the blocks: the embedding, the final norm,
/// the head and the loss; with pipeline stages, the first stage's embedding
/// outputs of the micro-batches in flight.
fn outer_bytes(s: &Setup) -> f64 {
    let (b, t, c, v) = (s.micro_batch as f64, s.seq_len as f64, s.hidden as f64, s.vocab as f64);
    let e = s.precision.compute_bytes();
    let embedded = b * t * c * e; // the embedding's output, the first block's input
    if s.pp > 1 {
        return s.pp as f64 * embedded;
    }
    let predicted = b * (t - 1.0).max(0.0); // positions the loss scores: all but each sequence's last
    embedded
        + rms_norm_bytes(b * t, c, e) // the final norm
        + b * t * v * e // the logits, (B, T, V)
        + if b > 1.0 { predicted * v * e } else { 0.0 } // the scored logits made contiguous (a view when B = 1)
        + if e < 4.0 { predicted * v * 4.0 } else { 0.0 } // the scored logits cast to f32 for the loss
}

/// A count in millions or billions.
fn count(n: f64) -> String {
    if n >= 1e9 {
        format!("{:.2}B", n / 1e9)
    } else {
        format!("{:.2}M", n / 1e6)
    }
}

/// Prints the estimate of `setup` and the totals of every strategy beside it.
pub fn report(setup: &Setup, gpu_memory_gb: Option<f64>) -> Result<bool> {
    let gb = |bytes: f64| bytes / 1e9;
    let e = estimate(setup)?;
    let mesh = match (setup.tp, setup.pp) {
        (1, 1) => String::new(),
        (tp, pp) => format!(" (dp {} × pp {pp} × tp {tp}; a GPU of the first stage)", setup.gpus / (tp * pp)),
    };
    println!(
        "{} parameters, {:?}, {:?}, {} on {} GPU(s){mesh}, micro-batch {} x {} tokens{}",
        count(setup.params),
        setup.precision,
        setup.optimizer,
        setup.strategy,
        setup.gpus,
        setup.micro_batch,
        setup.seq_len,
        if setup.activation_checkpointing { ", activation checkpointing" } else { "" }
    );
    let mut rows = vec![
        ("parameters", e.parameters),
        ("gradients", e.gradients),
        ("master weights", e.master),
        ("optimizer moments", e.optimizer),
        ("activations", e.activations),
    ];
    if setup.activation_checkpointing {
        rows.push(("recomputed block", e.recompute));
    }
    rows.push(("total per GPU", e.total()));
    for (name, bytes) in rows {
        println!("  {name:<18} {:>10.2} GB", gb(bytes));
    }
    println!("  (peak resident memory adds backward's and the optimizer's temporaries and the allocator's cache)");
    println!("\n  every strategy, total per GPU:");
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
            intermediate: 1,
            heads: 1,
            vocab: 0,
            seq_len: 0,
            micro_batch: 0,
            precision: Precision::Bf16,
            optimizer: Optimizer::Adamw,
            strategy,
            gpus: 64,
            tp: 1,
            pp: 1,
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
    fn the_master_copy_is_counted_apart_from_the_moments_and_sharded_with_them() {
        let e = estimate(&zero_paper(Strategy::Zero1)).unwrap();
        assert_eq!((e.master, e.optimizer), (4.0 * 7.5e9 / 64.0, 8.0 * 7.5e9 / 64.0));
    }

    #[test]
    fn fp32_adamw_needs_16_bytes_per_parameter_without_a_master_copy() {
        let setup = Setup { precision: Precision::Fp32, gpus: 1, ..zero_paper(Strategy::Ddp) };
        assert_eq!(estimate(&setup).unwrap().model_states(), 16.0 * 7.5e9);
    }

    /// A model shape from configs/.
    struct Model {
        name: &'static str,
        layers: usize,
        hidden: usize,
        heads: usize,
        intermediate: usize,
        vocab: usize,
    }

    const TINY: Model = Model { name: "tiny", layers: 4, hidden: 128, heads: 4, intermediate: 352, vocab: 257 };
    const SMALL: Model = Model { name: "small", layers: 12, hidden: 768, heads: 12, intermediate: 2048, vocab: 50257 };

    /// One rank of `model` under DDP with AdamW, its parameters counted exactly.
    fn one_rank(
        model: &Model,
        seq_len: usize,
        micro_batch: usize,
        precision: Precision,
        checkpointing: bool,
    ) -> Estimate {
        estimate(&one_rank_setup(model, seq_len, micro_batch, precision, checkpointing)).unwrap()
    }

    /// The setup [`one_rank`] estimates.
    fn one_rank_setup(
        model: &Model,
        seq_len: usize,
        micro_batch: usize,
        precision: Precision,
        checkpointing: bool,
    ) -> Setup {
        Setup {
            params: model_params(model.layers, model.hidden, model.intermediate, model.vocab),
            layers: model.layers,
            hidden: model.hidden,
            intermediate: model.intermediate,
            heads: model.heads,
            vocab: model.vocab,
            seq_len,
            micro_batch,
            precision,
            optimizer: Optimizer::Adamw,
            strategy: Strategy::Ddp,
            gpus: 1,
            tp: 1,
            pp: 1,
            activation_checkpointing: checkpointing,
        }
    }

    /// The parameters `param_specs` lists, tensor by tensor.
    fn params_by_tensor(m: &Model) -> usize {
        let (c, i, v) = (m.hidden, m.intermediate, m.vocab);
        let attention = [c * c, c * c, c * c, c * c]; // q, k, v, o
        let norms = [c, c]; // input_layernorm, post_attention_layernorm
        let mlp = [i * c, i * c, c * i]; // gate, up, down
        let block: usize = attention.iter().chain(&norms).chain(&mlp).sum();
        v * c + m.layers * block + c + v * c // embed_tokens, the blocks, norm, lm_head
    }

    #[test]
    fn parameter_counts_of_the_configs_are_exact() {
        // The runtime's counts: the ledger's `params` (`train` prints 0.87M and 162.15M).
        for (model, runtime) in [(TINY, 869_760), (SMALL, 162_148_608)] {
            assert_eq!(
                params_by_tensor(&model),
                runtime,
                "{}: the tensors listed here are not the model's",
                model.name
            );
            let counted = model_params(model.layers, model.hidden, model.intermediate, model.vocab);
            assert_eq!(counted, runtime as f64, "{}: model_params misses a tensor of param_specs", model.name);
        }
    }

    #[test]
    fn llamas_mlp_width_gives_llama_7b_and_the_small_and_medium_configs() {
        assert_eq!(llama_intermediate(4096), 11008, "Llama-7B");
        assert_eq!(llama_intermediate(768), 2048, "configs/small.toml");
        assert_eq!(llama_intermediate(1024), 2816, "configs/medium.toml");
        assert_eq!(
            model_params(32, 4096, llama_intermediate(4096), 32000),
            6_738_415_616.0,
            "Llama-7B's published count"
        );
    }

    #[test]
    fn model_states_equal_the_ledgers_on_one_rank() {
        // The ledger's `model_state_bytes` at `--nproc 1 --stage 0`.
        for (model, precision, ledger) in [
            (TINY, Precision::Fp32, 13_916_160.0),
            (TINY, Precision::Bf16, 13_916_160.0),
            (SMALL, Precision::Fp32, 2_594_377_728.0),
        ] {
            let states = one_rank(&model, 1, 1, precision, false).model_states();
            assert_eq!(states, ledger, "{} {precision:?}", model.name);
        }
    }

    /// Activations the runtime measured on a CPU rank, in bytes.
    struct Measured {
        model: Model,
        seq_len: usize,
        micro_batch: usize,
        precision: Precision,
        checkpointing: bool,
        bytes: f64,
    }

    const MIB: f64 = 1024.0 * 1024.0;

    const fn m(
        model: Model,
        seq_len: usize,
        micro_batch: usize,
        precision: Precision,
        checkpointing: bool,
        bytes: f64,
    ) -> Measured {
        Measured { model, seq_len, micro_batch, precision, checkpointing, bytes }
    }

    /// B = 1: `activation_bytes` of `cargo run --release -p trainer --features
    /// solutions --bin ledger -- --model-size <config> --nproc 1 --stage 0
    /// --seq-len <T> [--precision bf16]`; `--stage 3` recomputes every block,
    /// which is activation checkpointing.
    /// B = 2: "activations, peak" (MiB) of `... --bin train -- --model-size
    /// <config> --dataset dummy --max-steps 2 --nproc 1 --batch-size 2
    /// --seq-len <T> --strategy fsdp --sharding no_shard
    /// [--activation-checkpointing] [--precision bf16] --checkpoint-dir /tmp/x --overwrite`.
    const MEASURED: [Measured; 18] = {
        use Precision::{Bf16, Fp32};
        [
            m(TINY, 128, 1, Fp32, false, 13_215_052.0),
            m(TINY, 256, 1, Fp32, false, 30_674_220.0),
            m(TINY, 128, 1, Fp32, true, 731_596.0),
            m(TINY, 256, 1, Fp32, true, 1_455_564.0),
            m(TINY, 128, 1, Bf16, false, 8_917_224.0),
            m(TINY, 256, 1, Bf16, false, 19_954_120.0),
            m(TINY, 128, 1, Bf16, true, 732_936.0),
            m(TINY, 256, 1, Bf16, true, 1_458_680.0),
            m(TINY, 128, 2, Fp32, false, 25.31 * MIB),
            m(TINY, 128, 2, Fp32, true, 1.64 * MIB),
            m(TINY, 256, 2, Fp32, false, 58.68 * MIB),
            m(TINY, 256, 2, Fp32, true, 3.27 * MIB),
            m(TINY, 128, 2, Bf16, false, 16.96 * MIB),
            m(TINY, 128, 2, Bf16, true, 1.51 * MIB),
            m(SMALL, 256, 1, Fp32, false, 506_401_644.0),
            m(SMALL, 256, 1, Fp32, true, 64_857_004.0),
            m(SMALL, 256, 2, Fp32, false, 1062.68 * MIB),
            m(SMALL, 256, 2, Fp32, true, 221.47 * MIB),
        ]
    };

    #[test]
    fn activations_are_within_10_percent_of_what_the_runtime_measures() {
        for m in MEASURED {
            let estimated = one_rank(&m.model, m.seq_len, m.micro_batch, m.precision, m.checkpointing).activations;
            let ratio = estimated / m.bytes;
            assert!(
                (0.9..=1.1).contains(&ratio),
                "{} T={} B={} {:?}{}: estimated {:.2} MiB, measured {:.2} MiB: block_bytes or outer_bytes \
                 misses a tensor the model keeps, or counts one it does not",
                m.model.name,
                m.seq_len,
                m.micro_batch,
                m.precision,
                if m.checkpointing { " checkpointed" } else { "" },
                estimated / MIB,
                m.bytes / MIB
            );
        }
    }

    #[test]
    fn checkpointing_keeps_each_block_input_and_rebuilds_one_block() {
        let full = one_rank(&SMALL, 256, 2, Precision::Bf16, false);
        let checkpointed = one_rank(&SMALL, 256, 2, Precision::Bf16, true);
        let block_input = 2.0 * 256.0 * 768.0 * 2.0; // (B, T, C) in bf16
        assert_eq!(full.recompute, 0.0);
        let saved = full.activations - checkpointed.activations;
        let expected = 12.0 * (checkpointed.recompute - block_input);
        assert!((saved - expected).abs() < 1e-9 * expected, "saved {saved} bytes, expected {expected}");
    }

    /// The chapter's example: 124M's shape on 64 GPUs as tp 4 × pp 2 × dp 8.
    /// A GPU of the first stage holds 6 of the 12 blocks, their matrices
    /// split 4 ways and their norms whole, and the whole embedding:
    /// 6 · ((4·768² + 3·768·2048) / 4 + 2·768) + 50257·768 = 49,223,424
    /// parameters, and ZeRO-3 shards them over the 8 data-parallel ranks.
    #[test]
    fn a_gpu_of_a_mesh_holds_its_stages_slice_of_the_blocks_and_the_embedding() {
        let mut setup = one_rank_setup(&SMALL, 1024, 1, Precision::Fp32, false);
        (setup.gpus, setup.tp, setup.pp) = (64, 4, 2);
        assert_eq!(estimate(&setup).unwrap().parameters, 4.0 * 49_223_424.0);
        setup.strategy = Strategy::Zero3;
        assert_eq!(estimate(&setup).unwrap().parameters, 4.0 * 49_223_424.0 / 8.0);
        setup.gpus = 60;
        let refused = estimate(&setup).unwrap_err().to_string();
        assert!(refused.contains("60 GPUs do not make whole replicas of tp 4 × pp 2"), "{refused}");
    }

    #[test]
    fn gpt2_small_has_about_124m_parameters() {
        let gpt2 = model_params(12, 768, llama_intermediate(768), 50257) - 50257.0 * 768.0; // GPT-2 ties its head to the embedding
        assert!((gpt2 / 1e6 - 124.0).abs() < 2.0, "{gpt2}");
    }
}
