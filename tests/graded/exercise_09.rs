//! Exercise 9: warmup + cosine schedule. Reference: tests/fixtures/generate.py, `exercise_09`.

use std::cmp::Ordering;

use rstest::rstest;
use workbook::phase2_training::get_lr;
use workbook::train::CosineSchedule;

use crate::support::{fixture, mistake, number, value_failure};

fn schedule() -> CosineSchedule {
    let s = fixture(9).get("schedule").to_vec1::<f64>().unwrap();
    CosineSchedule { max_lr: s[0], min_lr: s[1], warmup_steps: s[2] as usize, max_steps: s[3] as usize }
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-12 + 1e-9 * b.abs()
}

#[test]
fn matches_the_reference_at_every_checked_step() {
    let f = fixture(9);
    let steps = f.get("steps").to_vec1::<i64>().unwrap();
    let expected = f.get("lr").to_vec1::<f64>().unwrap();
    let lrs: Vec<f64> = steps.iter().map(|&s| get_lr(s as usize, &schedule())).collect();
    let mistakes = f.mistakes(&["warmup_from_zero", "decay_to_zero", "cosine_not_offset", "no_clamp"]);
    let Some(first) = lrs.iter().zip(&expected).position(|(&got, &want)| !close(got, want)) else { return };
    // A mistake is the cause only when the whole schedule is that mistake's:
    // at one step, other mistakes (an integer division) give the same value.
    let same_everywhere = |output: &[f64]| lrs.iter().zip(output).all(|(&got, &theirs)| close(got, theirs));
    // The fixture's decay_to_zero reaches its own floor, 0, from max_steps
    // on; a cosine that decays to 0 beside a clamp to min_lr there is the
    // same mistake, whichever of the two each step from max_steps gives.
    let s = schedule();
    let decays_to_zero = |output: &[f64]| {
        let at = |(i, (&got, &theirs)): (usize, (&f64, &f64))| {
            close(got, theirs) || (steps[i] as usize >= s.max_steps && close(got, s.min_lr))
        };
        lrs.iter().zip(output).enumerate().all(at)
    };
    let matched = mistakes
        .iter()
        .find(|(cause, output)| {
            let output = output.to_vec1::<f64>().unwrap();
            same_everywhere(&output) || (*cause == mistake(9, "decay_to_zero") && decays_to_zero(&output))
        })
        .map(|(cause, _)| *cause);
    panic!("{}", value_failure(&format!("get_lr({})", steps[first]), lrs[first], expected[first], matched));
}

/// The schedule's corners, each a value a formula off by one step would miss.
#[rstest]
#[case::first_step_is_not_zero(0)]
#[case::warmup_ends_at_max_lr(1)]
#[case::decay_starts_at_max_lr(2)]
#[case::ends_at_min_lr(3)]
#[case::stays_at_min_lr(4)]
fn boundaries(#[case] corner: usize) {
    let s = schedule();
    let (max, min, warmup, end) = (s.max_lr, s.min_lr, s.warmup_steps, s.max_steps);
    let (step, want) =
        [(0, max / warmup as f64), (warmup - 1, max), (warmup, max), (end, min), (10 * end, min)][corner];
    let got = get_lr(step, &s);
    assert!(close(got, want), "{}", value_failure(&format!("get_lr({step})"), got, want, None));
}

/// With warmup_steps equal to max_steps no step is left to decay over: the
/// cosine's progress would be 0/0. The rate must stay a number, min_lr from
/// max_steps on.
#[test]
fn a_warmup_as_long_as_the_run_gives_no_nan() {
    let s = CosineSchedule { max_lr: 2e-3, min_lr: 2e-4, warmup_steps: 5, max_steps: 5 };
    for step in 0..12 {
        let got = get_lr(step, &s);
        let want = if step < 5 { 2e-3 * (step + 1) as f64 / 5.0 } else { 2e-4 };
        // 0/0 is the one thing this test adds to the others; any other wrong value is theirs to explain.
        let why = if got.is_nan() { "; computing the cosine there divides 0 by 0" } else { "" };
        let from_max_steps = if step >= 5 { ": from max_steps on the rate is min_lr" } else { "" };
        assert!(
            close(got, want),
            "{} (warmup_steps = max_steps = 5{from_max_steps}{why})",
            value_failure(&format!("get_lr({step})"), got, want, None)
        );
    }
}

#[test]
fn rises_during_warmup_and_never_rises_after() {
    let s = schedule();
    let lrs: Vec<f64> = (0..=150).map(|step| get_lr(step, &s)).collect();
    for step in 1..=150 {
        let (before, now) = (lrs[step - 1], lrs[step]);
        let rises = now > before + 1e-15;
        let (broken, rule) = match step.cmp(&s.warmup_steps) {
            Ordering::Less => (now <= before, "the rate must rise during warmup".to_string()),
            Ordering::Equal => (
                rises,
                format!(
                    "the rate must not rise from the last warmup step to the first after it (warmup ends at max_lr, \
                     at step warmup_steps − 1 = {})",
                    step - 1
                ),
            ),
            Ordering::Greater => (rises, "the rate must not rise after warmup".to_string()),
        };
        assert!(!broken, "{rule}: step {} {} → step {step} {}", step - 1, number(before), number(now));
    }
}
