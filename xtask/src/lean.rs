//! `lean`: run the reference body of the exercises a learner skips, so that
//! any phase can be started first. The choice lives in `exercises/lean.txt`,
//! which the workbook's build script reads: plain `cargo test` and `cargo
//! train` see it too, and changing it rebuilds the workbook crate alone.

use std::collections::BTreeSet;

use anyhow::{bail, Context, Result};

use crate::render::{dim, yellow};
use crate::workspace::Workspace;

#[path = "../../build/lean_file.rs"]
mod lean_file;

pub use lean_file::{ranges, ranges_by, LEAN_FILE, LEAN_VARIABLE};

/// The exercises leaned on now (none with `--solutions`, where every body is the reference anyway).
pub fn leaned(ws: &Workspace) -> Result<BTreeSet<u32>> {
    if ws.solutions {
        return Ok(BTreeSet::new());
    }
    lean_file::read(&ws.root).map_err(|bad| {
        anyhow::anyhow!(
            "{LEAN_FILE}: `{bad}` is not an exercise number or range: fix it, or `cargo xtask lean --off all`"
        )
    })
}

/// `cargo xtask lean [LIST] [--off]`: shows, adds or removes exercises.
pub fn lean(ws: &Workspace, list: Option<&str>, off: bool) -> Result<bool> {
    let before = leaned(ws)?;
    let Some(list) = list else {
        if off {
            bail!("say which exercises to stop leaning on: `cargo xtask lean --off 3` or `--off all`");
        }
        print_choice(&before);
        return Ok(true);
    };
    let all: BTreeSet<u32> = ws.workbook.exercises.iter().map(|e| e.number).collect();
    let named = if list == "all" {
        all.clone()
    } else {
        lean_file::parse(list)
            .map_err(|bad| anyhow::anyhow!("`{bad}` is not an exercise number or range (like 6, 1-15 or 1-7,9)"))?
    };
    if let Some(missing) = named.difference(&all).next() {
        bail!("{}", ws.workbook.exercise(*missing).err().map(|e| e.to_string()).unwrap_or_default());
    }
    let after: BTreeSet<u32> =
        if off { before.difference(&named).copied().collect() } else { before.union(&named).copied().collect() };
    if after != before {
        // Written only on a change: the build script reruns whenever it is written.
        let path = ws.root.join(LEAN_FILE);
        std::fs::write(&path, lean_file::render(&after)).with_context(|| format!("cannot write {}", path.display()))?;
    }
    print_choice(&after);
    for number in named.intersection(&after) {
        let exercise = ws.workbook.exercise(*number)?;
        if ws.started(exercise)? {
            println!(
                "{}",
                yellow(&format!(
                    "Exercise {number} holds your edits: they stay in {}, unused until `cargo xtask lean --off {number}`.",
                    exercise.file.display()
                ))
            );
        }
    }
    Ok(true)
}

/// The one line that says which exercises run the reference, if any.
pub fn note(leaned: &BTreeSet<u32>) -> Option<String> {
    (!leaned.is_empty()).then(|| {
        format!(
            "Leaning on the reference for {} {} ({LEAN_FILE}); your code everywhere else.",
            if leaned.len() == 1 { "exercise" } else { "exercises" },
            ranges(leaned)
        )
    })
}

fn print_choice(leaned: &BTreeSet<u32>) {
    match note(leaned) {
        Some(line) => {
            println!("{line}");
            println!(
                "{}",
                dim(
                    "Their checks grade the reference, not you; `cargo xtask lean --off N` (or `--off all`) goes back."
                )
            );
        }
        None => println!(
            "Every exercise runs your code. `cargo xtask lean 1-7` compiles the reference bodies of exercises \
             1 to 7 instead, to start later in the workbook."
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::lean_file::{parse, read, render};
    use super::*;

    #[test]
    fn a_list_takes_numbers_and_ranges_by_commas_or_spaces() {
        assert_eq!(parse("1-3, 7 9").unwrap(), [1, 2, 3, 7, 9].into());
        assert_eq!(parse("").unwrap(), BTreeSet::new());
        assert_eq!(parse("5-3").unwrap_err(), "5-3");
        assert_eq!(parse("1, x").unwrap_err(), "x");
    }

    #[test]
    fn the_file_reads_back_what_was_written() {
        let root = std::env::temp_dir().join(format!("lean-file-{}", std::process::id()));
        std::fs::create_dir_all(root.join("exercises")).unwrap();
        assert_eq!(read(&root).unwrap(), BTreeSet::new(), "no file: nothing leaned on");
        let chosen: BTreeSet<u32> = [1, 2, 3, 5, 16].into();
        std::fs::write(root.join(LEAN_FILE), render(&chosen)).unwrap();
        assert_eq!(read(&root).unwrap(), chosen);
        assert_eq!(ranges(&chosen), "1-3, 5, 16");
        std::fs::remove_dir_all(&root).unwrap();
    }
}
