//! A run directory holds one run: a fresh run refuses another's checkpoints
//! unless told, a run holds the directory while it trains, and what killed
//! saves leave behind is cleared or put back. Needs finished exercises: run
//! with `cargo test -p trainer --features solutions`.

mod common;
use common::scratch;

use std::path::Path;
use std::process::{Command, Output};

use trainer::checkpoints;
use trainer::metrics::read_log;
use workbook::data::SAMPLE_PATH;

/// `train` on dummy data for `steps` steps into `dir`, a checkpoint every 2 steps.
fn train(dir: &Path, steps: usize, extra: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_train"))
        .args(["--dataset", "dummy", "--seq-len", "32", "--batch-size", "4", "--warmup-steps", "1"])
        .args(["--max-steps", &steps.to_string(), "--checkpoint-every", "2"])
        .arg("--checkpoint-dir")
        .arg(dir)
        .args(extra)
        .env("RAYON_NUM_THREADS", "1")
        .output()
        .expect("train starts")
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn succeeded(output: &Output) {
    assert!(output.status.success(), "train failed:\n{}", stderr(output));
}

#[test]
fn a_fresh_run_refuses_an_earlier_runs_checkpoints_unless_told() {
    let dir = scratch("fresh");
    succeeded(&train(&dir, 4, &[]));
    let refused = train(&dir, 2, &[]);
    assert_eq!(refused.status.code(), Some(1));
    let message = stderr(&refused);
    for offer in ["newest: step 4", "--resume", "--overwrite", "--checkpoint-dir"] {
        assert!(message.contains(offer), "the refusal should mention `{offer}`:\n{message}");
    }
    succeeded(&train(&dir, 2, &["--overwrite"]));
    assert_eq!(checkpoints::steps(&dir).unwrap(), [2], "--overwrite deletes the earlier run's checkpoints");
    let logged: Vec<usize> = read_log(&dir.join("metrics.jsonl")).unwrap().iter().map(|r| r.step).collect();
    assert_eq!(logged, [1, 2], "--overwrite starts metrics.jsonl afresh");
}

/// A run that ended before its first checkpoint leaves its logs; the next
/// fresh run must not append to them and mix two runs in one loss curve.
#[test]
fn a_fresh_run_refuses_an_earlier_runs_logs_unless_told() {
    let dir = scratch("fresh-logs");
    succeeded(&train(&dir, 2, &[]));
    // As if it had been killed before its first checkpoint.
    std::fs::remove_dir_all(checkpoints::step_dir(&dir, 2)).unwrap();
    let refused = train(&dir, 2, &[]);
    assert_eq!(refused.status.code(), Some(1));
    let message = stderr(&refused);
    for offer in ["metrics.jsonl", "--overwrite", "--checkpoint-dir"] {
        assert!(message.contains(offer), "the refusal should mention `{offer}`:\n{message}");
    }
    succeeded(&train(&dir, 2, &["--overwrite"]));
    let logged: Vec<usize> = read_log(&dir.join("metrics.jsonl")).unwrap().iter().map(|r| r.step).collect();
    assert_eq!(logged, [1, 2], "--overwrite starts metrics.jsonl afresh");
}

#[test]
fn a_resume_rewrites_the_metrics_after_its_step_and_skips_stray_step_directories() {
    let dir = scratch("resume");
    succeeded(&train(&dir, 4, &[]));
    // A kill after step 4's checkpoint and before step 5's left a log that runs ahead of it.
    std::fs::remove_dir_all(checkpoints::step_dir(&dir, 4)).unwrap();
    std::fs::create_dir_all(checkpoints::step_dir(&dir, 9)).unwrap(); // empty: not a checkpoint
    succeeded(&train(&dir, 4, &["--resume"]));
    let logged: Vec<usize> = read_log(&dir.join("metrics.jsonl")).unwrap().iter().map(|r| r.step).collect();
    assert_eq!(logged, [1, 2, 3, 4], "resumed at step 2: its later records are written once, not twice");
}

/// A rewind (a resume from an earlier checkpoint of the same directory)
/// moves the rewound run's later checkpoints aside as it cuts the log back,
/// whatever steps it saves at: a later plain `--resume` continues the
/// rewind, not the run it left, and nothing is deleted.
#[test]
fn a_rewind_retires_the_later_checkpoints_of_the_run_it_left() {
    let dir = scratch("rewind");
    succeeded(&train(&dir, 6, &["--keep-checkpoints", "5"]));
    let from = checkpoints::step_dir(&dir, 2);
    let rewind = train(&dir, 3, &["--resume", from.to_str().unwrap()]);
    succeeded(&rewind);
    let stdout = String::from_utf8_lossy(&rewind.stdout);
    assert!(stdout.contains("moved step_000004, step_000006 into"), "{stdout}");
    assert_eq!(checkpoints::steps(&dir).unwrap(), [2, 3], "steps 4 and 6 were the rewound run's");
    let aside = dir.join("rewound_after_step_000002");
    assert_eq!(checkpoints::steps(&aside).unwrap(), [4, 6], "the rewound run's checkpoints are kept aside");
    succeeded(&train(&dir, 5, &["--resume"]));
    let logged: Vec<usize> = read_log(&dir.join("metrics.jsonl")).unwrap().iter().map(|r| r.step).collect();
    assert_eq!(logged, [1, 2, 3, 4, 5], "the log reads as the rewind, from step 3 on");
}

/// A resume that takes another `--grad-accum` than the checkpoint's run
/// changes how many sequences a step reads: the run says so.
#[test]
fn a_resume_with_another_grad_accum_says_the_step_changes() {
    let dir = scratch("resume-accum");
    succeeded(&train(&dir, 2, &["--grad-accum", "2"]));
    let output = train(&dir, 3, &["--resume"]);
    succeeded(&output);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.contains("was trained with 2 micro-batches per step and this run takes 1"), "{stdout}");
}

