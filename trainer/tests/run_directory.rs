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
    assert!(message.contains("step 2 is intact") && message.contains("--resume"), "{message}");
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
