//! `matrix`: the trainer's `matrix` program (every data-parallel axis on
//! every mesh of tp {1, 2} × pp {1, 2}, compared with one process), its
//! table written to `benchmarks/matrix.md`.

use anyhow::{bail, Context, Result};
use xtask::workspace::{cargo, Workspace};

const TABLE: &str = "benchmarks/matrix.md";

pub fn matrix(ws: &Workspace, steps: usize) -> Result<bool> {
    // `cargo <subcommand>` of the trainer's programs, with the reference bodies.
    let trainer = |subcommand: &str| {
        let mut command = cargo(&ws.root);
        command.args([subcommand, "--quiet", "--package", "trainer", "--features", "solutions"]);
        command
    };
    // The program starts `train` from beside itself: both are built first.
    let built = trainer("build").args(["--bin", "train", "--bin", "matrix"]).status().context("cannot run cargo")?;
    if !built.success() {
        bail!("building the trainer's programs failed");
    }
    let output = trainer("run")
        .args(["--bin", "matrix", "--", "--steps", &steps.to_string()])
        .stderr(std::process::Stdio::inherit())
        .output()
        .context("cannot run cargo")?;
    let table = String::from_utf8_lossy(&output.stdout);
    if !table.trim().is_empty() {
        std::fs::write(ws.root.join(TABLE), table.as_bytes()).with_context(|| format!("cannot write {TABLE}"))?;
        println!("{table}written to {TABLE}");
    }
    Ok(output.status.success())
}