#[test]
fn a_run_holds_its_directory_while_it_trains() {
    let dir = scratch("lock");
    std::fs::create_dir_all(&dir).unwrap();
    let held = std::fs::File::options().create(true).truncate(false).write(true).open(dir.join(".lock")).unwrap();
    held.lock().unwrap();
    let refused = train(&dir, 2, &[]);
    assert_eq!(refused.status.code(), Some(1));
    assert!(stderr(&refused).contains("another run is using"), "{}", stderr(&refused));
    drop(held);
    succeeded(&train(&dir, 2, &[]));
}

#[test]
fn what_killed_saves_left_is_cleared_or_put_back() {
    let dir = scratch("debris");
    succeeded(&train(&dir, 4, &[]));
    // A save killed while writing, and one killed after setting step 4 aside.
    let staging = dir.join(".step_000006.partial-12345");
    std::fs::create_dir_all(&staging).unwrap();
    std::fs::rename(checkpoints::step_dir(&dir, 4), dir.join(".step_000004.old")).unwrap();
    succeeded(&train(&dir, 6, &["--resume"]));
    assert!(!staging.exists(), "the staging directory of a killed save is removed");
    assert!(!dir.join(".step_000004.old").exists(), "the set-aside checkpoint is put back, not left");
    assert_eq!(checkpoints::steps(&dir).unwrap(), [2, 4, 6]);
}

/// The metrics log is a record, not state: a bad line in it is skipped
/// with a warning that names it, and the checkpoint resumes.
#[test]
fn a_bad_line_in_the_metrics_log_does_not_stop_a_resume() {
    let dir = scratch("bad-metrics");
    succeeded(&train(&dir, 2, &[]));
    let path = dir.join("metrics.jsonl");
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(&path, format!("{{\"step\": oops}}\n{text}")).unwrap();
    let resumed = train(&dir, 4, &["--resume"]);
    succeeded(&resumed);
    assert!(stderr(&resumed).contains("skipping bad line 1 of"), "{}", stderr(&resumed));
    let logged: Vec<usize> = read_log(&path).unwrap().iter().map(|r| r.step).collect();
    assert_eq!(logged, [1, 2, 3, 4]);
}

