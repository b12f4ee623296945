//! Everything the tool prints: styles, the exercise card, the exercise list,
//! test verdicts. Colour is plain ANSI and only used when stdout is a
//! terminal (and `NO_COLOR` is unset), so piped output stays clean text.

use std::collections::BTreeSet;
use std::io::IsTerminal;
use std::sync::OnceLock;

use crate::grading::{unfinished_exercise, Outcome, TestResult};
use crate::lean::{ranges, ranges_by};
use crate::metadata::{Exercise, Hint, Workbook};
use crate::progress::{HintsRead, State};
use crate::standing::Standing;

/// Column at which wrapped text continues, after a field label.
const LABEL_WIDTH: usize = 12;
const LINE_WIDTH: usize = 88;

fn colour() -> bool {
    static COLOUR: OnceLock<bool> = OnceLock::new();
    *COLOUR.get_or_init(|| std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none())
}

fn paint(code: &str, text: &str) -> String {
    if colour() {
        format!("\x1b[{code}m{text}\x1b[0m")
    } else {
        text.to_string()
    }
}

pub fn bold(text: &str) -> String {
    paint("1", text)
}

pub fn green(text: &str) -> String {
    paint("32", text)
}

pub fn red(text: &str) -> String {
    paint("31", text)
}

pub fn yellow(text: &str) -> String {
    paint("33", text)
}

pub fn dim(text: &str) -> String {
    paint("2", text)
}

/// Clears the terminal (used by `watch` before each run); no-op when piped.
pub fn clear_screen() {
    if colour() {
        print!("\x1b[2J\x1b[H");
    }
}

/// A labelled line, the value wrapped under itself: `  concept     Tensor ...`.
pub fn field(label: &str, value: &str) {
    println!("  {label:<width$}{}", wrap(value, LABEL_WIDTH + 2), width = LABEL_WIDTH);
}

/// Greedy word wrap at `LINE_WIDTH`; continuation lines start at `indent`.
pub fn wrap(text: &str, indent: usize) -> String {
    let mut wrapped = String::new();
    let mut column = indent;
    for word in text.split_whitespace() {
        let len = word.chars().count();
        if column > indent && column + 1 + len > LINE_WIDTH {
            wrapped.push('\n');
            wrapped.push_str(&" ".repeat(indent));
            column = indent;
        } else if column > indent {
            wrapped.push(' ');
            column += 1;
        }
        wrapped.push_str(word);
        column += len;
    }
    wrapped
}

/// Indents every line of a multi-line text.
pub fn indented(text: &str, by: usize) -> String {
    let pad = " ".repeat(by);
    text.lines().map(|line| format!("{pad}{line}")).collect::<Vec<_>>().join("\n")
}

/// Names as code, in words: `` `a` ``, `` `a` and `b` ``, `` `a`, `b` and `c` ``.
pub fn code_list(names: &[String]) -> String {
    let quoted: Vec<String> = names.iter().map(|name| format!("`{name}`")).collect();
    match quoted.split_last() {
        Some((last, [])) => last.clone(),
        Some((last, rest)) => format!("{} and {last}", rest.join(", ")),
        None => String::new(),
    }
}

/// An exercise of the chain another one calls, and where it stands.
pub struct Link {
    pub number: u32,
    pub state: State,
}

impl Link {
    /// Not done and not the reference: calling it may panic or go wrong.
    fn unfinished(&self) -> bool {
        !matches!(self.state, State::Done | State::Leaned | State::DoesNotParse)
    }
}

/// The card `next` shows: what to write, where, how to test it, and the
/// exercises it calls (the whole chain), with those still to do first.
pub fn exercise_card(workbook: &Workbook, exercise: &Exercise, position: &str, chain: &[Link], hints_read: u8) {
    let total = workbook.exercises.len();
    let phase = workbook.phase(exercise.phase).map(|p| p.title.as_str()).unwrap_or("?");
    println!("{}", bold(&format!("Exercise {} of {total}: {}", exercise.number, exercise.title)));
    println!("{}", dim(&format!("Phase {}: {phase}", exercise.phase)));
    println!();
    field("write", &code_list(&exercise.functions));
    field("in", position);
    field("concept", &exercise.concept);
    field("difficulty", &exercise.difficulty);
    field("read", &exercise.read);
    field("calls", &chain_in_words(workbook, chain));
    if let Some(caller) = &exercise.called_early_by {
        field("runs in", &format!("{caller}, which uses the reference body until you start this file"));
    }
    field("guide", &exercise.chapter_file().display().to_string());
    println!();
    field("test it", &format!("cargo test {}   (or: cargo xtask check {})", exercise.test_module(), exercise.number));
    let number = exercise.number;
    let stuck = hint_ladder(number, hints_read)
        .unwrap_or_else(|| format!("every tier of the hint read: `cargo xtask hint {number}` shows them again"));
    field("stuck?", &stuck);
    let unfinished: BTreeSet<u32> = chain.iter().filter(|link| link.unfinished()).map(|link| link.number).collect();
    if !unfinished.is_empty() {
        let list = ranges(&unfinished);
        println!();
        println!(
            "{}",
            yellow(&wrap(
                &format!(
                    "Its checks call exercise{} {list}, not done yet: do {} first, or run the reference body in \
                     {} place with `cargo xtask lean {list}`.",
                    if unfinished.len() == 1 { "" } else { "s" },
                    if unfinished.len() == 1 { "it" } else { "them" },
                    if unfinished.len() == 1 { "its" } else { "their" },
                ),
                0
            ))
        );
    }
}

