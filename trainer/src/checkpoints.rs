//! Where a run keeps its checkpoints: `step_NNNNNN` directories, the newest few
//! kept, in a directory one run at a time.

use std::fs::File;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use workbook::train::Checkpoint;

use crate::metrics::METRICS_FILE;
use crate::tensorboard::EVENTS_FILE;

/// What a run writes into its directory besides checkpoints.
const RUN_FILES: [&str; 3] = [METRICS_FILE, "loss.svg", EVENTS_FILE];
/// The file a run holds an advisory lock on.
const LOCK_FILE: &str = ".lock";

/// The directory of the checkpoint written after `step` optimizer steps.
pub fn step_dir(root: &Path, step: usize) -> PathBuf {
    root.join(format!("step_{step:06}"))
}

/// The step numbers of the complete checkpoints under `root`, oldest first.
pub fn steps(root: &Path) -> Result<Vec<usize>> {
    Ok(step_dirs(root)?.into_iter().filter(|&step| Checkpoint::is_complete(&step_dir(root, step))).collect())
}

/// The steps of every directory under `root` named as [`step_dir`] names
/// them, complete or not, oldest first.
fn step_dirs(root: &Path) -> Result<Vec<usize>> {
    let Ok(entries) = std::fs::read_dir(root) else { return Ok(vec![]) };
    let mut steps = vec![];
    for entry in entries {
        let entry = entry.with_context(|| format!("cannot list {}", root.display()))?;
        let is_dir = entry.file_type().is_ok_and(|t| t.is_dir());
        if let Some(step) = step_of(&entry.file_name().to_string_lossy()).filter(|_| is_dir) {
            steps.push(step);
        }
    }
    steps.sort_unstable();
    Ok(steps)
}

/// The step of a directory named exactly as [`step_dir`] names one.
fn step_of(name: &str) -> Option<usize> {
    let digits = name.strip_prefix("step_")?;
    let step: usize = digits.bytes().all(|b| b.is_ascii_digit()).then(|| digits.parse().ok())??;
    (format!("step_{step:06}") == name).then_some(step)
}

/// The newest complete and intact checkpoint under `root` (a newer one that
/// lacks a file or fails its checks is skipped, with a warning), or `root`
/// itself when it is a checkpoint.
pub fn resolve(root: &Path) -> Result<PathBuf> {
    if root.join("trainer_state.json").is_file() {
        warn_unchecked(root, &Checkpoint::verify(root)?);
        return Ok(root.to_path_buf());
    }
    let steps = step_dirs(root)?;
    for &step in steps.iter().rev() {
        let dir = step_dir(root, step);
        let missing = Checkpoint::missing_files(&dir);
        if !missing.is_empty() {
            eprintln!("warning: skipping {}: it lacks {}", dir.display(), missing.join(", "));
            continue;
        }
        match Checkpoint::verify(&dir) {
            Ok(unchecked) => {
                warn_unchecked(&dir, &unchecked);
                return Ok(dir);
            }
            Err(e) => eprintln!("warning: skipping {}: {e}", dir.display()),
        }
    }
    match steps.is_empty() {
        true => bail!("no checkpoint in {}: train first, or point at a step_NNNNNN directory", root.display()),
        false => bail!("no intact checkpoint in {}: every one lacks a file or fails its checks", root.display()),
    }
}

/// Says which files of the checkpoint in `dir` are read without a checksum.
fn warn_unchecked(dir: &Path, unchecked: &[&str]) {
    if !unchecked.is_empty() {
        eprintln!(
            "warning: {} was written before checksums covered {}: read unchecked",
            dir.display(),
            unchecked.join(" and ")
        );
    }
}

