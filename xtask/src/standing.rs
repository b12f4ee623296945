//! Progress counted the same way in every report: done means the learner's
//! own code passes. Exercises leaned on the reference pass too, on code the
//! learner did not write, so they are counted apart and named, as are those
//! not done yet.

use std::collections::{BTreeMap, BTreeSet};

use crate::lean::ranges;
use crate::metadata::{Exercise, Workbook};
use crate::progress::State;

/// Where a set of exercises stands, by number.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Standing {
    /// Your code passes every graded test.
    pub done: BTreeSet<u32>,
    /// The reference body runs in place of yours.
    pub leaned: BTreeSet<u32>,
    /// Not started, failing, edited since the tests last ran, or a file
    /// that does not parse (the reference runs there, not by choice).
    pub open: BTreeSet<u32>,
}

impl Standing {
    pub fn of(states: impl IntoIterator<Item = (u32, State)>) -> Self {
        let mut standing = Self::default();
        for (number, state) in states {
            let bucket = match state {
                State::Done => &mut standing.done,
                State::Leaned => &mut standing.leaned,
                State::Failing | State::Unchecked | State::DoesNotParse | State::NotStarted => &mut standing.open,
            };
            bucket.insert(number);
        }
        standing
    }

    pub fn total(&self) -> usize {
        self.done.len() + self.leaned.len() + self.open.len()
    }

    /// Every exercise done, all of them with the learner's own code.
    pub fn complete(&self) -> bool {
        self.leaned.is_empty() && self.open.is_empty()
    }

    /// `11/27 done`, with `, 16 leaned on the reference` when some are.
    pub fn words(&self) -> String {
        let done = format!("{}/{} done", self.done.len(), self.total());
        match self.leaned.len() {
            0 => done,
            leaned => format!("{done}, {leaned} leaned on the reference"),
        }
    }

    /// What stands between the learner and every exercise done with their own
    /// code, one sentence each: how many pass, which are leaned on and how to
    /// take them back, which are still to do.
    pub fn what_is_left(&self) -> Vec<String> {
        let mut lines = vec![format!("{}/{} exercises pass with your own code.", self.done.len(), self.total())];
        if !self.leaned.is_empty() {
            lines.push(format!(
                "{} {} on the reference: `cargo xtask lean --off {}` puts your code back, and \
                 `cargo xtask next` then shows the first to do.",
                exercises(&self.leaned),
                if self.leaned.len() == 1 { "leans" } else { "lean" },
                ranges(&self.leaned),
            ));
        }
        if !self.open.is_empty() {
            lines.push(format!(
                "{} {} not done yet: `cargo xtask next` shows the first.",
                exercises(&self.open),
                if self.open.len() == 1 { "is" } else { "are" },
            ));
        }
        lines
    }
}

/// `Exercise 6` or `Exercises 1-5, 7`.
fn exercises(numbers: &BTreeSet<u32>) -> String {
    match numbers.len() {
        1 => format!("Exercise {}", ranges(numbers)),
        _ => format!("Exercises {}", ranges(numbers)),
    }
}

/// `check-phase`'s last line, and whether the phase passes: how many of its
/// exercises (their `states`, in any order) pass with the learner's own
/// code, how many run the reference leaned on in their place (it passes, on
/// code the learner did not write), how many are not started, and its checks
/// as a whole (`whole_phase`, when it has them). Only the learner's own code
/// makes the phase pass.
pub fn phase_summary(phase: u32, states: &[State], whole_phase: Option<bool>) -> (String, bool) {
    let count = |wanted: State| states.iter().filter(|&&state| state == wanted).count();
    let (done, leaned, not_started) = (count(State::Done), count(State::Leaned), count(State::NotStarted));
    let mut summary = format!("phase {phase}: {done}/{} exercises pass with your own code", states.len());
    if leaned > 0 {
        summary += &format!(", {leaned} with the reference leaned on");
    }
    if not_started > 0 {
        summary += &format!("; {not_started} not started");
    }
    match whole_phase {
        Some(true) if leaned > 0 => summary += "; its checks as a whole pass with the reference leaned on",
        Some(true) => summary += "; its checks as a whole pass",
        Some(false) => summary += "; its checks as a whole do not pass yet",
        None => {}
    }
    (summary, done == states.len() && whole_phase != Some(false))
}

