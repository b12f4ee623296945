//! `watch`: grade the exercise whose file was saved (or, for any other file
//! under exercises/, the current one) whenever one changes, and move on to the
//! next one when it passes. With nothing left for `next`, it keeps watching:
//! the exercise saved next is graded, leaned on or not.

use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, Receiver};
use std::time::Duration;

use anyhow::{Context, Result};
use notify::{Event, EventKind, RecursiveMode, Watcher};

use crate::commands;
use crate::lean;
use crate::render::{self, dim, red};
use crate::workspace::Workspace;

/// Editors save in several steps (write, rename, chmod); wait for this much
/// quiet before grading.
const DEBOUNCE: Duration = Duration::from_millis(300);

pub fn watch(mut ws: Workspace) -> Result<bool> {
    let (events, changes) = mpsc::channel();
    let mut watcher = notify::recommended_watcher(events).context("cannot start watching files")?;
    let exercises = ws.root.join("exercises");
    watcher
        .watch(&exercises, RecursiveMode::Recursive)
        .with_context(|| format!("cannot watch {}", exercises.display()))?;

    // The exercise being graded; `None` until `next` has picked one.
    let mut current = None;
    loop {
        match current {
            None => match commands::next(&ws, commands::Start::First) {
                Ok(number) => current = number,
                Err(error) => eprintln!("{} {error:#}", red("error:")),
            },
            Some(number) => match commands::check(&ws, number) {
                Ok(true) => {
                    current = None;
                    println!("\n{}\n", dim(&"-".repeat(40)));
                    continue; // straight on to the next exercise's card
                }
                Ok(false) => {}
                Err(error) => eprintln!("{} {error:#}", red("error:")),
            },
        }
        println!();
        println!("{}", dim("Watching exercises/ for changes; save a file to grade again, Ctrl-C to stop."));
        let saved = wait_for_change(&changes)?;
        // `cargo xtask lean` in another terminal changes what is graded: read the choice again.
        match Workspace::open(ws.solutions) {
            Ok(fresh) => ws = fresh,
            Err(error) => eprintln!("{} {error:#}", red("error:")),
        }
        if let Some(number) = saved.iter().find_map(|path| exercise_of(&ws, path)) {
            current = Some(number);
        }
        render::clear_screen();
    }
}

/// Blocks until a Rust or TOML file is created, changed or removed, then
/// until the burst of events it came with has passed; returns the files edited.
fn wait_for_change(changes: &Receiver<notify::Result<Event>>) -> Result<Vec<PathBuf>> {
    let mut edited = Vec::new();
    loop {
        let event = changes.recv().context("the file watcher stopped")?;
        if is_edit(&event) {
            edited.extend(event.into_iter().flat_map(|e| e.paths));
            break;
        }
    }
    while let Ok(event) = changes.recv_timeout(DEBOUNCE) {
        if is_edit(&event) {
            edited.extend(event.into_iter().flat_map(|e| e.paths));
        }
    }
    Ok(edited)
}

/// The exercise whose file `path` is. One leaned on is graded too: `check`
/// then says that the reference runs in its place, and how to grade yours.
fn exercise_of(ws: &Workspace, path: &Path) -> Option<u32> {
    ws.workbook.exercises.iter().find(|e| path.ends_with(&e.file)).map(|e| e.number)
}

/// Reads (which the build itself causes) do not count; edits of source files do.
fn is_edit(event: &notify::Result<Event>) -> bool {
    let Ok(event) = event else { return false };
    let source = |path: &std::path::PathBuf| {
        path.extension().is_some_and(|ext| ext == "rs" || ext == "toml") || path.ends_with(lean::LEAN_FILE)
    };
    matches!(event.kind, EventKind::Create(_) | EventKind::Modify(_) | EventKind::Remove(_))
        && event.paths.iter().any(source)
}
