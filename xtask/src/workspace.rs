//! The repository the tool works on: its root, its exercise list, and whether
//! we grade the learner's code or the reference solutions.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

use crate::grading::{Bodies, Runner};
use crate::lean;
use crate::metadata::{Exercise, Workbook, INFO_FILE};
use crate::progress::Body;
use crate::stub;

/// The build script's own check of whether an exercise file parses.
#[path = "../../build/syntax.rs"]
mod syntax;

pub use syntax::SyntaxError;
pub(crate) use syntax::UNREADABLE;

pub struct Workspace {
    pub root: PathBuf,
    pub workbook: Workbook,
    /// `--solutions`: grade `solutions/` instead of `exercises/`.
    pub solutions: bool,
    /// The exercises whose reference body is compiled in place of the learner's (`cargo xtask lean`).
    pub leaned: BTreeSet<u32>,
}

impl Workspace {
    /// Finds the repository root (the parent of `xtask/`) and loads the metadata.
    pub fn open(solutions: bool) -> Result<Self> {
        let root = find_root()?;
        let workbook = Workbook::load(&root)?;
        let mut ws = Self { root, workbook, solutions, leaned: BTreeSet::new() };
        ws.leaned = lean::leaned(&ws)?;
        Ok(ws)
    }

    /// Reads a file given relative to the root.
    pub fn read(&self, path: &Path) -> Result<String> {
        std::fs::read_to_string(self.root.join(path)).with_context(|| format!("cannot read {}", path.display()))
    }

    /// Runs the graded tests on the code this workspace grades.
    pub fn runner(&self) -> Runner {
        let bodies = if self.solutions { Bodies::Reference } else { Bodies::Learners };
        Runner { root: self.root.clone(), bodies, only_tests_of: None, quiet_build: false, gpu: None }
    }

    /// Whether there is something to grade: always with `--solutions`,
    /// otherwise once the learner has changed the shipped stub of any of the
    /// exercise's functions. A function the tool cannot find counts as
    /// started, so the tests report what is wrong.
    pub fn started(&self, exercise: &Exercise) -> Result<bool> {
        if self.solutions {
            return Ok(true);
        }
        let source = self.read(&exercise.file)?;
        let shipped = stub::is_stub(&source, &exercise.fn_names(), &exercise.stub_line());
        Ok(!shipped.unwrap_or(false))
    }

    /// Whether the build compiles exercise `number`'s reference body in place of the learner's.
    pub fn leans_on(&self, number: u32) -> bool {
        self.leaned.contains(&number)
    }

    /// Where the exercise's file stops parsing as Rust; `None` when it
    /// parses, and with `--solutions`, which compiles none of the learner's files.
    pub fn syntax_error(&self, exercise: &Exercise) -> Result<Option<SyntaxError>> {
        if self.solutions {
            return Ok(None);
        }
        Ok(syntax::check(&self.read(&exercise.file)?).err())
    }

    /// Which body of the exercise the build compiles, by the build script's rule.
    pub fn body(&self, exercise: &Exercise) -> Result<Body> {
        let leaned = self.leans_on(exercise.number);
        // Leaning wins whatever the file holds, so its text need not be parsed.
        let parses = leaned || self.syntax_error(exercise)?.is_none();
        Ok(Body::of(leaned, parses, !self.started(exercise)?))
    }

    /// What every command says of an exercise whose file does not parse:
    /// where it stops, and that the reference runs meanwhile. `None` when the
    /// build compiles the learner's file, or leans on the reference anyway.
    pub fn does_not_parse(&self, exercise: &Exercise) -> Result<Option<String>> {
        if self.leans_on(exercise.number) {
            return Ok(None);
        }
        let file = exercise.file.to_string_lossy().replace('\\', "/");
        Ok(self.syntax_error(exercise)?.map(|error| error.sentence(&file)))
    }

    /// `exercises/phase1_model/ex05_causal_attention.rs:42`, pointing at the
    /// exercise's first function in the file the learner edits.
    pub fn position(&self, exercise: &Exercise) -> String {
        let file = exercise.file.display();
        let line = self.read(&exercise.file).ok().and_then(|source| {
            let first = *exercise.fn_names().first()?;
            stub::locate(&source, first).ok()
        });
        match line {
            Some(location) => format!("{file}:{}", location.line),
            None => file.to_string(),
        }
    }
}

/// A `cargo` command run in `dir`: the cargo that started this tool (cargo
/// sets `CARGO` for what it runs), so that every build uses one toolchain,
/// or the one on `PATH` when the tool was started directly.
pub fn cargo(dir: &Path) -> Command {
    let mut command = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    command.current_dir(dir);
    command
}

/// `cargo run` tells the tool where its manifest is; the compile-time path
/// is the fallback when the binary is started directly.
fn find_root() -> Result<PathBuf> {
    let manifest_dir = std::env::var_os("CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")));
    let root = manifest_dir.parent().map(Path::to_path_buf).unwrap_or_default();
    if !root.join(INFO_FILE).is_file() {
        bail!(
            "cannot find {INFO_FILE} in {}: run the tool as `cargo xtask ...` from inside the workbook",
            root.display()
        );
    }
    Ok(root)
}

/// Every file under `dir` (relative to `root`), as paths relative to `root`.
pub fn files_under(root: &Path, dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(root.join(dir)) else { return vec![] };
    let mut files = vec![];
    for entry in entries.flatten() {
        let path = dir.join(entry.file_name());
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            files.extend(files_under(root, &path));
        } else {
            files.push(path);
        }
    }
    files
}
