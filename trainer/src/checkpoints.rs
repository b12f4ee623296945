//! Where a run keeps its checkpoints: `step_NNNNNN` directories, the newest few kept.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

/// The directory of the checkpoint written after `step` optimizer steps.
pub fn step_dir(root: &Path, step: usize) -> PathBuf {
    root.join(format!("step_{step:06}"))
}

/// The step numbers of the complete checkpoints under `root`, oldest first.
pub fn steps(root: &Path) -> Result<Vec<usize>> {
    let Ok(entries) = std::fs::read_dir(root) else { return Ok(vec![]) };
    let mut steps = vec![];
    for entry in entries {
        let entry = entry.with_context(|| format!("cannot list {}", root.display()))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if let Some(step) = name.strip_prefix("step_").and_then(|n| n.parse().ok()) {
            steps.push(step);
        }
    }
    steps.sort_unstable();
    Ok(steps)
}

/// The newest checkpoint under `root`, or `root` itself when it is a checkpoint.
pub fn resolve(root: &Path) -> Result<PathBuf> {
    if root.join("trainer_state.json").is_file() {
        return Ok(root.to_path_buf());
    }
    match steps(root)?.last() {
        Some(&step) => Ok(step_dir(root, step)),
        None => bail!("no checkpoint in {}: train first, or point at a step_NNNNNN directory", root.display()),
    }
}

/// Deletes all but the newest `keep` checkpoints under `root`.
pub fn prune(root: &Path, keep: usize) -> Result<()> {
    let steps = steps(root)?;
    for &step in steps.iter().take(steps.len().saturating_sub(keep)) {
        let dir = step_dir(root, step);
        std::fs::remove_dir_all(&dir).with_context(|| format!("cannot remove {}", dir.display()))?;
    }
    Ok(())
}
