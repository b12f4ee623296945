//! `update`: the lists that follow from info.toml, written from it so that they
//! never drift. Each generated file (or region) says so in its first lines;
//! `verify` fails while one is stale.
//!
//! - `src/exercises.rs`: the phase modules, each exercise file read from
//!   `exercises/` or, with `--features solutions`, when the learner leans on
//!   it or when it does not parse (`cfg(reference = "N")`, set by
//!   `build/main.rs`), from `solutions/`;
//! - `tests/graded/main.rs`, between its markers: one test module per exercise,
//!   each compiled in every build but those that build a few exercises' tests
//!   (`cfg(only_some_tests)`, set by `tests/build.rs`);
//! - `guide/src/SUMMARY.md`: the guide's table of contents.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

use xtask::metadata::{Chapter, Exercise, Workbook};
use xtask::workspace::Workspace;

use crate::planted::PLANTED_DIR;

const EXERCISES_RS: &str = "src/exercises.rs";
const GRADED_MAIN: &str = "tests/graded/main.rs";
const SUMMARY: &str = "guide/src/SUMMARY.md";
const BEGIN: &str = "// BEGIN exercise modules: written by `cargo xtask update` from exercises/info.toml\n";
const END: &str = "// END exercise modules\n";

/// A generated file: where it goes and what it should hold.
pub struct Generated {
    pub path: PathBuf,
    pub text: String,
}

/// Every generated file as info.toml says it should be now.
pub fn generate(ws: &Workspace) -> Result<Vec<Generated>> {
    let graded_main = ws.read(Path::new(GRADED_MAIN))?;
    Ok(vec![
        Generated { path: EXERCISES_RS.into(), text: exercises_rs(&ws.workbook)? },
        Generated { path: GRADED_MAIN.into(), text: graded_main_rs(&ws.root, &ws.workbook, &graded_main)? },
        Generated { path: SUMMARY.into(), text: summary_md(&ws.workbook) },
    ])
}

/// The generated files whose content on disk differs from `generate`'s.
pub fn stale(ws: &Workspace) -> Result<Vec<Generated>> {
    Ok(generate(ws)?.into_iter().filter(|g| ws.read(&g.path).ok().as_deref() != Some(g.text.as_str())).collect())
}

/// `cargo xtask update`: rewrites the stale files and says which.
pub fn update(ws: &Workspace) -> Result<()> {
    let stale = stale(ws)?;
    for file in &stale {
        let path = ws.root.join(&file.path);
        std::fs::write(&path, &file.text).with_context(|| format!("cannot write {}", path.display()))?;
        println!("wrote {}", file.path.display());
    }
    if stale.is_empty() {
        println!("{EXERCISES_RS}, {GRADED_MAIN} and {SUMMARY} already agree with exercises/info.toml");
    }
    Ok(())
}

/// `#[cfg_attr(cfg, path = "../file")]` and a newline, laid out as rustfmt
/// lays it out (rustfmt.toml's width is 120), so that `cargo fmt` leaves the
/// written file as it is.
fn cfg_attr_path(cfg: &str, file: &str) -> String {
    let line = format!("#[cfg_attr({cfg}, path = \"../{file}\")]");
    match line.len() {
        0..=120 => format!("{line}\n"),
        _ => format!("#[cfg_attr(\n    {cfg},\n    path = \"../{file}\"\n)]\n"),
    }
}

