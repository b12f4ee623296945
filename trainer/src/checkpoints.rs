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
    root.join(step_name(step))
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

/// The name of the checkpoint written after `step` optimizer steps.
fn step_name(step: usize) -> String {
    format!("step_{step:06}")
}

/// The step of a directory named exactly as [`step_dir`] names one.
fn step_of(name: &str) -> Option<usize> {
    let digits = name.strip_prefix("step_")?;
    let step: usize = digits.bytes().all(|b| b.is_ascii_digit()).then(|| digits.parse().ok())??;
    (step_name(step) == name).then_some(step)
}

/// `root/name`, or `root/name-N` for the first N where that is taken.
fn free_path(root: &Path, name: &str) -> PathBuf {
    (0..)
        .map(|n| match n {
            0 => root.join(name),
            n => root.join(format!("{name}-{n}")),
        })
        .find(|path| std::fs::symlink_metadata(path).is_err())
        .expect("some name is free")
}

/// The newest complete and intact checkpoint under `root` (a newer one that
/// lacks a file or fails its checks is skipped, with a warning), or `root`
/// itself when it is a checkpoint. One without a `checksums.json`, which
/// cannot be told intact, is taken only when no older one can be: a deleted
/// `checksums.json` must not put a damaged checkpoint ahead of a good one.
pub fn resolve(root: &Path) -> Result<PathBuf> {
    if std::fs::symlink_metadata(root).is_err() {
        bail!(
            "there is nothing at {}: check the path (a step_NNNNNN checkpoint, a run's --checkpoint-dir, or for \
             --init-from and infer a Hugging Face model directory)",
            root.display()
        );
    }
    if root.join("trainer_state.json").is_file() {
        warn_unchecked(root, &Checkpoint::verify(root)?);
        return Ok(root.to_path_buf());
    }
    let steps = step_dirs(root)?;
    let mut without_checksums = vec![];
    for &step in steps.iter().rev() {
        let dir = step_dir(root, step);
        let missing = Checkpoint::missing_files(&dir);
        if !missing.is_empty() {
            eprintln!("warning: skipping {}: it lacks {}", dir.display(), missing.join(", "));
            continue;
        }
        match Checkpoint::verify(&dir) {
            Ok(unchecked) if !Checkpoint::has_checksums(&dir) => without_checksums.push((dir, unchecked)),
            Ok(unchecked) => {
                for (passed, _) in &without_checksums {
                    eprintln!(
                        "warning: skipping {}: it has no checksums.json, so it cannot be told intact, and {} can",
                        passed.display(),
                        dir.display()
                    );
                }
                warn_unchecked(&dir, &unchecked);
                return Ok(dir);
            }
            Err(e) => eprintln!("warning: skipping {}: {e}", dir.display()),
        }
    }
    if let Some((dir, unchecked)) = without_checksums.into_iter().next() {
        warn_unchecked(&dir, &unchecked);
        return Ok(dir);
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

/// Moves the checkpoints under `root` of steps after `step` into a folder
/// of their own there: in a run that resumed from `step`, those of the run
/// it rewound, which a later `--resume` would otherwise take for this run's
/// newest. Nothing is deleted. Returns the folder and the checkpoints' names,
/// or `None` when there were none.
pub fn set_aside_after(root: &Path, step: usize) -> Result<Option<(PathBuf, Vec<String>)>> {
    let later: Vec<usize> = steps(root)?.into_iter().filter(|&s| s > step).collect();
    if later.is_empty() {
        return Ok(None);
    }
    let folder = free_path(root, &format!("rewound_after_{}", step_name(step)));
    std::fs::create_dir(&folder).with_context(|| format!("cannot create {}", folder.display()))?;
    let mut names = vec![];
    for &later_step in &later {
        let (dir, name) = (step_dir(root, later_step), step_name(later_step));
        std::fs::rename(&dir, folder.join(&name)).with_context(|| format!("cannot move {} aside", dir.display()))?;
        names.push(name);
    }
    Ok(Some((folder, names)))
}

/// Deletes all but the newest `keep` checkpoints under `root`. Each is first
/// renamed to a debris name, `.step_NNNNNN.pruned` (or `.pruned-N` where
/// something else has that name), so that a kill midway never leaves a
/// half-deleted checkpoint under its own name.
pub fn prune(root: &Path, keep: usize) -> Result<()> {
    let steps = steps(root)?;
    for &step in steps.iter().take(steps.len().saturating_sub(keep)) {
        let dir = step_dir(root, step);
        let pruned = free_path(root, &format!(".{}.pruned", step_name(step)));
        std::fs::rename(&dir, &pruned).with_context(|| format!("cannot move {} aside", dir.display()))?;
        std::fs::remove_dir_all(&pruned).with_context(|| format!("cannot remove {}", pruned.display()))?;
    }
    Ok(())
}

/// Takes `root` for a run (see [`RunLock`]) and readies it: a checkpoint a
/// killed save set aside is put back; a fresh run (not `resume`) refuses a
/// directory holding another run's checkpoints, which it would otherwise mix
/// with its own, unless `overwrite` says to delete them; only then is what
/// killed saves left deleted, so a run that refuses deletes nothing. The
/// process that starts the ranks holds the lock until the job ends.
pub fn take(root: &Path, resume: bool, overwrite: bool) -> Result<RunLock> {
    let lock = RunLock::acquire(root)?;
    let debris = find_debris(root)?;
    restore_set_aside(root, &debris)?;
    prepare(root, resume, overwrite)?;
    remove_debris(root, &debris)?;
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
    let names = logs.iter().filter_map(|f| f.file_name()).map(|name| name.to_string_lossy().into_owned());
    let removed: Vec<String> = steps.iter().map(|&step| step_name(step)).chain(names).collect();
    println!("--overwrite: removed the earlier run's {} from {}", removed.join(", "), root.display());
    Ok(())
}

/// A run's hold on its directory: an advisory lock on `<root>/.lock`, which the
/// operating system releases when the process ends however it ends, so a
/// killed run never leaves a stale lock behind. A directory the lock
/// created is removed again when the lock is dropped with nothing else in
/// it: a run that failed before writing anything leaves no trace.
pub struct RunLock {
    _file: File,
    /// The directory, when taking the lock created it.
    created: Option<PathBuf>,
}

impl Drop for RunLock {
    fn drop(&mut self) {
        let Some(root) = &self.created else { return };
        let only_the_lock =
            std::fs::read_dir(root).is_ok_and(|entries| entries.flatten().all(|entry| entry.file_name() == LOCK_FILE));
        if only_the_lock {
            let _ = std::fs::remove_file(root.join(LOCK_FILE)).and_then(|()| std::fs::remove_dir(root));
        }
    }
}

impl RunLock {
    /// Takes the directory, or fails at once if another run holds it.
    pub fn acquire(root: &Path) -> Result<Self> {
        let created = (!root.exists()).then(|| root.to_path_buf());
        std::fs::create_dir_all(root).with_context(|| format!("cannot create {}", root.display()))?;
        let path = root.join(LOCK_FILE);
        let mut options = File::options();
        options.create(true).truncate(false).write(true);
        // Anyone who can open the lock can hold it: it is the owner's alone.
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
        let file = options.open(&path).with_context(|| format!("cannot open {}", path.display()))?;
        if file.try_lock().is_err() {
            bail!(
                "another run is using {} (it holds {}): wait for it to finish, or give this run its own --checkpoint-dir",
                root.display(),
                path.display()
            );
        }
        Ok(Self { _file: file, created })
    }
}

/// What a save or a prune that never finished left under `root`, each with
/// its path, recognised by name and by content (see [`Debris`]): a
/// directory, never a link, holding only what the trainer writes there.
fn find_debris(root: &Path) -> Result<Vec<(PathBuf, Debris)>> {
    let mut found = vec![];
    for entry in std::fs::read_dir(root).with_context(|| format!("cannot list {}", root.display()))?.flatten() {
        let Some(debris) = debris_of(&entry.file_name().to_string_lossy()) else { continue };
        let path = entry.path();
        let ours = match debris {
            Debris::SetAside(_) => Checkpoint::is_written_by_a_save(&path),
            Debris::Staging | Debris::Pruned => Checkpoint::holds_only_saved_files(&path),
        };
        if ours {
            found.push((path, debris));
        }
    }
    Ok(found)
}

/// Puts back each checkpoint that a save set aside (`.step_NNNNNN.old`)
/// while it wrote the same step again, if the new one never arrived.
fn restore_set_aside(root: &Path, debris: &[(PathBuf, Debris)]) -> Result<()> {
    for (path, debris) in debris {
        let &Debris::SetAside(step) = debris else { continue };
        let dir = step_dir(root, step);
        if std::fs::symlink_metadata(&dir).is_err() {
            std::fs::rename(path, &dir).with_context(|| format!("cannot restore {}", dir.display()))?;
        }
    }
    Ok(())
}

/// Deletes the staging directories of killed saves (`.step_NNNNNN.partial-ID`),
/// the checkpoints whose deletion was killed (`.step_NNNNNN.pruned`), and
/// set-aside checkpoints whose step was written again. Nothing else is touched.
fn remove_debris(root: &Path, debris: &[(PathBuf, Debris)]) -> Result<()> {
    let remove =
        |path: &Path| std::fs::remove_dir_all(path).with_context(|| format!("cannot remove {}", path.display()));
    for (path, debris) in debris.iter().filter(|(path, _)| path.exists()) {
        match *debris {
            Debris::Staging | Debris::Pruned => remove(path)?,
            Debris::SetAside(step) if Checkpoint::is_complete(&step_dir(root, step)) => remove(path)?,
            Debris::SetAside(step) => eprintln!(
                "warning: left {} and {} as they are: the first is not a complete checkpoint, so neither was \
                 written by one save",
                step_dir(root, step).display(),
                path.display()
            ),
        }
    }
    Ok(())
}

/// What a save or prune that never finished leaves. Only a directory whose
/// name says which and whose content the trainer wrote is taken for one: a
/// staging or pruned directory holds only files a save writes, and a set-aside
/// checkpoint is a whole one whose files match its `checksums.json`.
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
        _ if suffix.strip_prefix("pruned-").is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit())) => {
            Some(Debris::Pruned)
        }
        _ => {
            let id = suffix.strip_prefix("partial-")?;
            (!id.is_empty() && id.bytes().all(|b| b.is_ascii_digit() || b == b'-')).then_some(Debris::Staging)
        }
    }
}
