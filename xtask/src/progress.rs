//! The learner's last known progress, kept in a small plain-text file.
//!
//! `.workbook-progress` at the repository root holds a `format` line, one
//! line per exercise, e.g. `05 done`, and one per exercise whose hint was
//! read, e.g. `05 hints 2` (tiers seen before it passed) or `05
//! hints-after-passing 3` (once it had). A file without the format line is
//! from before it existed and reads the same; one from a newer format is
//! ignored. `check`, `next`, `list`, `hint` and `reset` rewrite it; `list
//! --quick` reads it instead of running the tests. It is only a record:
//! deleting it loses nothing but the hint tiers seen.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, Result};

#[path = "../../build/body.rs"]
mod body;

pub use body::Body;

/// The file's name, relative to the repository root.
pub const PROGRESS_FILE: &str = ".workbook-progress";

/// The layout this tool writes (its `format` line).
const FORMAT: u32 = 3;

const HEADER: &str = "# Last known state of each exercise, written by `cargo xtask` (check, next, list, reset).\n\
                      # States: done, failing, unchecked (your code), leaned (the reference runs), does-not-parse\n\
                      # (the reference runs until your file parses), not-started;\n\
                      # `NN hints K`: K hint tiers read before passing; `NN hints-after-passing K`: after.\n";

/// The words before a count of hint tiers read: before the exercise passed, and after.
const BEFORE_PASSING: &str = "hints";
const AFTER_PASSING: &str = "hints-after-passing";

/// Where an exercise stands. Every report keeps four cases apart: the
/// learner's own code (done, failing, or edited since it was graded), the
/// reference body leaned on in its place, the reference compiled in place of
/// a file that does not parse, and the shipped stub. Only the first can be
/// done: the reference passes on code the learner did not write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// Your code: every graded test passes.
    Done,
    /// Your code: some graded test fails.
    Failing,
    /// Your code, edited since the tests last ran.
    Unchecked,
    /// Leaned on (`cargo xtask lean`): the build compiles the reference body in place of yours.
    Leaned,
    /// Your file does not parse: the build compiles the reference body in its place until it does.
    DoesNotParse,
    /// The shipped `todo!` stub, not leaned on.
    NotStarted,
}

impl State {
    /// The word used in the progress file.
    pub fn word(self) -> &'static str {
        match self {
            State::Done => "done",
            State::Failing => "failing",
            State::Unchecked => "unchecked",
            State::Leaned => "leaned",
            State::DoesNotParse => "does-not-parse",
            State::NotStarted => "not-started",
        }
    }

    /// Whether the learner's own code runs (not the reference, not the stub).
    pub fn is_yours(self) -> bool {
        matches!(self, State::Done | State::Failing | State::Unchecked)
    }

    /// What can be told without running the tests from the body the build
    /// compiles: leaned on, a file that does not parse, still the stub, or
    /// else the learner's code as last graded (unchecked when it never was,
    /// or when it was the reference or the stub then).
    pub fn known(body: Body, recorded: Option<State>) -> State {
        match body {
            Body::Leaned => State::Leaned,
            Body::DoesNotParse => State::DoesNotParse,
            Body::NotStarted => State::NotStarted,
            Body::Yours => recorded.filter(|graded| graded.is_yours()).unwrap_or(State::Unchecked),
        }
    }

    fn from_word(word: &str) -> Option<Self> {
        [State::Done, State::Failing, State::Unchecked, State::Leaned, State::DoesNotParse, State::NotStarted]
            .into_iter()
            .find(|state| state.word() == word)
    }
}

/// How many tiers of one exercise's hint were read before it passed, and
/// after: a tier read to compare with a finished answer is no help given.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HintsRead {
    pub before_passing: u8,
    pub after_passing: u8,
}

impl HintsRead {
    /// The most tiers read at any time: what `hint` shows again.
    pub fn seen(self) -> u8 {
        self.before_passing.max(self.after_passing)
    }
}

/// Exercise number to state, and to the hint tiers read.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Progress {
    states: BTreeMap<u32, State>,
    hints: BTreeMap<u32, HintsRead>,
}

impl Progress {
    /// Reads the progress file; a missing or garbled file is an empty record.
    pub fn load(root: &Path) -> Self {
        std::fs::read_to_string(root.join(PROGRESS_FILE)).map_or_else(|_| Self::default(), |text| Self::parse(&text))
    }

    /// Writes the progress file.
    pub fn save(&self, root: &Path) -> Result<()> {
        let path = root.join(PROGRESS_FILE);
        std::fs::write(&path, self.render()).with_context(|| format!("cannot write {}", path.display()))
    }

    pub fn get(&self, number: u32) -> Option<State> {
        self.states.get(&number).copied()
    }

    pub fn set(&mut self, number: u32, state: State) {
        self.states.insert(number, state);
    }