#[test]
fn a_moved_workbook_resumes_its_runs() {
    let root = scratch("workbook");
    std::fs::create_dir_all(root.join("datasets")).unwrap();
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    std::fs::create_dir_all(root.join("configs")).unwrap();
    std::fs::copy(source.join("configs/tiny.toml"), root.join("configs/tiny.toml")).unwrap();
    std::fs::copy(source.join(SAMPLE_PATH), root.join(SAMPLE_PATH)).unwrap();
    let run = |dir: &Path, steps: &str, extra: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_train"))
            .current_dir(dir)
            .args(["--seq-len", "32", "--batch-size", "4", "--warmup-steps", "1", "--checkpoint-every", "2"])
            .args(["--nproc", "1", "--max-steps", steps])
            .args(extra)
            .env("RAYON_NUM_THREADS", "1")
            .output()
            .unwrap()
    };
    succeeded(&run(&root, "2", &[]));
    let state = std::fs::read_to_string(checkpoints::step_dir(&root.join("checkpoints"), 2).join("trainer_state.json"));
    assert!(
        state.unwrap().contains(&format!("\"path\": \"{SAMPLE_PATH}\"")),
        "the data file is recorded relative to the workbook"
    );
    let moved = scratch("workbook-moved");
    std::fs::rename(&root, &moved).unwrap();
    let resumed = run(&moved, "4", &["--resume"]);
    succeeded(&resumed);
    assert!(String::from_utf8_lossy(&resumed.stdout).contains("resumed from"), "the moved run resumes");
}

#[test]
fn a_full_disk_during_a_save_keeps_the_last_checkpoint_and_leaves_nothing_behind() {
    let dir = scratch("disk-full");
    // The second save (step 4) runs out of space after its model file.
    let mut full = Command::new(env!("CARGO_BIN_EXE_train"));
    full.args(["--dataset", "dummy", "--seq-len", "32", "--batch-size", "4", "--warmup-steps", "1"]);
    full.args(["--max-steps", "6", "--checkpoint-every", "2", "--nproc", "1", "--checkpoint-dir"]).arg(&dir);
    let failed = full.env("WORKBOOK_INJECT", "disk-full-on-save=2").env("RAYON_NUM_THREADS", "1").output().unwrap();
    assert_eq!(failed.status.code(), Some(1));
    let message = stderr(&failed);
    assert!(message.contains("step 2 is intact: free disk space") && message.contains("--resume"), "{message}");
    let left: Vec<String> =
        std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    assert!(!left.iter().any(|name| name.contains("partial")), "the failed save left its staging behind: {left:?}");
    assert_eq!(checkpoints::steps(&dir).unwrap(), [2], "the last complete checkpoint survives");
    succeeded(&train(&dir, 6, &["--resume"]));
    assert_eq!(checkpoints::steps(&dir).unwrap(), [2, 4, 6]);
}

#[test]
fn a_corrupt_newest_checkpoint_is_skipped_for_the_one_before() {
    let dir = scratch("corrupt");
    succeeded(&train(&dir, 4, &[]));
    let model = checkpoints::step_dir(&dir, 4).join("model.safetensors");
    let mut bytes = std::fs::read(&model).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0x10; // one flipped bit in a weight
    std::fs::write(&model, bytes).unwrap();
    let resumed = train(&dir, 6, &["--resume"]);
    succeeded(&resumed);
    assert!(stderr(&resumed).contains("skipping") && stderr(&resumed).contains("step_000004"), "{}", stderr(&resumed));
    assert!(String::from_utf8_lossy(&resumed.stdout).contains("at step 2"), "it resumes from step 2");
}

/// Every file under `dir` with its contents, for telling what a run changed.
fn snapshot(dir: &Path) -> Vec<(std::path::PathBuf, Vec<u8>)> {
    let mut files = vec![];
    for entry in std::fs::read_dir(dir).unwrap().map(Result::unwrap) {
        match entry.file_type().unwrap().is_dir() {
            true => files.extend(snapshot(&entry.path())),
            false => files.push((entry.path(), std::fs::read(entry.path()).unwrap())),
        }
    }
    files.sort();
    files
}