fn exercises_rs(workbook: &Workbook) -> Result<String> {
    let mut out = String::from(
        "//! The learner's exercise files, wired into the crate.\n\
         //!\n\
         //! Written by `cargo xtask update` from `exercises/info.toml`; edit that file,\n\
         //! not this one. Each exercise module is read from `exercises/`, or from\n\
         //! `solutions/` with `--features solutions`, for the exercises leaned on\n\
         //! (`cargo xtask lean`) and for those whose file does not parse:\n\
         //! `build/main.rs` sets `cfg(reference = \"N\")` for those. `cargo xtask\n\
         //! verify` compiles a copy with a planted mistake from `target/planted/`\n\
         //! instead (`cfg(planted = \"N\")`), never editing the tracked files.\n\
         //! Exercises are methods of the machinery's types or free functions; a phase\n\
         //! module re-exports the latter.\n\
         //! No lint is silenced: a shipped stub borrows its arguments, so rustc's\n\
         //! warnings (an unused variable is often a dropped result) reach the learner.\n",
    );
    let mut phases = String::new();
    let mut early = String::new();
    for phase in &workbook.phases {
        let exercises: Vec<_> = workbook.exercises_in(phase.number).collect();
        let (Some(first), Some(last)) = (exercises.first(), exercises.last()) else { continue };
        let (phase_module, _) = first.modules()?;
        let numbers = if first.number == last.number {
            format!("exercise {}", first.number)
        } else {
            format!("exercises {}–{}", first.number, last.number)
        };
        writeln!(phases, "\n/// Phase {}: {} ({numbers}).\npub mod {phase_module} {{", phase.number, phase.title)?;
        for exercise in &exercises {
            let (module_phase, module) = exercise.modules()?;
            if module_phase != phase_module {
                bail!(
                    "exercise {} is in folder {module_phase}, the other exercises of phase {} in {phase_module}: \
                     keep a phase's files in one folder",
                    exercise.number,
                    phase.number
                );
            }
            let solution = exercise.solution_file()?;
            out.push('\n');
            // Paths are relative to src/, where this file lies.
            let reference = format!("reference = \"{}\"", exercise.number);
            let planted = format!("planted = \"{}\"", exercise.number);
            let planted_copy = Path::new(PLANTED_DIR).join(&solution);
            for (cfg, file) in [
                (format!("not(any({reference}, {planted}))"), &exercise.file),
                (reference, &solution),
                (planted, &planted_copy),
            ] {
                out.push_str(&cfg_attr_path(&cfg, &slashes(file)));
            }
            writeln!(out, "mod {module};")?;
            let mut items: Vec<&str> = exercise.exported_items().collect();
            items.sort_unstable();
            if let Some(caller) = &exercise.called_early_by {
                let stand_in = format!("stand_in = \"{}\"", exercise.number);
                writeln!(
                    out,
                    "\n/// Exercise {}'s reference, which {caller} runs while the exercise holds its stub.\n\
                     #[cfg({stand_in})]\n#[path = \"../{}\"]\nmod {module}_stand_in;",
                    exercise.number,
                    slashes(&solution)
                )?;
                let items = items.join(", ");
                writeln!(
                    early,
                    "    #[cfg(not({stand_in}))]\n    pub use super::{module}::{{{items}}};\n    \
                     #[cfg({stand_in})]\n    pub use super::{module}_stand_in::{{{items}}};"
                )?;
            }
            // In rustfmt's order, so that `cargo fmt` leaves the file as written.
            for item in items {
                writeln!(phases, "    pub use super::{module}::{item};")?;
            }
        }
        phases.push_str("}\n");
    }
    out.push_str(&phases);
    if !early.is_empty() {
        writeln!(
            out,
            "\n/// The exercises a runtime calls before their phase: the learner's body once\n\
             /// started, the reference while the file still holds its stub.\npub mod called_early {{\n{early}}}"
        )?;
    }
    out.push_str(
        "\n/// The rule that chose each exercise's body, the build script's own.\n\
         #[path = \"../build/body.rs\"]\nmod body;\n\
         \n/// Which body each exercise runs, as `build/main.rs` chose it.\npub mod bodies {\n    \
         include!(concat!(env!(\"OUT_DIR\"), \"/exercise_bodies.rs\"));\n\n    \
         pub use super::body::Body;\n\n    \
         /// Which body exercise `number` runs in this build, by the build script's rule.\n    \
         pub fn body(number: u32) -> Body {\n        \
         let parses = !UNPARSABLE.iter().any(|(n, _)| *n == number);\n        \
         Body::of(REFERENCE.contains(&number), parses, UNFINISHED.contains(&number))\n    }\n}\n",
    );
    Ok(out)
}