/// `4 SwiGLU MLP (done), 20 Tensor-parallel MLP (not started)`; a longer
/// chain by state: `1-5, 7 (done); 6 (not started); 8-10 (reference)`.
fn chain_in_words(workbook: &Workbook, chain: &[Link]) -> String {
    let word = |state: &State| match state {
        State::Done => "done",
        State::Leaned => "reference",
        State::DoesNotParse => "does not parse",
        State::NotStarted => "not started",
        State::Failing => "failing",
        State::Unchecked => "not checked",
    };
    if chain.is_empty() {
        return "no other exercise: it stands on its own".to_string();
    }
    if chain.len() <= 3 {
        let named = chain.iter().map(|link| {
            let title = workbook.exercise(link.number).map(|e| e.title.as_str()).unwrap_or("?");
            format!("{} {title} ({})", link.number, word(&link.state))
        });
        return named.collect::<Vec<_>>().join(", ");
    }
    let by_state = ranges_by(chain.iter().map(|link| (link.number, word(&link.state))));
    let groups: Vec<String> = by_state.iter().map(|(state, numbers)| format!("{numbers} ({state})")).collect();
    format!("exercises {}", groups.join("; "))
}

/// What `list` says of an exercise in `state`; `check-phase` too, where it
/// has no count of checks to give instead.
pub fn state_label(state: State) -> String {
    match state {
        State::Done => green("done"),
        State::Failing => red("failing"),
        State::Unchecked => yellow("edited, not checked yet"),
        State::Leaned => dim("reference body (leaned on)"),
        State::DoesNotParse => red("does not parse: the reference runs in its place"),
        State::NotStarted => dim("not started"),
    }
}

/// One row of `list`; `leaned_calls` are the exercises it calls that run
/// the reference, which a done exercise's checks ran on.
pub fn list_row(exercise: &Exercise, state: State, leaned_calls: &BTreeSet<u32>, hints: HintsRead, title_width: usize) {
    let label = match state {
        State::Done if !leaned_calls.is_empty() => {
            format!("{}{}", state_label(state), dim(&format!(", calling the reference of {}", ranges(leaned_calls))))
        }
        _ => state_label(state),
    };
    let of = |tiers| format!("{tiers} of {} tiers", Hint::TIERS);
    let hints = match (hints.before_passing, hints.after_passing) {
        (0, 0) => String::new(),
        (before, after) if after <= before => dim(&format!("  (hint: {} read)", of(before))),
        (0, after) => dim(&format!("  (hint: {} read after passing)", of(after))),
        (before, after) => dim(&format!("  (hint: {} read, {after} after passing)", of(before))),
    };
    println!("  {:>2}  {:<title_width$}  {label}{hints}", exercise.number, exercise.title);
}

/// The hint command that shows the tier after the `read` ones already
/// read, and what the tiers after it give: plain `hint` shows the tiers
/// read (at least the first), and each `--more` one more, so the same
/// command goes one tier further each time. `None` once every tier is read.
pub fn hint_ladder(number: u32, read: u8) -> Option<String> {
    let gives = |tier: u8| {
        let heading = Hint::HEADINGS[usize::from(tier - 1)].to_lowercase();
        match tier == Hint::TIERS {
            true => format!("{heading} with the mistakes the checks catch"),
            false => heading,
        }
    };
    let next = read + 1;
    if next > Hint::TIERS {
        return None;
    }
    let later: Vec<String> = (next + 1..=Hint::TIERS).map(gives).collect();
    let first = match read {
        0 => format!("`cargo xtask hint {number}` gives {}", gives(next)),
        _ => format!("`cargo xtask hint {number} --more` adds {}", gives(next)),
    };
    Some(match (read, later.is_empty()) {
        (_, true) => first,
        (0, false) => format!("{first}; each `--more` then adds a tier: {}", later.join(", then ")),
        (_, false) => format!("{first}; once more, {}", later.join(", then ")),
    })
}

/// `k/n done` (and how many are leaned on), green when all are done with the learner's own code.
pub fn standing(standing: &Standing) -> String {
    match standing.complete() {
        true => green(&standing.words()),
        false => standing.words(),
    }
}