/// Names that look like the trainer's debris but whose content it did not
/// write are the user's: a failed run, a run, a refused run and a run with
/// --overwrite leave them be, even where they carry the trainer's own
/// debris names and a file named like a checkpoint's.
#[test]
fn a_run_touches_no_file_it_did_not_write() {
    let dir = scratch("not-ours");
    let user = dir.join("user");
    let names = [
        "notes",
        ".notes.old",
        "step_2",
        ".step_2.old",
        ".step_000002.partial-x",
        ".step_000002.old",
        ".step_000003.pruned",
        ".step_000003.partial-77",
    ];
    for name in names {
        std::fs::create_dir_all(user.join(name)).unwrap();
        std::fs::write(user.join(name).join("important.txt"), format!("precious: {name}")).unwrap();
    }
    std::fs::write(user.join(".step_000002.old").join("trainer_state.json"), r#"{"mine": true}"#).unwrap();
    std::fs::write(user.join(".bashrc.old"), "alias ll='ls -l'").unwrap();
    let ours = |path: &Path| {
        let name = path.strip_prefix(&user).unwrap().iter().next().unwrap().to_string_lossy().into_owned();
        name.starts_with("step_0")
            || ["metrics.jsonl", "loss.svg", "events.out.tfevents.workbook", ".lock"].contains(&name.as_str())
    };
    let theirs = || -> Vec<_> { snapshot(&user).into_iter().filter(|(path, _)| !ours(path)).collect() };
    let before = theirs();
    let failed = train(&user, 2, &["--dataset", "tinystories", "--data-path", "/nonexistent/stories.txt"]);
    assert!(!failed.status.success(), "a run on a missing file must fail");
    assert_eq!(theirs(), before, "a failed run changed files it did not write");
    succeeded(&train(&user, 2, &[]));
    let refused = train(&user, 2, &[]);
    assert!(stderr(&refused).contains("holds the checkpoints of an earlier run"), "{}", stderr(&refused));
    assert_eq!(theirs(), before, "a run that refused to start changed files it did not write");
    succeeded(&train(&user, 2, &["--overwrite"]));
    assert_eq!(theirs(), before, "two runs changed files they did not write");
    assert!(!user.join("bashrc").exists() && !user.join("step_000002").join("important.txt").exists());
}

/// A kill while the oldest checkpoint was being deleted leaves it under the
/// trainer's own debris name, never as a half-deleted `step_N`; the next run
/// finishes the deletion.
#[test]
fn what_a_killed_prune_left_is_finished_by_the_next_run() {
    let dir = scratch("pruned");
    succeeded(&train(&dir, 4, &[]));
    let pruned = dir.join(".step_000002.pruned");
    std::fs::rename(checkpoints::step_dir(&dir, 2), &pruned).unwrap();
    std::fs::remove_file(pruned.join("optimizer.safetensors")).unwrap(); // deleted halfway
    succeeded(&train(&dir, 6, &["--resume", "--keep-checkpoints", "2"]));
    assert!(!pruned.exists(), "the half-deleted checkpoint is removed");
    assert_eq!(checkpoints::steps(&dir).unwrap(), [4, 6]);
}

/// `train | head -1`: a closed standard output stops the printing, not the
/// run, which trains to the end and saves its checkpoints.
#[test]
fn a_closed_output_stops_the_printing_not_the_run() {
    use std::io::{BufRead, BufReader};
    let dir = scratch("closed-stdout");
    let mut child = Command::new(env!("CARGO_BIN_EXE_train"))
        .args(["--dataset", "dummy", "--seq-len", "32", "--batch-size", "4", "--warmup-steps", "1"])
        .args(["--max-steps", "6", "--checkpoint-every", "2", "--log-every", "1", "--checkpoint-dir"])
        .arg(&dir)
        .env("RAYON_NUM_THREADS", "1")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut first).unwrap(); // then closed, as by `head -1`
    let output = child.wait_with_output().unwrap();
    assert!(output.status.success(), "train failed after its output closed:\n{}", stderr(&output));
    assert!(!stderr(&output).contains("panicked"), "{}", stderr(&output));
    assert_eq!(checkpoints::steps(&dir).unwrap(), [2, 4, 6], "every checkpoint is saved");
}

/// The run's lock is its owner's alone: another user who could open it
/// could hold it and keep every run out of the directory.
#[cfg(unix)]
#[test]
fn the_lock_is_readable_by_its_owner_only() {
    use std::os::unix::fs::PermissionsExt;
    let dir = scratch("lock-mode");
    succeeded(&train(&dir, 2, &[]));
    let mode = std::fs::metadata(dir.join(".lock")).unwrap().permissions().mode();
    assert_eq!(mode & 0o077, 0, "the lock's mode is {:o}", mode & 0o777);
}