fn graded_main_rs(root: &Path, workbook: &Workbook, current: &str) -> Result<String> {
    let (Some(begin), Some(end)) = (current.find(BEGIN), current.find(END)) else {
        bail!("{GRADED_MAIN} has lost its markers: put back the lines\n{BEGIN}{END}where its exercise modules go");
    };
    let mut modules = String::new();
    for exercise in &workbook.exercises {
        // Built when its exercise is graded, or one whose tests use its helpers.
        let users = workbook.exercises.iter().filter(|other| uses_helpers_of(root, other, exercise));
        let wanted: Vec<String> =
            std::iter::once(exercise).chain(users).map(|e| format!(", tests_of = \"{}\"", e.number)).collect();
        writeln!(modules, "#[cfg(any(not(only_some_tests){}))]\nmod {};", wanted.concat(), exercise.test_module())?;
    }
    Ok(format!("{}{BEGIN}{modules}{}", &current[..begin], &current[end..]))
}

/// Whether `user`'s test module calls into `helper`'s (`crate::exercise_NN`).
fn uses_helpers_of(root: &Path, user: &Exercise, helper: &Exercise) -> bool {
    let path = format!("crate::{}", helper.test_module());
    user.number != helper.number
        && std::fs::read_to_string(root.join(user.test_file())).is_ok_and(|source| source.contains(&path))
}

fn summary_md(workbook: &Workbook) -> String {
    let link = |indent: &str, title: &str, chapter: &Path| format!("{indent}[{title}]({})\n", slashes(chapter));
    let item = |chapter: &Chapter, indent: &str| link(indent, &chapter.title, &chapter.chapter);
    let mut out = String::from("# Summary\n\n<!-- Written by `cargo xtask update` from exercises/info.toml. -->\n\n");
    out.extend(workbook.guide_front.iter().map(|c| item(c, "")));
    for phase in &workbook.phases {
        out.push_str(&format!("\n# Phase {}: {}\n\n", phase.number, phase.title));
        out.push_str(&item(&phase.overview, "- "));
        for exercise in workbook.exercises_in(phase.number) {
            let title = format!("Exercise {}: {}", exercise.number, exercise.title);
            out.push_str(&link("    - ", &title, &exercise.chapter));
        }
        out.extend(phase.after.iter().map(|c| item(c, "    - ")));
    }
    if !workbook.guide_back.is_empty() {
        out.push_str("\n# Appendices\n\n");
        out.extend(workbook.guide_back.iter().map(|c| item(c, "- ")));
    }
    out
}

fn slashes(path: &Path) -> String {
    path.to_string_lossy().replace('\\', "/")
}

#[cfg(test)]
mod tests {
    use super::*;

    const ONE_PHASE: &str = r#"format_version = 3
guide_front = [{ title = "Intro", chapter = "intro.md" }]

[[phase]]
number = 1
title = "Model"
summary = "s"
overview = { title = "The model", chapter = "phase1/index.md" }
after = [{ title = "Stability", chapter = "phase1/stability.md" }]

[[exercise]]
number = 1
title = "RMSNorm"
phase = 1
file = "exercises/phase1_model/ex01_rms_norm.rs"
functions = ["f"]
concept = "c"
difficulty = "d"
read = "r"
insight = "i"
depends = []
hint = { idea = "i", pieces = "p", recipe = "r" }
chapter = "phase1/01-rms-norm.md"
mistakes = []
"#;

    #[test]
    fn the_summary_lists_the_front_the_phases_and_the_appendices_in_order() {
        let back = "guide_back = [{ title = \"Glossary\", chapter = \"appendix/glossary.md\" }]\n";
        let workbook = Workbook::parse(&ONE_PHASE.replacen("\n\n", &format!("\n{back}\n"), 1)).unwrap();
        let summary = summary_md(&workbook);
        let body = summary.split("-->\n\n").nth(1).unwrap();
        assert_eq!(
            body,
            "[Intro](intro.md)\n\n# Phase 1: Model\n\n- [The model](phase1/index.md)\n    \
             - [Exercise 1: RMSNorm](phase1/01-rms-norm.md)\n    - [Stability](phase1/stability.md)\n\n\
             # Appendices\n\n- [Glossary](appendix/glossary.md)\n"
        );
    }

    #[test]
    fn without_appendices_the_summary_ends_with_the_last_phase() {
        let summary = summary_md(&Workbook::parse(ONE_PHASE).unwrap());
        assert!(summary.ends_with("    - [Stability](phase1/stability.md)\n"), "{summary}");
        assert!(!summary.contains("Appendices"));
    }
}
