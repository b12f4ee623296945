//! `cargo xtask figures`: the guide's figures and the numbers its chapters
//! quote. The `figures` program draws each figure from data recorded from
//! the workbook's own runs and committed in `guide/figure-data/`, writes
//! each quoted number into `guide/src/numbers/` from those runs and
//! `benchmarks/results.md`, and from there into the chapters that quote it;
//! `--record` runs the recorded runs again first (the reference trainer, a
//! few minutes). `verify` runs the program's `check`: whether each figure,
//! number file and quoted value is what its data gives.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde::Deserialize;
use xtask::workspace::{cargo, Workspace};

use crate::bench_fsdp::{config_params, measure, model_states_setup, name, read_config, reference_program, states};
use crate::estimate::{estimate, Precision, Strategy};

/// Where the `figures` program reads the recorded runs and writes the figures.
pub const DATA: &str = "guide/figure-data";
pub const FIGURES: &str = "guide/src/figures";
/// Where it writes the quoted numbers, one file of anchors per source.
pub const NUMBERS: &str = "guide/src/numbers";

/// Draws every figure and writes every quoted number from the committed
/// data; with `record`, records the data first.
pub fn figures(ws: &Workspace, record: bool) -> Result<bool> {
    if record {
        record_all(&ws.root)?;
    }
    run_figures(&ws.root, "draw")
}

/// Runs the `figures` program (figures/): `draw` writes the figures and
/// number files, `check` says which are stale and fails if any is.
pub fn run_figures(root: &Path, command: &str) -> Result<bool> {
    let status = cargo(root)
        .args(["run", "--quiet", "--package", "figures", "--", command, "."])
        .status()
        .context("cannot run cargo")?;
    Ok(status.success())
}

/// One recorded run: the trainer's arguments, and the files of its
/// checkpoint directory that become figure data, each with its name there.
struct TrainRun {
    args: &'static str,
    keep: &'static [Kept],
}

/// A file a recorded run wrote (`from`, in its checkpoint directory) and its
/// name in the figure data (`data`).
struct Kept {
    from: &'static str,
    data: &'static str,
}

const TRAIN_RUNS: [TrainRun; 7] = [
    TrainRun {
        args: "--max-steps 600 --checkpoint-every 600 --eval-every 50",
        keep: &[Kept { from: "metrics.jsonl", data: "loss-curve.metrics.jsonl" }],
    },
    // The same run at a peak learning rate far above the config's: its loss
    // spikes during warmup, and the training chapter on stability reads it
    // beside the run above. The final trainer state holds its clipping
    // threshold and schedule.
    TrainRun {
        args: "--lr 1.0 --max-steps 600 --checkpoint-every 600 --eval-every 50",
        keep: &[
            Kept { from: "metrics.jsonl", data: "loss-spike.metrics.jsonl" },
            Kept { from: "step_000600/trainer_state.json", data: "loss-spike.trainer_state.json" },
        ],
    },
    TrainRun {
        args: "--pp 4 --nproc 4 --pipeline-schedule gpipe --grad-accum 8 --max-steps 2 --trace",
        keep: &[Kept { from: "trace.json", data: "gpipe.trace.json" }],
    },
    TrainRun {
        args: "--pp 4 --nproc 4 --pipeline-schedule 1f1b --grad-accum 8 --max-steps 2 --trace",
        keep: &[Kept { from: "trace.json", data: "1f1b.trace.json" }],
    },
    TrainRun {
        args: "--strategy fsdp --nproc 2 --max-steps 2 --trace",
        keep: &[Kept { from: "trace.json", data: "fsdp.trace.json" }],
    },
    // The same run with each unit's all-gather started while the unit
    // before it computes: the knobs chapter sets it beside the run above.
    TrainRun {
        args: "--strategy fsdp --nproc 2 --max-steps 2 --trace --prefetch",
        keep: &[Kept { from: "trace.json", data: "fsdp-prefetch.trace.json" }],
    },
    TrainRun {
        args: "--nproc 2 --ddp-overlap --bucket-cap-mb 0.5 --max-steps 2 --trace",
        keep: &[Kept { from: "trace.json", data: "ddp-overlap.trace.json" }],
    },
];

/// The ZeRO figure's setup: GPT-2 124M's shape in fp32, on 1, 2 and 4 ranks.
const ZERO_MODEL: &str = "small";
const ZERO_WORLD_SIZES: [usize; 3] = [1, 2, 4];
/// The mixed-precision figure's setup: the same shape under FULL_SHARD, in
/// fp32 and bf16, on more ranks than the ledger can run on one machine.
const PRECISIONS: [Precision; 2] = [Precision::Fp32, Precision::Bf16];
const PRECISION_WORLD_SIZES: [usize; 5] = [1, 2, 4, 8, 16];

