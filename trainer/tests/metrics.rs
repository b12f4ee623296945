//! The metrics log survives what a run meets: non-finite values, a line torn
//! by a kill or a full disk, a resume that writes later steps again.

use trainer::metrics::{read_log, truncate_after, MetricsLog, StepRecord};

fn record(step: usize, loss: f64) -> StepRecord {
    StepRecord {
        step,
        loss,
        lr: 1e-3,
        grad_norm: f64::INFINITY,
        tokens_per_s: 10.0,
        elapsed_s: 1.0,
        eval_loss: None,
        memory_mib: vec![],
        skipped_steps: 0,
    }
}

fn scratch(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("trainer-metrics-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir.join("metrics.jsonl")
}

#[test]
fn non_finite_values_are_written_as_words_and_read_back() {
    let path = scratch("non-finite");
    let mut log = MetricsLog::open(path.parent().unwrap()).unwrap();
    log.record(&record(1, f64::NAN)).unwrap();
    log.record(&record(2, 2.5)).unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.contains(r#""loss":"NaN""#) && text.contains(r#""grad_norm":"inf""#), "{text}");
    let records = read_log(&path).unwrap();
    assert!(records[0].loss.is_nan() && records[0].grad_norm == f64::INFINITY);
    assert_eq!(records[1].loss, 2.5);
}

/// A bad line is left out of what is read, wherever it is: the log never
/// keeps a run from resuming.
#[test]
fn a_torn_last_line_and_a_bad_middle_line_are_left_out() {
    let path = scratch("torn");
    let good = serde_json::to_string(&record(1, 3.0)).unwrap();
    std::fs::write(&path, format!("{good}\n{{\"step\":2,\"lo")).unwrap();
    assert_eq!(read_log(&path).unwrap().len(), 1);
    std::fs::write(&path, format!("{{\"step\":2,\"lo\n{good}\n")).unwrap();
    let steps: Vec<usize> = read_log(&path).unwrap().iter().map(|r| r.step).collect();
    assert_eq!(steps, [1], "the bad first line is skipped, the good one after it read");
}

#[test]
fn null_from_older_runs_reads_as_nan() {
    let path = scratch("null");
    let line = r#"{"step":1,"loss":5.5,"lr":null,"grad_norm":5.9,"tokens_per_s":1600.0,"elapsed_s":1.2}"#;
    std::fs::write(&path, format!("{line}\n")).unwrap();
    assert!(read_log(&path).unwrap()[0].lr.is_nan());
}

#[test]
fn a_resume_keeps_the_steps_up_to_its_own() {
    let path = scratch("truncate");
    let mut log = MetricsLog::open(path.parent().unwrap()).unwrap();
    for step in 1..=5 {
        // A value whose shortest decimal serde_json's fast parser reads 1 ULP off.
        log.record(&record(step, 3.7496661671857683 * step as f64)).unwrap();
    }
    let before = std::fs::read_to_string(&path).unwrap();
    truncate_after(&path, 3).unwrap();
    let steps: Vec<usize> = read_log(&path).unwrap().iter().map(|r| r.step).collect();
    assert_eq!(steps, [1, 2, 3]);
    let kept: String = before.lines().take(3).map(|l| format!("{l}\n")).collect();
    assert_eq!(std::fs::read_to_string(&path).unwrap(), kept, "the kept lines are copied byte for byte");
}
