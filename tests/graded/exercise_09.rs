//! Exercise 9: warmup + cosine schedule. Reference: tests/fixtures/generate.py, `exercise_09`.

use rstest::rstest;
use workbook::phase2_training::get_lr;
use workbook::train::CosineSchedule;

use crate::support::{fixture, number, value_failure};

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
    for (i, (&step, (&got, &want))) in steps.iter().zip(lrs.iter().zip(&expected)).enumerate() {
        if close(got, want) {
            continue;
        }
        let matched = mistakes
            .iter()
            .find(|(_, output)| close(got, output.to_vec1::<f64>().unwrap()[i]))
            .map(|(cause, _)| *cause);
        panic!("{}", value_failure(&format!("get_lr({step})"), got, want, matched));
    }
}

#[rstest]
#[case::first_step_is_not_zero(0, 6e-5)]
#[case::warmup_ends_at_max_lr(9, 6e-4)]
#[case::decay_starts_at_max_lr(10, 6e-4)]
#[case::ends_at_min_lr(100, 6e-5)]
#[case::stays_at_min_lr(1000, 6e-5)]
fn boundaries(#[case] step: usize, #[case] want: f64) {
    let got = get_lr(step, &schedule());
    assert!(close(got, want), "{}", value_failure(&format!("get_lr({step})"), got, want, None));
}

#[test]
fn rises_during_warmup_and_never_rises_after() {
    let s = schedule();
    let lrs: Vec<f64> = (0..=150).map(|step| get_lr(step, &s)).collect();
    for step in 1..=150 {
        let (before, now) = (lrs[step - 1], lrs[step]);
        if step < s.warmup_steps {
            assert!(
                now > before,
                "the rate must rise during warmup: step {} {} → step {step} {}",
                step - 1,
                number(before),
                number(now)
            );
        } else {
            assert!(
                now <= before + 1e-15,
                "the rate must not rise after warmup: step {} {} → step {step} {}",
                step - 1,
                number(before),
                number(now)
            );
        }
    }
}