/// Each test's verdict, with the failure message under a failing test.
/// A message identical to the one above it is not repeated. A test stopped
/// by another exercise's `todo!` says which exercise blocks it, and how to
/// go on, instead of that exercise's own hint.
pub fn verdicts<'a>(workbook: &Workbook, exercise: &Exercise, results: impl Iterator<Item = &'a TestResult>) {
    let module_prefix = exercise.test_filter();
    let mut previous: Option<String> = None;
    for result in results {
        let name = result.name.strip_prefix(&module_prefix).unwrap_or(&result.name);
        match result.outcome {
            Outcome::Passed => println!("  {} {name}", green("✓")),
            Outcome::Ignored => println!("  {} {name} {}", yellow("-"), dim("(ignored)")),
            Outcome::Failed => {
                println!("  {} {name}", red("✗"));
                let message = result.message.as_deref().unwrap_or("(no message)");
                let message = match unfinished_exercise(message).filter(|n| *n != exercise.number) {
                    Some(blocker) => blocked_by(workbook, exercise.number, blocker),
                    None => message.to_string(),
                };
                if previous.as_deref() == Some(message.as_str()) {
                    println!("{}", dim("      (same message as above)"));
                } else {
                    println!("{}", indented(&message, 6));
                }
                previous = Some(message);
            }
        }
    }
}

/// Why exercise `number`'s check stopped in exercise `blocker`'s `todo!`.
fn blocked_by(workbook: &Workbook, number: u32, blocker: u32) -> String {
    let title = workbook.exercise(blocker).map(|e| e.title.as_str()).unwrap_or("?");
    wrap(
        &format!(
            "This check calls exercise {blocker} ({title}), which still panics at its `todo!()`: do exercise \
             {blocker} first (`cargo xtask next {blocker}`), or run its reference body with `cargo xtask lean \
             {blocker}`. The check stopped there, so it says nothing yet about exercise {number}'s code."
        ),
        0,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn real() -> Workbook {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        Workbook::load(root).expect("the real info.toml parses")
    }

    #[test]
    fn a_short_chain_is_named_and_a_long_one_grouped_by_state() {
        let workbook = real();
        let link = |number, state| Link { number, state };
        let short = [link(4, State::Done), link(20, State::NotStarted)];
        assert_eq!(chain_in_words(&workbook, &short), "4 SwiGLU MLP (done), 20 Tensor-parallel MLP (not started)");
        let long: Vec<Link> = (1..=10)
            .map(|n| match n {
                6 => link(n, State::Failing),
                8.. => link(n, State::Leaned),
                _ => link(n, State::Done),
            })
            .collect();
        assert_eq!(chain_in_words(&workbook, &long), "exercises 1-5, 7 (done); 6 (failing); 8-10 (reference)");
        assert_eq!(chain_in_words(&workbook, &[]), "no other exercise: it stands on its own");
    }

    #[test]
    fn a_check_blocked_by_another_exercise_names_it_and_both_ways_on() {
        let text = blocked_by(&real(), 18, 8).replace('\n', " ");
        assert!(text.contains("exercise 8 (AdamW parameter groups)"), "{text}");
        assert!(text.contains("`cargo xtask lean 8`") && text.contains("`cargo xtask next 8`"), "{text}");
        assert!(text.contains("nothing yet about exercise 18's code"), "{text}");
    }

    #[test]
    fn the_hint_ladder_says_what_each_further_tier_gives() {
        let fresh = hint_ladder(5, 0).unwrap();
        assert_eq!(
            fresh,
            "`cargo xtask hint 5` gives the idea; each `--more` then adds a tier: the pieces, then the recipe with \
             the mistakes the checks catch"
        );
        let after_the_idea = hint_ladder(5, 1).unwrap();
        assert_eq!(
            after_the_idea,
            "`cargo xtask hint 5 --more` adds the pieces; once more, the recipe with the mistakes the checks catch"
        );
        assert!(hint_ladder(5, 2).unwrap().starts_with("`cargo xtask hint 5 --more` adds the recipe"));
        assert_eq!(hint_ladder(5, Hint::TIERS), None);
    }

    #[test]
    fn wraps_long_values_under_themselves() {
        let text = "word ".repeat(30);
        let wrapped = wrap(&text, 14);
        let lines: Vec<&str> = wrapped.lines().collect();
        assert!(lines.len() > 1);
        assert!(lines[1..].iter().all(|line| line.starts_with(&" ".repeat(14)) && line.len() <= LINE_WIDTH));
        assert!(lines[0].len() <= LINE_WIDTH - 14);
        assert_eq!(wrap("short  text", 14), "short text");
    }

    #[test]
    fn code_lists_read_as_words() {
        let names = |names: &[&str]| names.iter().map(|n| n.to_string()).collect::<Vec<_>>();
        assert_eq!(code_list(&names(&["Mlp::forward"])), "`Mlp::forward`");
        assert_eq!(code_list(&names(&["save", "load"])), "`save` and `load`");
        assert_eq!(code_list(&names(&["a", "b", "c"])), "`a`, `b` and `c`");
    }
}
