//! Where a run keeps its checkpoints: `step_NNNNNN` directories, the newest few
//! kept, in a directory one run at a time.

use std::fs::File;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use workbook::train::Checkpoint;

/// What a run writes into its directory besides checkpoints.
const RUN_FILES: [&str; 2] = ["metrics.jsonl", "loss.svg"];
/// The file a run holds an advisory lock on.
const LOCK_FILE: &str = ".lock";

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
            if Checkpoint::is_complete(&entry.path()) {
                steps.push(step);
            }
        }
    }
    steps.sort_unstable();
    Ok(steps)
}

/// The newest complete and intact checkpoint under `root` (a newer one
/// whose checksums fail is skipped, with a warning), or `root` itself when it
/// is a checkpoint.
pub fn resolve(root: &Path) -> Result<PathBuf> {
    if root.join("trainer_state.json").is_file() {
        return Ok(root.to_path_buf());
    }
    let steps = steps(root)?;
    for &step in steps.iter().rev() {
        let dir = step_dir(root, step);
        match Checkpoint::verify(&dir) {
            Ok(()) => return Ok(dir),
            Err(e) => eprintln!("warning: skipping {}: {e}", dir.display()),
        }
    }
    match steps.is_empty() {
        true => bail!("no checkpoint in {}: train first, or point at a step_NNNNNN directory", root.display()),
        false => bail!("no intact checkpoint in {}: every one fails its checksums", root.display()),
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

/// Takes `root` for a run (see [`RunLock`]) and readies it: a fresh run (not
/// `resume`) refuses a directory holding another run's checkpoints, which it
/// would otherwise mix with its own, unless `overwrite` says to delete them.
/// The process that starts the ranks holds the lock until the job ends.
pub fn take(root: &Path, resume: bool, overwrite: bool) -> Result<RunLock> {
    let lock = RunLock::acquire(root)?;
    prepare(root, resume, overwrite)?;
    Ok(lock)
}

fn prepare(root: &Path, resume: bool, overwrite: bool) -> Result<()> {
    let steps = steps(root)?;
    let Some(newest) = steps.last() else { return Ok(()) };
    if resume {
        return Ok(());
    }
    if !overwrite {
        bail!(
            "{} holds the checkpoints of an earlier run (newest: step {newest}): continue it with --resume, \
             start afresh with --overwrite (which deletes them), or give this run its own --checkpoint-dir",
            root.display()
        );
    }
    for &step in &steps {
        let dir = step_dir(root, step);
        std::fs::remove_dir_all(&dir).with_context(|| format!("cannot remove {}", dir.display()))?;
    }
    for file in RUN_FILES.map(|f| root.join(f)).iter().filter(|f| f.exists()) {
        std::fs::remove_file(file).with_context(|| format!("cannot remove {}", file.display()))?;
    }
    Ok(())
}

/// A run's hold on its directory: an advisory lock on `<root>/.lock`, which the
/// operating system releases when the process ends however it ends, so a
/// killed run never leaves a stale lock behind.
pub struct RunLock {
    _file: File,
}

impl RunLock {
    /// Takes the directory, or fails at once if another run holds it. Then
    /// clears what killed saves left behind, which only a holder may do.
    pub fn acquire(root: &Path) -> Result<Self> {
        std::fs::create_dir_all(root).with_context(|| format!("cannot create {}", root.display()))?;
        let path = root.join(LOCK_FILE);
        let file = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .with_context(|| format!("cannot open {}", path.display()))?;
        if file.try_lock().is_err() {
            bail!(
                "another run is using {} (it holds {}): wait for it to finish, or give this run its own --checkpoint-dir",
                root.display(),
                path.display()
            );
        }
        remove_debris(root)?;
        Ok(Self { _file: file })
    }
}

/// What saves that never finished left: staging directories
/// (`.step_N.partial-PID`) are removed; a checkpoint set aside while its step
/// was saved again (`.step_N.old`) goes back in place if the new one never
/// arrived, and is removed if it did.
fn remove_debris(root: &Path) -> Result<()> {
    let remove =
        |path: &Path| std::fs::remove_dir_all(path).with_context(|| format!("cannot remove {}", path.display()));
    for entry in std::fs::read_dir(root).with_context(|| format!("cannot list {}", root.display()))?.flatten() {
        let (name, path) = (entry.file_name().to_string_lossy().into_owned(), entry.path());
        if name.starts_with(".step_") && name.contains(".partial-") {
            remove(&path)?;
        } else if let Some(step) = name.strip_prefix('.').and_then(|n| n.strip_suffix(".old")) {
            let dir = root.join(step);
            if Checkpoint::is_complete(&dir) {
                remove(&path)?;
            } else {
                if dir.exists() {
                    remove(&dir)?;
                }
                std::fs::rename(&path, &dir).with_context(|| format!("cannot restore {}", dir.display()))?;
            }
        }
    }
    Ok(())
}
