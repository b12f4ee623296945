//! `bench fsdp`: what each ZeRO stage holds and sends per rank, measured by
//! the FSDP runtime's ledger, beside the ZeRO paper's formulas.
//!
//! Runs `trainer`'s `ledger` program once per (config, precision, stage,
//! world size), one process each, and writes the table into
//! `benchmarks/results.md` under its own heading.

use std::path::Path;
use std::process::Command;

use anyhow::{bail, Context, Result};
use serde::de::DeserializeOwned;
use serde::Deserialize;
use xtask::render;
use xtask::workspace::{cargo, Workspace};

use crate::bench::{cpu_model, replace_section, RESULTS};
use crate::estimate::{estimate, model_params, Optimizer, Precision, Setup, Strategy};

const HEADING: &str = "## FSDP: memory and communication per rank";
const WORLD_SIZES: [usize; 3] = [1, 2, 4];
/// The setups measured: tiny in both precisions, GPT-2-small's shape in fp32.
const SETUPS: [(&str, Precision); 3] =
    [("tiny", Precision::Fp32), ("tiny", Precision::Bf16), ("small", Precision::Fp32)];

/// Rank 0's ledger of one setup, as `ledger` prints it.
#[derive(Debug, Deserialize)]
pub(crate) struct Ledger {
    pub padded_params: u64,
    pub model_state_bytes: u64,
    /// The model states by kind: parameters in the compute dtype, f32
    /// master weights (in fp32 runs, the parameters themselves), gradients
    /// and the optimizer's moments.
    pub param_bytes: u64,
    pub master_bytes: u64,
    pub grad_bytes: u64,
    pub optimizer_bytes: u64,
    gathered_peak_bytes: u64,
    activation_bytes: Option<u64>,
    ring_volume_bytes: u64,
    all_gathers: u64,
    reduce_scatters: u64,
    all_reduces: u64,
    tokens_per_s: f64,
}

pub fn bench_fsdp(ws: &Workspace) -> Result<bool> {
    println!("{}", render::bold("FSDP memory and traffic per rank, measured beside the ZeRO formulas"));
    let available = available_memory_bytes();
    let mut rows = vec![];
    for (model_size, precision) in SETUPS {
        for stage in 0..=3u8 {
            for world_size in WORLD_SIZES {
                let row = match measure(&ws.root, model_size, precision, stage, world_size, available)? {
                    Some(ledger) => format_row(model_size, precision, stage, world_size, &ledger)?,
                    None => format!("| {model_size} | {} | {} | {world_size} | skipped: needs more memory than this machine has |||||||\n", name(precision), Strategy::ALL[stage as usize]),
                };
                print!("{row}");
                rows.push(row);
            }
        }
    }
    let body = format!(
        "Written by `cargo xtask bench fsdp` ({cpu}). Each row trains 2 steps of one\n\
         64-token sequence per rank on CPU ranks and reads rank 0's ledger of the last step.\n\
         Ψ counts the padded flat parameters; bytes are per rank. *Model states* are\n\
         parameters, gradients, f32 master weights and AdamW's moments; the formula is the\n\
         ZeRO paper's (mixed precision: 2Ψ + 2Ψ + 12Ψ; fp32: 4Ψ + 4Ψ + 8Ψ, divided by N where\n\
         sharded). Traffic is the ring volume per rank, all-reduce counted twice, (N-1)/N left\n\
         out, in units of Ψ elements of the reduce dtype; theory: 2Ψ for DDP and stages 1-2,\n\
         3Ψ for stage 3. Where they differ:\n\
         - bf16 stage 3 holds 14Ψ/N, not 16Ψ/N: like PyTorch's FSDP, the runtime keeps no\n  \
           bf16 shard and casts the f32 master shard when gathering.\n\
         - stage 3 moves a little under 3Ψ: the root unit (embedding, final norm, head)\n  \
           stays gathered from its forward through its backward, as PyTorch's root does,\n  \
           so it is gathered once, not twice.\n\
         - at N = 1 nothing moves over a network, but the collectives still run (and count).\n\
         Activations are what the forward leaves for backward: every stage recomputes its\n\
         blocks in backward (the unit step keeps no graph, which would keep gathered weights\n\
         alive), so the forward leaves their inputs, counted by size, plus the root's saved\n\
         tensors, measured with a counting allocator.\n\n\
         | config | precision | strategy | N | model states MiB | formula MiB | gathered peak MiB | activations MiB | traffic (Ψ) | theory (Ψ) | collectives AG/RS/AR | tokens/s |\n\
         |---|---|---|---:|---:|---:|---:|---:|---:|---:|---|---:|\n{}",
        rows.concat(),
        cpu = cpu_model()
    );
    replace_section(&ws.root.join(RESULTS), HEADING, &body)?;
    println!("written to {RESULTS}");
    Ok(true)
}