/// A link that has a debris name is the user's: the prune that would use the
/// name picks another, and the link and what it points to stay.
#[cfg(unix)]
#[test]
fn a_link_with_a_debris_name_neither_stops_a_prune_nor_is_followed() {
    let dir = scratch("linked");
    let elsewhere = scratch("linked-target");
    std::fs::create_dir_all(&elsewhere).unwrap();
    std::fs::write(elsewhere.join("important.txt"), "precious").unwrap();
    std::fs::create_dir_all(&dir).unwrap();
    let link = dir.join(".step_000002.pruned");
    std::os::unix::fs::symlink(&elsewhere, &link).unwrap();
    succeeded(&train(&dir, 6, &["--keep-checkpoints", "2"]));
    assert_eq!(checkpoints::steps(&dir).unwrap(), [4, 6], "the prune went on past the link");
    assert_eq!(std::fs::read_link(&link).unwrap(), elsewhere, "the link is left as it was");
    assert_eq!(std::fs::read_to_string(elsewhere.join("important.txt")).unwrap(), "precious");
}

/// The state, the checksums and the Hugging Face files are checked like the
/// tensors: an edited, cut or damaged one, or a missing file, makes resume
/// and infer fall back to the checkpoint before, saying why.
#[test]
fn a_damaged_or_edited_newest_checkpoint_falls_back_to_the_one_before() {
    let dir = scratch("damaged");
    succeeded(&train(&dir, 4, &[]));
    let newest = checkpoints::step_dir(&dir, 4);
    let pristine = snapshot(&newest);
    let restore = || pristine.iter().for_each(|(path, bytes)| std::fs::write(path, bytes).unwrap());
    let edit = |file: &str, change: &dyn Fn(String) -> String| {
        let path = newest.join(file);
        std::fs::write(&path, change(std::fs::read_to_string(&path).unwrap())).unwrap();
    };
    let falls_back = |what: &str, expected: &str| {
        let infer = Command::new(env!("CARGO_BIN_EXE_infer"))
            .args(["--max-new-tokens", "2", "--checkpoint"])
            .arg(&dir)
            .output()
            .unwrap();
        assert!(infer.status.success(), "{what}: infer failed:\n{}", stderr(&infer));
        assert!(
            stderr(&infer).contains("skipping") && stderr(&infer).contains(expected),
            "{what}:\n{}",
            stderr(&infer)
        );
    };
    edit("trainer_state.json", &|s| s.replacen("\"step\": 4", "\"step\": 5", 1));
    falls_back("an edited step", "trainer_state.json is corrupt");
    restore();
    edit("trainer_state.json", &|s| s[..s.len() / 2].to_string());
    falls_back("a cut-short state", "trainer_state.json is corrupt");
    restore();
    edit("config.json", &|s| s.replace("\"num_hidden_layers\": 4", "\"num_hidden_layers\": 3"));
    falls_back("an edited config.json", "config.json is corrupt");
    restore();
    edit("checksums.json", &|s| s[..s.len() - 3].to_string());
    falls_back("a cut-short checksums.json", "checksums.json is corrupt");
    restore();
    std::fs::remove_file(newest.join("optimizer.safetensors")).unwrap();
    falls_back("a missing file", "lacks optimizer.safetensors");
    restore();
    let resumed = train(&dir, 6, &["--resume"]);
    succeeded(&resumed);
    assert!(String::from_utf8_lossy(&resumed.stdout).contains("at step 4"), "the restored checkpoint resumes");
}

/// A checkpoint from before every file had a checksum still resumes, and
/// says that its state was read unchecked.
#[test]
fn a_checkpoint_from_before_full_checksums_resumes_with_a_warning() {
    let dir = scratch("older");
    succeeded(&train(&dir, 4, &[]));
    let sums = checkpoints::step_dir(&dir, 4).join("checksums.json");
    let all: std::collections::BTreeMap<String, u32> =
        serde_json::from_str(&std::fs::read_to_string(&sums).unwrap()).unwrap();
    let tensors: std::collections::BTreeMap<_, _> =
        all.into_iter().filter(|(f, _)| f.ends_with(".safetensors")).collect();
    std::fs::write(&sums, serde_json::to_string(&tensors).unwrap()).unwrap();
    let resumed = train(&dir, 6, &["--resume"]);
    succeeded(&resumed);
    assert!(String::from_utf8_lossy(&resumed.stdout).contains("at step 4"), "it resumes from step 4");
    assert!(stderr(&resumed).contains("trainer_state.json: read unchecked"), "{}", stderr(&resumed));
}