/// Deletes all but the newest `keep` checkpoints under `root`. Each is first
/// renamed to the debris name `.step_NNNNNN.pruned`, so that a kill midway
/// never leaves a half-deleted checkpoint under its own name.
pub fn prune(root: &Path, keep: usize) -> Result<()> {
    let steps = steps(root)?;
    for &step in steps.iter().take(steps.len().saturating_sub(keep)) {
        let (dir, pruned) = (step_dir(root, step), root.join(format!(".step_{step:06}.pruned")));
        std::fs::rename(&dir, &pruned).with_context(|| format!("cannot move {} aside", dir.display()))?;
        std::fs::remove_dir_all(&pruned).with_context(|| format!("cannot remove {}", pruned.display()))?;
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
    let logs: Vec<PathBuf> = RUN_FILES.map(|f| root.join(f)).into_iter().filter(|f| f.exists()).collect();
    if resume || (steps.is_empty() && logs.is_empty()) {
        return Ok(());
    }
    if !overwrite {
        match steps.last() {
            Some(newest) => bail!(
                "{} holds the checkpoints of an earlier run (newest: step {newest}): continue it with --resume, \
                 start afresh with --overwrite (which deletes them), or give this run its own --checkpoint-dir",
                root.display()
            ),
            // Appending to them would mix two runs in one loss curve.
            None => bail!(
                "{} holds the logs of an earlier run that saved no checkpoint ({}): start afresh with \
                 --overwrite (which deletes them), or give this run its own --checkpoint-dir",
                root.display(),
                logs.iter().filter_map(|f| f.file_name()).map(|f| f.to_string_lossy()).collect::<Vec<_>>().join(", ")
            ),
        }
    }
    for &step in &steps {
        let dir = step_dir(root, step);
        std::fs::remove_dir_all(&dir).with_context(|| format!("cannot remove {}", dir.display()))?;
    }
    for file in &logs {
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

/// What a save or a prune that never finished left, which only the trainer
/// names so: `.step_NNNNNN.partial-ID` (a save's staging directory) and
/// `.step_NNNNNN.pruned` (a checkpoint being deleted) are removed; a
/// checkpoint set aside while its step was saved again (`.step_NNNNNN.old`,
/// holding a `trainer_state.json`) goes back in place if the new one never
/// arrived, and is removed if it did. Nothing else is touched.
fn remove_debris(root: &Path) -> Result<()> {
    let remove =
        |path: &Path| std::fs::remove_dir_all(path).with_context(|| format!("cannot remove {}", path.display()));
    for entry in std::fs::read_dir(root).with_context(|| format!("cannot list {}", root.display()))?.flatten() {
        if !entry.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        let (name, path) = (entry.file_name().to_string_lossy().into_owned(), entry.path());
        match debris_of(&name) {
            None => {}
            Some(Debris::Staging | Debris::Pruned) => remove(&path)?,
            Some(Debris::SetAside(_)) if !path.join("trainer_state.json").is_file() => {}
            Some(Debris::SetAside(step)) => {
                let dir = step_dir(root, step);
                if Checkpoint::is_complete(&dir) {
                    remove(&path)?;
                } else if !dir.exists() {
                    std::fs::rename(&path, &dir).with_context(|| format!("cannot restore {}", dir.display()))?;
                } else {
                    eprintln!(
                        "warning: left {} and {} as they are: the first is not a complete checkpoint, so neither \
                         was written by one save",
                        dir.display(),
                        path.display()
                    );
                }
            }
        }
    }
    Ok(())
}

/// What a save or prune that never finished leaves.
enum Debris {
    /// A save's staging directory.
    Staging,
    /// A checkpoint set aside while its step was saved again.
    SetAside(usize),
    /// A checkpoint being deleted.
    Pruned,
}

/// The kind of debris a directory named `name` is, if the trainer names it so.
fn debris_of(name: &str) -> Option<Debris> {
    let (dir, suffix) = name.strip_prefix('.')?.split_once('.')?;
    let step = step_of(dir)?;
    match suffix {
        "old" => Some(Debris::SetAside(step)),
        "pruned" => Some(Debris::Pruned),
        _ => {
            let id = suffix.strip_prefix("partial-")?;
            (!id.is_empty() && id.bytes().all(|b| b.is_ascii_digit() || b == b'-')).then_some(Debris::Staging)
        }
    }
}