pub(crate) fn measure(
    root: &Path,
    model_size: &str,
    precision: Precision,
    stage: u8,
    world_size: usize,
    available: Option<u64>,
) -> Result<Option<Ledger>> {
    if let Some(available) = available {
        // Each rank holds its model states and as much again in transients.
        let psi = config_params(root, model_size)?;
        let need = 2.5 * world_size as f64 * states(psi, precision, stage, world_size)?;
        if need > available as f64 {
            return Ok(None);
        }
    }
    let output = reference_program(root, "ledger")
        .args(["--model-size", model_size, "--precision", name(precision)])
        .args(["--stage", &stage.to_string(), "--nproc", &world_size.to_string()])
        .output()
        .context("cannot run cargo")?;
    if !output.status.success() {
        bail!("the trainer's ledger failed:\n{}", String::from_utf8_lossy(&output.stderr));
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    let Some(line) = stdout.lines().find(|l| l.starts_with('{')) else { bail!("ledger printed no result:\n{stdout}") };
    Ok(Some(serde_json::from_str(line).with_context(|| format!("unexpected ledger output: {line}"))?))
}

/// `cargo run --release` of the trainer's program `bin` with the reference
/// solutions, ready for the program's own arguments.
pub(crate) fn reference_program(root: &Path, bin: &str) -> Command {
    let mut command = cargo(root);
    command.args([
        "run",
        "--quiet",
        "--release",
        "--package",
        "trainer",
        "--features",
        "solutions",
        "--bin",
        bin,
        "--",
    ]);
    command
}

/// The parameter count of `configs/<model_size>.toml`'s model.
pub(crate) fn config_params(root: &Path, model_size: &str) -> Result<f64> {
    #[derive(Deserialize)]
    struct Config {
        model: Model,
    }
    #[derive(Deserialize)]
    struct Model {
        num_layers: usize,
        hidden_size: usize,
        intermediate_size: usize,
        vocab_size: usize,
    }
    let Config { model } = read_config(root, model_size)?;
    Ok(model_params(model.num_layers, model.hidden_size, model.intermediate_size, model.vocab_size))
}

/// What a caller needs of `configs/<model_size>.toml`, read as `T`.
pub(crate) fn read_config<T: DeserializeOwned>(root: &Path, model_size: &str) -> Result<T> {
    let path = root.join("configs").join(format!("{model_size}.toml"));
    let text = std::fs::read_to_string(&path).with_context(|| format!("cannot read {}", path.display()))?;
    toml::from_str(&text).with_context(|| format!("{} is not a model config", path.display()))
}

/// The ZeRO formula's model-state bytes per rank for `psi` parameters.
pub(crate) fn states(psi: f64, precision: Precision, stage: u8, world_size: usize) -> Result<f64> {
    Ok(estimate(&model_states_setup(psi, precision, Strategy::ALL[stage as usize], world_size))?.model_states())
}

/// A setup whose estimate's model states are those of `psi` parameters with
/// AdamW under `strategy` on `world_size` ranks (its activations mean nothing).
pub(crate) fn model_states_setup(psi: f64, precision: Precision, strategy: Strategy, world_size: usize) -> Setup {
    Setup {
        params: psi,
        layers: 1,
        hidden: 1,
        intermediate: 1,
        heads: 1,
        vocab: 1,
        seq_len: 1,
        micro_batch: 1,
        precision,
        optimizer: Optimizer::Adamw,
        strategy,
        gpus: world_size,
        tp: 1,
        pp: 1,
        activation_checkpointing: false,
    }
}

fn format_row(model_size: &str, precision: Precision, stage: u8, world_size: usize, l: &Ledger) -> Result<String> {
    let mib = |b: f64| b / (1024.0 * 1024.0);
    let formula = states(l.padded_params as f64, precision, stage, world_size)?;
    let element = if precision == Precision::Fp32 { 4.0 } else { 2.0 };
    let traffic = l.ring_volume_bytes as f64 / (l.padded_params as f64 * element);
    let theory = if stage == 3 { 3 } else { 2 };
    Ok(format!(
        "| {model_size} | {} | {} | {world_size} | {:.2} | {:.2} | {:.2} | {} | {traffic:.2} | {theory} | {}/{}/{} | {:.0} |\n",
        name(precision),
        Strategy::ALL[stage as usize],
        mib(l.model_state_bytes as f64),
        mib(formula),
        mib(l.gathered_peak_bytes as f64),
        l.activation_bytes.map_or("n/a".to_string(), |b| format!("{:.2}", mib(b as f64))),
        l.all_gathers,
        l.reduce_scatters,
        l.all_reduces,
        l.tokens_per_s
    ))
}

pub(crate) fn name(precision: Precision) -> &'static str {
    match precision {
        Precision::Fp32 => "fp32",
        Precision::Bf16 => "bf16",
        Precision::Fp16 => "fp16",
    }
}

/// `MemAvailable` from /proc/meminfo, where the OS has it.
fn available_memory_bytes() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemAvailable:"))?;
    Some(line.split_whitespace().nth(1)?.parse::<u64>().ok()? * 1024)
}