/// A checkpoint whose checksums.json was deleted cannot be told intact: a
/// damaged one is passed over for the older one that can, by resume and by
/// infer; and infer checks the files a checksums.json lists even in a
/// directory that lost its trainer_state.json (read as Hugging Face's).
#[test]
fn a_checkpoint_without_checksums_never_goes_ahead_of_an_intact_one() {
    let dir = scratch("no-checksums");
    succeeded(&train(&dir, 4, &[]));
    let newest = checkpoints::step_dir(&dir, 4);
    let model = newest.join("model.safetensors");
    let mut bytes = std::fs::read(&model).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0x10; // one flipped bit in a weight
    std::fs::write(&model, bytes).unwrap();
    let state = std::fs::read(newest.join("trainer_state.json")).unwrap();
    std::fs::remove_file(newest.join("trainer_state.json")).unwrap();
    let infer = |path: &Path| {
        Command::new(env!("CARGO_BIN_EXE_infer")).args(["--max-new-tokens", "2", "--checkpoint"]).arg(path).output()
    };
    let read_as_hf = infer(&newest).unwrap();
    assert!(!read_as_hf.status.success(), "a damaged file that checksums.json lists must not load");
    assert!(stderr(&read_as_hf).contains("model.safetensors is corrupt"), "{}", stderr(&read_as_hf));
    std::fs::write(newest.join("trainer_state.json"), state).unwrap();
    std::fs::remove_file(newest.join("checksums.json")).unwrap();
    let fell_back = infer(&dir).unwrap();
    assert!(fell_back.status.success(), "{}", stderr(&fell_back));
    assert!(stderr(&fell_back).contains("it has no checksums.json"), "{}", stderr(&fell_back));
    let resumed = train(&dir, 6, &["--resume"]);
    succeeded(&resumed);
    assert!(String::from_utf8_lossy(&resumed.stdout).contains("at step 2"), "it resumes from the intact step 2");
}

/// A model whose training diverged loads with a warning that names a
/// broken parameter, and generating from it stops with a clear error, for
/// sampling and greedy decoding alike, instead of printing token 0 or an
/// error about sampling weights.
#[test]
fn infer_warns_of_weights_that_are_not_finite() {
    let dir = scratch("nan-weights");
    succeeded(&train(&dir, 2, &[]));
    let step = checkpoints::step_dir(&dir, 2);
    let mut weights =
        candle_core::safetensors::load(step.join("model.safetensors"), &candle_core::Device::Cpu).unwrap();
    let norm = weights["model.norm.weight"].clone();
    weights.insert("model.norm.weight".into(), (norm * f64::NAN).unwrap());
    candle_core::safetensors::save(&weights, step.join("model.safetensors")).unwrap();
    for file in ["trainer_state.json", "checksums.json", "optimizer.safetensors"] {
        std::fs::remove_file(step.join(file)).unwrap(); // a Hugging Face directory now
    }
    for temperature in ["0.8", "0"] {
        let infer = Command::new(env!("CARGO_BIN_EXE_infer"))
            .args(["--max-new-tokens", "2", "--temperature", temperature, "--checkpoint"])
            .arg(&step)
            .output()
            .unwrap();
        let message = stderr(&infer);
        assert_eq!(infer.status.code(), Some(1), "temperature {temperature}: {message}");
        assert!(message.contains("parameters hold NaN or infinity (first: model.norm.weight)"), "{message}");
        assert!(message.contains("scores for the next token are not finite"), "{message}");
        assert!(infer.stdout.iter().all(|&b| b != 0), "temperature {temperature}: NUL bytes printed");
    }
}

/// A directory that has a checkpoint's name but none of its files is not
/// replaced by a save: the run fails, saying so, and leaves it as it was;
/// the failure is not blamed on the disk.
#[test]
fn a_save_never_replaces_a_directory_that_is_not_a_checkpoint() {
    let dir = scratch("in-the-way");
    let theirs = checkpoints::step_dir(&dir, 2);
    std::fs::create_dir_all(&theirs).unwrap();
    std::fs::write(theirs.join("notes.txt"), "precious").unwrap();
    let failed = train(&dir, 2, &[]);
    assert_eq!(failed.status.code(), Some(1));
    let message = stderr(&failed);
    assert!(message.contains("is in the way and is not a checkpoint"), "{message}");
    assert!(message.contains("fix the cause") && !message.contains("disk space"), "{message}");
    assert_eq!(std::fs::read_to_string(theirs.join("notes.txt")).unwrap(), "precious");
}