fn record_all(root: &Path) -> Result<()> {
    let data = root.join(DATA);
    std::fs::create_dir_all(&data).with_context(|| format!("cannot create {}", data.display()))?;
    let scratch = std::env::temp_dir().join(format!("workbook-figures-{}", std::process::id()));
    for (index, run) in TRAIN_RUNS.iter().enumerate() {
        let names: Vec<&str> = run.keep.iter().map(|k| k.data).collect();
        println!("recording {} (train {})", names.join(" and "), run.args);
        let out = scratch.join(format!("run-{index}"));
        let status = reference_program(root, "train")
            .args(run.args.split_whitespace())
            .arg("--checkpoint-dir")
            .arg(&out)
            .status()
            .context("cannot run cargo")?;
        if !status.success() {
            bail!("recording {} failed", names.join(" and "));
        }
        for kept in run.keep {
            copy(&out.join(kept.from), &data.join(kept.data))?;
        }
    }
    record_printed(root, "record_ring", &data.join("ring.json"))?;
    record_printed(root, "record_mesh", &data.join("device-mesh.json"))?;
    record_zero_memory(root, &data.join("zero-memory.jsonl"))?;
    record_precision_memory(root, &data.join("precision-memory.jsonl"))?;
    record_mlp_shape(root, &data.join("megatron-mlp.json"))?;
    std::fs::remove_dir_all(&scratch).ok();
    Ok(())
}

/// Runs the reference program `bin` and keeps what it prints at `path`.
fn record_printed(root: &Path, bin: &str, path: &Path) -> Result<()> {
    println!("recording {} ({bin})", path.file_name().unwrap_or_default().to_string_lossy());
    let output = reference_program(root, bin).output().context("cannot run cargo")?;
    if !output.status.success() {
        bail!("{bin} failed:\n{}", String::from_utf8_lossy(&output.stderr));
    }
    std::fs::write(path, &output.stdout).with_context(|| format!("cannot write {}", path.display()))
}

fn copy(from: &Path, to: &PathBuf) -> Result<()> {
    std::fs::copy(from, to).with_context(|| format!("cannot copy {} to {}", from.display(), to.display()))?;
    Ok(())
}

/// Each ZeRO stage's model states per rank, measured by the FSDP ledger,
/// beside the ZeRO paper's formula for the same padded parameter count.
fn record_zero_memory(root: &Path, path: &Path) -> Result<()> {
    let mut lines = String::new();
    for (stage, strategy) in Strategy::ALL.iter().enumerate() {
        for world_size in ZERO_WORLD_SIZES {
            println!("recording zero-memory.jsonl: {strategy} on {world_size} rank(s)");
            let stage = stage as u8;
            let Some(ledger) = measure(root, ZERO_MODEL, Precision::Fp32, stage, world_size, None)? else {
                bail!("the ledger of {strategy} on {world_size} rank(s) was skipped");
            };
            let formula = states(ledger.padded_params as f64, Precision::Fp32, stage, world_size)?;
            let line = serde_json::json!({
                "strategy": strategy.to_string(),
                "world_size": world_size,
                "params": ledger.padded_params,
                "parameter_bytes": ledger.param_bytes + ledger.master_bytes,
                "gradient_bytes": ledger.grad_bytes,
                "optimizer_bytes": ledger.optimizer_bytes,
                "model_state_bytes": ledger.model_state_bytes,
                "formula_bytes": formula,
            });
            lines.push_str(&format!("{line}\n"));
        }
    }
    std::fs::write(path, lines).with_context(|| format!("cannot write {}", path.display()))
}

/// FULL_SHARD's model states per rank in fp32 and in bf16, part by part, as
/// `cargo xtask estimate` counts them (the ZeRO paper's accounting).
fn record_precision_memory(root: &Path, path: &Path) -> Result<()> {
    println!("recording precision-memory.jsonl (the estimate of {ZERO_MODEL}'s model states)");
    let psi = config_params(root, ZERO_MODEL)?;
    let mut lines = String::new();
    for precision in PRECISIONS {
        for world_size in PRECISION_WORLD_SIZES {
            let parts = estimate(&model_states_setup(psi, precision, Strategy::Zero3, world_size))?;
            let line = serde_json::json!({
                "precision": name(precision),
                "world_size": world_size,
                "params": psi,
                "parameter_bytes": parts.parameters,
                "gradient_bytes": parts.gradients,
                "master_bytes": parts.master,
                "moment_bytes": parts.optimizer,
            });
            lines.push_str(&format!("{line}\n"));
        }
    }
    std::fs::write(path, lines).with_context(|| format!("cannot write {}", path.display()))
}

/// The tiny config's MLP shape, split over 2 tensor-parallel ranks: the
/// Megatron figure is drawn from shapes, not from a run.
fn record_mlp_shape(root: &Path, path: &Path) -> Result<()> {
    #[derive(Deserialize)]
    struct Config {
        model: Model,
    }
    #[derive(Deserialize)]
    struct Model {
        hidden_size: usize,
        intermediate_size: usize,
    }
    let Config { model } = read_config(root, "tiny")?;
    let shape = serde_json::json!({ "hidden": model.hidden_size, "intermediate": model.intermediate_size, "tp": 2 });
    std::fs::write(path, format!("{shape}\n")).with_context(|| format!("cannot write {}", path.display()))
}