    /// How many tiers of exercise `number`'s hint were read (none by default).
    pub fn hints(&self, number: u32) -> HintsRead {
        self.hints.get(&number).copied().unwrap_or_default()
    }

    /// Records that `tiers` tiers of the hint were read, before or after the
    /// exercise passed; never lowers a count.
    pub fn read_hint(&mut self, number: u32, tiers: u8, after_passing: bool) {
        let read = self.hints.entry(number).or_default();
        let count = if after_passing { &mut read.after_passing } else { &mut read.before_passing };
        *count = (*count).max(tiers);
    }

    /// Drops exercises that no longer exist.
    pub fn retain(&mut self, mut keep: impl FnMut(u32) -> bool) {
        self.states.retain(|number, _| keep(*number));
        self.hints.retain(|number, _| keep(*number));
    }

    fn parse(text: &str) -> Self {
        let format = text.lines().find_map(|line| line.trim().strip_prefix("format ")?.trim().parse::<u32>().ok());
        if format.is_some_and(|format| format > FORMAT) {
            return Self::default(); // written by a newer tool: only a cache, so start afresh
        }
        let mut progress = Self::default();
        for line in text.lines().filter(|line| !line.starts_with('#')) {
            let Some((number, rest)) = line.trim().split_once(' ') else { continue };
            let Ok(number) = number.parse() else { continue };
            match rest.trim().split_once(' ') {
                Some((word @ (BEFORE_PASSING | AFTER_PASSING), tiers)) => {
                    if let Ok(tiers) = tiers.trim().parse() {
                        progress.read_hint(number, tiers, word == AFTER_PASSING);
                    }
                }
                _ => {
                    if let Some(state) = State::from_word(rest.trim()) {
                        progress.set(number, state);
                    }
                }
            }
        }
        progress
    }

    fn render(&self) -> String {
        let mut text = format!("{HEADER}format {FORMAT}\n");
        for (number, state) in &self.states {
            text.push_str(&format!("{number:02} {}\n", state.word()));
        }
        for (number, read) in &self.hints {
            for (word, tiers) in [(BEFORE_PASSING, read.before_passing), (AFTER_PASSING, read.after_passing)] {
                if tiers > 0 {
                    text.push_str(&format!("{number:02} {word} {tiers}\n"));
                }
            }
        }
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_through_its_text_form() {
        let mut progress = Progress::default();
        progress.set(5, State::Failing);
        progress.set(1, State::Done);
        progress.set(12, State::NotStarted);
        progress.read_hint(5, 2, false);
        progress.read_hint(5, 1, false); // reading the first tier again keeps the count
        progress.read_hint(1, 3, true);
        let text = progress.render();
        let expected = "01 done\n05 failing\n12 not-started\n01 hints-after-passing 3\n05 hints 2\n";
        assert!(text.ends_with(expected), "{text}");
        assert_eq!(progress.hints(1), HintsRead { before_passing: 0, after_passing: 3 });
        assert_eq!(progress.hints(1).seen(), 3);
        assert_eq!(Progress::parse(&text), progress);
    }

    #[test]
    fn what_runs_decides_before_what_was_recorded() {
        let known =
            |leaned, parses, started: bool, recorded| State::known(Body::of(leaned, parses, !started), recorded);
        assert_eq!(known(true, true, true, Some(State::Done)), State::Leaned, "leaned: your verdict is not what runs");
        assert_eq!(known(true, false, true, None), State::Leaned, "leaned: the file is not compiled, parsed or not");
        assert_eq!(known(false, false, true, Some(State::Done)), State::DoesNotParse, "the reference runs instead");
        assert_eq!(known(false, false, false, None), State::DoesNotParse, "a stub that does not parse is not run");
        assert_eq!(known(false, true, false, Some(State::Done)), State::NotStarted, "reset to the stub");
        assert_eq!(known(false, true, true, Some(State::Failing)), State::Failing);
        assert_eq!(
            known(false, true, true, Some(State::Leaned)),
            State::Unchecked,
            "back from leaning: not graded yet"
        );
        assert_eq!(
            known(false, true, true, Some(State::DoesNotParse)),
            State::Unchecked,
            "parses again: not graded yet"
        );
        assert_eq!(known(false, true, true, None), State::Unchecked);
    }

    #[test]
    fn ignores_lines_it_cannot_read() {
        let progress = Progress::parse("# comment\n03 done\nnonsense\n04 finished\n 06  unchecked \n");
        assert_eq!(progress.get(3), Some(State::Done));
        assert_eq!(progress.get(4), None);
        assert_eq!(progress.get(6), Some(State::Unchecked));
    }

    #[test]
    fn reads_files_from_before_the_format_line_and_ignores_newer_ones() {
        assert_eq!(Progress::parse("03 done\n").get(3), Some(State::Done));
        assert_eq!(Progress::parse("format 2\n03 done\n").get(3), Some(State::Done));
        assert_eq!(Progress::parse("format 4\n03 done\n"), Progress::default());
    }
}
