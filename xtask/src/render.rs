//! Everything the tool prints: styles, the exercise card, the exercise list,
//! test verdicts. Colour is plain ANSI and only used when stdout is a
//! terminal (and `NO_COLOR` is unset), so piped output stays clean text.

use std::io::IsTerminal;
use std::sync::OnceLock;

use crate::grading::{Outcome, TestResult};
use crate::metadata::{Exercise, Hint, Workbook};
use crate::progress::State;

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

/// The card `next` shows: what to write, where, and how to test it.
pub fn exercise_card(workbook: &Workbook, exercise: &Exercise, position: &str) {
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
    field("insight", &exercise.insight);
    field("depends on", &dependencies(workbook, exercise));
    field("guide", &exercise.chapter_file().display().to_string());
    println!();
    field("test it", &format!("cargo test {}   (or: cargo xtask check {})", exercise.test_module(), exercise.number));
    field("stuck?", &format!("cargo xtask hint {}   (the idea; add --more for the next tier)", exercise.number));
}

fn dependencies(workbook: &Workbook, exercise: &Exercise) -> String {
    if exercise.depends.is_empty() {
        return "nothing: it stands on its own".to_string();
    }
    let named: Vec<String> = exercise
        .depends
        .iter()
        .map(|&n| match workbook.exercise(n) {
            Ok(dependency) => format!("{n} ({})", dependency.title),
            Err(_) => n.to_string(),
        })
        .collect();
    named.join(", ")
}

/// One row of `list`.
pub fn list_row(exercise: &Exercise, state: State, hint_tiers: u8, title_width: usize) {
    let label = match state {
        State::Done => green("done"),
        State::Failing => red("failing"),
        State::NotStarted => dim("not started"),
        State::Unchecked => yellow("edited, not checked yet"),
    };
    let hints = match hint_tiers {
        0 => String::new(),
        tiers => dim(&format!("  (hint: {tiers} of {} tiers read)", Hint::TIERS)),
    };
    println!("  {:>2}  {:<title_width$}  {label}{hints}", exercise.number, exercise.title);
}

/// `k/n done`, green when complete.
pub fn tally(done: usize, total: usize) -> String {
    let text = format!("{done}/{total} done");
    if done == total {
        green(&text)
    } else {
        text
    }
}

/// Each test's verdict, with the failure message under a failing test.
/// A message identical to the one above it is not repeated.
pub fn verdicts<'a>(results: impl Iterator<Item = &'a TestResult>, module_prefix: &str) {
    let mut previous: Option<&str> = None;
    for result in results {
        let name = result.name.strip_prefix(module_prefix).unwrap_or(&result.name);
        match result.outcome {
            Outcome::Passed => println!("  {} {name}", green("✓")),
            Outcome::Ignored => println!("  {} {name} {}", yellow("-"), dim("(ignored)")),
            Outcome::Failed => {
                println!("  {} {name}", red("✗"));
                let message = result.message.as_deref().unwrap_or("(no message)");
                if previous == Some(message) {
                    println!("{}", dim("      (same message as above)"));
                } else {
                    println!("{}", indented(message, 6));
                }
                previous = Some(message);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
