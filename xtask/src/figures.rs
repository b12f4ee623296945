//! The `figures` program (figures/): where it reads and writes, and how it
//! runs. `verify` runs its `check`, which says whether a figure or number
//! file is stale; `cargo xtask figures` (tools/) runs its `draw`.

use std::path::Path;

use anyhow::{Context, Result};

use crate::workspace::cargo;

/// Where the `figures` program reads the recorded runs and writes the figures.
pub const DATA: &str = "guide/figure-data";
pub const FIGURES: &str = "guide/src/figures";
/// Where it writes the quoted numbers, one file of mdBook anchors per source.
pub const NUMBERS: &str = "guide/src/numbers";

/// Runs the `figures` program: `draw` writes the figures and number files,
/// `check` says which are stale and fails if any is.
pub fn run_figures(root: &Path, command: &str) -> Result<bool> {
    let status = cargo(root)
        .args(["run", "--quiet", "--package", "figures", "--", command, "."])
        .status()
        .context("cannot run cargo")?;
    Ok(status.success())
}
