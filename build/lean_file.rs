//! `exercises/lean.txt`: the exercises whose reference body the crate compiles
//! in place of the learner's. Read by the build script, written by `cargo
//! xtask lean`; both compile this one file, so they agree on its format (the
//! tests' build script parses its lists too).
//!
//! The format: `#` comments, then exercise numbers and ranges separated by
//! commas or spaces, e.g. `1-15, 17`.

// Each program that compiles this file uses part of it.
#![allow(dead_code)]

use std::collections::BTreeSet;
use std::path::Path;

/// Where the choice is kept, relative to the repository root.
pub const LEAN_FILE: &str = "exercises/lean.txt";

/// When set, replaces the file: the workbook's own checks choose their bodies
/// whatever a learner leans on (empty: every exercise is the learner's).
pub const LEAN_VARIABLE: &str = "WORKBOOK_LEAN";

const HEADER: &str = "# The exercises whose reference body (solutions/) is compiled in place of yours.\n\
                      # Written by `cargo xtask lean`; your files in exercises/ are never touched.\n";

/// The file's exercises: none when it is absent; the offending word when garbled.
pub fn read(root: &Path) -> Result<BTreeSet<u32>, String> {
    let Ok(text) = std::fs::read_to_string(root.join(LEAN_FILE)) else { return Ok(BTreeSet::new()) };
    let list: Vec<&str> = text.lines().filter(|line| !line.trim_start().starts_with('#')).collect();
    parse(&list.join(" "))
}

/// `1-5, 7 9` to {1, 2, 3, 4, 5, 7, 9}; the offending word on error.
pub fn parse(list: &str) -> Result<BTreeSet<u32>, String> {
    let mut numbers = BTreeSet::new();
    for word in list.split(|c: char| c == ',' || c.is_whitespace()).filter(|w| !w.is_empty()) {
        let bound = |s: &str| s.trim().parse::<u32>().map_err(|_| word.to_string());
        match word.split_once('-') {
            Some((first, last)) if bound(first)? <= bound(last)? => numbers.extend(bound(first)?..=bound(last)?),
            Some(_) => return Err(word.to_string()),
            None => {
                numbers.insert(bound(word)?);
            }
        }
    }
    Ok(numbers)
}

/// Runs of consecutive numbers as ranges: {1, 2, 3, 5} to `1-3, 5`.
pub fn ranges(numbers: &BTreeSet<u32>) -> String {
    let mut runs: Vec<(u32, u32)> = Vec::new();
    for &n in numbers {
        match runs.last_mut() {
            Some((_, last)) if *last + 1 == n => *last = n,
            _ => runs.push((n, n)),
        }
    }
    let words: Vec<String> =
        runs.iter().map(|&(a, b)| if a == b { a.to_string() } else { format!("{a}-{b}") }).collect();
    words.join(", ")
}

/// Numbers gathered under their labels, in the order the labels first come,
/// each group written as [`ranges`]: `[(1, "done"), (2, "done"), (6, "new")]`
/// to `[("done", "1-2"), ("new", "6")]`.
pub fn ranges_by<'a>(labelled: impl IntoIterator<Item = (u32, &'a str)>) -> Vec<(&'a str, String)> {
    let mut groups: Vec<(&str, BTreeSet<u32>)> = Vec::new();
    for (number, label) in labelled {
        match groups.iter_mut().find(|(seen, _)| *seen == label) {
            Some((_, numbers)) => {
                numbers.insert(number);
            }
            None => groups.push((label, [number].into())),
        }
    }
    groups.into_iter().map(|(label, numbers)| (label, ranges(&numbers))).collect()
}

/// The file's text for `numbers`.
pub fn render(numbers: &BTreeSet<u32>) -> String {
    format!("{HEADER}{}\n", ranges(numbers))
}