/// The phase that ends just before `exercise`, when `exercise` opens a new
/// one and the learner's own code passes every exercise of that phase.
pub fn phase_completed_before(workbook: &Workbook, exercise: &Exercise, states: &BTreeMap<u32, State>) -> Option<u32> {
    let previous = workbook.exercise(exercise.number.checked_sub(1)?).ok()?;
    let phase = (previous.phase != exercise.phase).then_some(previous.phase)?;
    let in_phase = workbook.exercises_in(phase).map(|e| (e.number, states.get(&e.number).copied()));
    let standing = Standing::of(in_phase.map(|(number, state)| (number, state.unwrap_or(State::Unchecked))));
    standing.complete().then_some(phase)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn real() -> Workbook {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        Workbook::load(root).expect("the real info.toml parses")
    }

    fn every(workbook: &Workbook, state: impl Fn(u32) -> State) -> BTreeMap<u32, State> {
        workbook.exercises.iter().map(|e| (e.number, state(e.number))).collect()
    }

    #[test]
    fn a_workbook_leaned_on_throughout_is_not_done() {
        let workbook = real();
        let n = workbook.exercises.len();
        let standing = Standing::of(every(&workbook, |_| State::Leaned));
        assert!(!standing.complete());
        assert_eq!(standing.words(), format!("0/{n} done, {n} leaned on the reference"));
        let left = standing.what_is_left().join(" ");
        assert!(left.starts_with(&format!("0/{n} exercises pass with your own code.")), "{left}");
        assert!(
            left.contains(&format!("Exercises 1-{n} lean on the reference: `cargo xtask lean --off 1-{n}`")),
            "{left}"
        );
    }

    #[test]
    fn leaned_exercises_are_counted_apart_from_yours() {
        let workbook = real();
        let n = workbook.exercises.len();
        let standing = Standing::of(every(&workbook, |number| if number <= 11 { State::Done } else { State::Leaned }));
        assert!(!standing.complete());
        assert_eq!(standing.words(), format!("11/{n} done, {} leaned on the reference", n - 11));
        let standing = Standing::of(every(&workbook, |number| if number == 3 { State::Failing } else { State::Done }));
        assert_eq!(standing.words(), format!("{}/{n} done", n - 1));
        assert_eq!(standing.what_is_left()[1], "Exercise 3 is not done yet: `cargo xtask next` shows the first.");
        assert!(Standing::of(every(&workbook, |_| State::Done)).complete());
    }

    #[test]
    fn check_phase_tells_your_code_from_the_reference_and_the_stub() {
        let leaned = [State::Leaned; 7];
        assert_eq!(
            phase_summary(1, &leaned, None),
            ("phase 1: 0/7 exercises pass with your own code, 7 with the reference leaned on".to_string(), false)
        );
        let (done, leaned) = (State::Done, State::Leaned);
        let mixed = [done, done, leaned, leaned, leaned, State::NotStarted, State::Failing];
        let (summary, passes) = phase_summary(3, &mixed, Some(false));
        assert_eq!(
            summary,
            "phase 3: 2/7 exercises pass with your own code, 3 with the reference leaned on; 1 not started; its \
             checks as a whole do not pass yet"
        );
        assert!(!passes);
        let (summary, passes) = phase_summary(2, &[State::Done, State::Leaned], Some(true));
        assert_eq!(
            summary,
            "phase 2: 1/2 exercises pass with your own code, 1 with the reference leaned on; its checks as a whole \
             pass with the reference leaned on"
        );
        assert!(!passes, "the reference passing is not the learner's code passing");
        let yours = [State::Done; 7];
        let all = "phase 1: 7/7 exercises pass with your own code";
        assert_eq!(phase_summary(1, &yours, Some(true)), (format!("{all}; its checks as a whole pass"), true));
        assert_eq!(phase_summary(1, &yours, None), (all.to_string(), true));
        assert!(!phase_summary(1, &yours, Some(false)).1);
    }

    #[test]
    fn a_phase_is_complete_only_when_your_code_passes_all_of_it() {
        let workbook = real();
        let first_of_phase_4 = workbook.exercises_in(4).min_by_key(|e| e.number).unwrap();
        let fresh = every(&workbook, |_| State::NotStarted);
        assert_eq!(phase_completed_before(&workbook, first_of_phase_4, &fresh), None);
        let leaned = every(&workbook, |n| if n == 12 { State::Leaned } else { State::Done });
        assert_eq!(phase_completed_before(&workbook, first_of_phase_4, &leaned), None);
        let yours = every(&workbook, |_| State::Done);
        assert_eq!(phase_completed_before(&workbook, first_of_phase_4, &yours), Some(3));
        let inside_a_phase = workbook.exercise(2).unwrap();
        assert_eq!(phase_completed_before(&workbook, inside_a_phase, &yours), None);
    }
}
