//! The TensorBoard event file: its framing and checksums, one event per
//! step even after a resume, and (where Python's `tensorboard` package is
//! installed) TensorBoard's own reader finds every scalar.

mod common;
use common::scratch;

use std::path::Path;
use std::process::Command;

use trainer::tensorboard::{masked_crc, record, EVENTS_FILE};

fn train(dir: &Path, steps: usize, extra: &[&str]) {
    let output = Command::new(env!("CARGO_BIN_EXE_train"))
        .args(["--dataset", "dummy", "--seq-len", "32", "--batch-size", "4", "--warmup-steps", "1"])
        .args(["--max-steps", &steps.to_string(), "--checkpoint-every", "4", "--eval-every", "4"])
        .arg("--checkpoint-dir")
        .arg(dir)
        .args(extra)
        .env("RAYON_NUM_THREADS", "1")
        .output()
        .expect("train starts");
    assert!(output.status.success(), "train failed:\n{}", String::from_utf8_lossy(&output.stderr));
}

/// The payloads of the TFRecords in `path`, each checked against its two checksums.
fn records(path: &Path) -> Vec<Vec<u8>> {
    let bytes = std::fs::read(path).unwrap();
    let (mut at, mut out) = (0, vec![]);
    while at < bytes.len() {
        let length = u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap()) as usize;
        let crc = |range: std::ops::Range<usize>| u32::from_le_bytes(bytes[range].try_into().unwrap());
        assert_eq!(crc(at + 8..at + 12), masked_crc(&bytes[at..at + 8]), "the length's checksum at byte {at}");
        let data = &bytes[at + 12..at + 12 + length];
        assert_eq!(crc(at + 12 + length..at + 16 + length), masked_crc(data), "the data's checksum at byte {at}");
        out.push(data.to_vec());
        at += 16 + length;
    }
    out
}

/// TensorBoard's own `masked_crc32c(b"123456789")` (its Python package's).
#[test]
fn the_checksum_is_tensorboards() {
    assert_eq!(masked_crc(b"123456789"), 0xc78a_b0e5);
    let framed = record(b"abc");
    assert_eq!(framed.len(), 3 + 16);
    assert_eq!(&framed[..8], &3u64.to_le_bytes());
    assert_eq!(&framed[12..15], b"abc");
}

/// A file-version event, the evaluation before the first step (step 0),
/// then one event per step: a resumed run rewrites the steps it kept
/// instead of logging them twice.
#[test]
fn one_event_per_step_even_after_a_resume() {
    let dir = scratch("tensorboard");
    train(&dir, 6, &[]);
    let events = dir.join(EVENTS_FILE);
    assert_eq!(records(&events).len(), 1 + 1 + 6);
    let older = dir.join("step_000004");
    train(&dir, 8, &["--resume", older.to_str().unwrap()]);
    assert_eq!(records(&events).len(), 1 + 1 + 8, "resumed at step 4: steps 0-4 kept, 5-8 trained again");
    assert!(records(&events)[0].windows(13).any(|w| w == b"brain.Event:2"));

    let python = std::env::var("WORKBOOK_PYTHON").unwrap_or_else(|_| "python3".into());
    let script = "import sys\n\
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator\n\
        acc = EventAccumulator(sys.argv[1]); acc.Reload()\n\
        print(len(acc.Scalars('train/loss')), [e.step for e in acc.Scalars('eval/loss')], \
              len(acc.Scalars('train/skipped_steps')), len(acc.Scalars('memory/rank_0_mib')))";
    match Command::new(&python).args(["-c", script]).arg(&dir).output() {
        Ok(out) if out.status.success() => {
            assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "8 [0, 4, 8] 8 9", "what TensorBoard read");
        }
        _ => println!("skipped TensorBoard's own reader: `{python}` has no tensorboard package"),
    }
}

/// Every step logs each rank's memory, rank 0 first, where the system
/// reports it (Linux: the peak resident memory of each rank's process).
#[cfg(target_os = "linux")]
#[test]
fn every_ranks_memory_is_logged_at_every_step() {
    let dir = scratch("tensorboard-memory");
    train(&dir, 2, &["--nproc", "2"]);
    let log = std::fs::read_to_string(dir.join("metrics.jsonl")).unwrap();
    for line in log.lines() {
        let record: serde_json::Value = serde_json::from_str(line).unwrap();
        let memory = record["memory_mib"].as_array().unwrap_or_else(|| panic!("no memory_mib in {line}"));
        assert_eq!(memory.len(), 2, "one figure per rank: {line}");
        // Each rank is a process that loaded a model: tens of MiB at least.
        assert!(memory.iter().all(|m| m.as_f64().unwrap() > 10.0), "{line}");
        assert_eq!(record["skipped_steps"], 0, "{line}");
    }
}
