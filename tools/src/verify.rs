//! `verify`: the exercise set's own invariants, for CI and for whoever adds
//! an exercise. Every exercise is declared once in info.toml; this checks
//! that the stub, the solution, the tests and the guide all agree with it,
//! that every solution passes and every shipped stub fails.
//!
//! Each check counts once; the last line reads `N passed, N failed`.

use std::collections::BTreeSet;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use ::figures::numbers::chapters;
use xtask::grading::{
    graded_exercise, phase_check, unfinished_exercise, Bodies, Outcome, Runner, TestRun, TEST_BINARY,
};
use xtask::metadata::{self, Exercise};
use xtask::render::{bold, green, indented, red};
use xtask::stub;
use xtask::workspace::{files_under, Workspace};
use xtask::LEAN_FILE;

use crate::code_width;
use crate::figures;
use crate::planted;
use crate::quoted;
use crate::registry;

const MIN_MISTAKES: usize = 3;

pub fn verify(ws: &Workspace) -> anyhow::Result<bool> {
    let mut tally = Tally::default();
    metadata(ws, &mut tally);
    let reference = solutions_pass(ws, &mut tally);
    let stubs = stubs_fail(ws, &mut tally);
    planted_mistakes(ws, &[], &mut tally);
    dependencies_suffice(ws, &mut tally);
    no_warnings(ws, [("the reference solutions", reference), ("the shipped stubs", stubs)], &mut tally);
    guide_builds(ws, &mut tally);
    Ok(tally.summary())
}

/// `verify --exercise N…`: only the planted mistakes of those exercises.
pub fn planted_only(ws: &Workspace, exercises: &[u32]) -> anyhow::Result<bool> {
    let mut tally = Tally::default();
    planted_mistakes(ws, exercises, &mut tally);
    Ok(tally.summary())
}

/// Counts checks, printing each problem as it is found, and each section's
/// time (what CI's budget is spent on).
#[derive(Default)]
struct Tally {
    passed: usize,
    failed: usize,
    /// Counts when the current section began, and when.
    section_start: (usize, usize),
    section_began: Option<Instant>,
}

impl Tally {
    /// Prints how many checks passed and failed; whether none failed.
    fn summary(&self) -> bool {
        println!();
        let summary = format!("{} passed, {} failed", self.passed, self.failed);
        println!("{}", if self.failed == 0 { green(&summary) } else { red(&summary) });
        self.failed == 0
    }

    fn section(&mut self, title: &str) {
        self.end_section();
        println!("\n{}", bold(title));
        self.section_start = (self.passed, self.failed);
        self.section_began = Some(Instant::now());
    }

    fn end_section(&self) {
        let (passed, failed) = (self.passed - self.section_start.0, self.failed - self.section_start.1);
        let seconds = self.section_began.map_or(0.0, |began| began.elapsed().as_secs_f64());
        if passed + failed > 0 {
            let line = format!("  {passed}/{} checks pass ({seconds:.0} s)", passed + failed);
            println!("{}", if failed == 0 { green(&line) } else { red(&line) });
        }
    }

    fn check(&mut self, ok: bool, problem: impl FnOnce() -> String) {
        if ok {
            self.passed += 1;
        } else {
            self.failed += 1;
            println!("  {} {}", red("✗"), problem());
        }
    }
}

/// Part 1: info.toml against the files it names.
fn metadata(ws: &Workspace, tally: &mut Tally) {
    tally.section("Metadata (exercises/info.toml) agrees with the files");
    let workbook = &ws.workbook;
    for (index, phase) in workbook.phases.iter().enumerate() {
        tally.check(phase.number as usize == index + 1, || {
            format!("phase {} is [[phase]] entry {}: number the phases 1, 2, 3, ... in order", phase.number, index + 1)
        });
    }
    for (index, exercise) in workbook.exercises.iter().enumerate() {
        exercise_entry(ws, index, exercise, tally);
    }
    match registry::stale(ws) {
        Ok(stale) => {
            for file in stale {
                tally.check(false, || {
                    format!("{} does not agree with info.toml: run `cargo xtask update`", file.path.display())
                });
            }
        }
        Err(error) => tally.check(false, || format!("{error:#}")),
    }
    only_exercise_files(ws, tally);
}

/// `exercises/` holds the learner's files and info.toml, `solutions/` the same
/// files with bodies and the planted mistakes: anything else is a leftover.
fn only_exercise_files(ws: &Workspace, tally: &mut Tally) {
    // The learner's choice of bodies (`cargo xtask lean`) is theirs, not a leftover.
    let mut expected: BTreeSet<PathBuf> = [metadata::INFO_FILE, planted::PLANTS_FILE, planted::NATURAL_FILE, LEAN_FILE]
        .into_iter()
        .map(PathBuf::from)
        .collect();
    for exercise in &ws.workbook.exercises {
        expected.insert(exercise.file.clone());
        expected.extend(exercise.solution_file().ok());
    }
    for folder in ["exercises", "solutions"] {
        for file in files_under(&ws.root, Path::new(folder)) {
            tally.check(expected.contains(&file), || {
                format!(
                    "{} is not an exercise named in info.toml: {folder}/ holds only the exercise files",
                    file.display()
                )
            });
        }
    }
}

/// One `[[exercise]]` entry (the `index`-th) against the files it names.
fn exercise_entry(ws: &Workspace, index: usize, exercise: &Exercise, tally: &mut Tally) {
    let workbook = &ws.workbook;
    let n = exercise.number;
    tally.check(n as usize == index + 1, || {
        format!("exercise {n} is [[exercise]] entry {}: number the exercises 1, 2, 3, ... in order", index + 1)
    });
    tally.check(workbook.phase(exercise.phase).is_ok(), || {
        format!("exercise {n}: phase {} is not declared as a [[phase]]", exercise.phase)
    });
    let previous_phase = index.checked_sub(1).map_or(0, |i| workbook.exercises[i].phase);
    tally.check(exercise.phase >= previous_phase, || {
        format!("exercise {n}: phase {} comes after phase {previous_phase}: keep the phases in order", exercise.phase)
    });
    shipped_stub(ws, exercise, tally);
    solution(ws, exercise, tally);
    exists(ws, &exercise.test_file(), &format!("exercise {n}: its test module"), tally);
    let chapter = exercise.chapter_file();
    exists(ws, &chapter, &format!("exercise {n}: its guide chapter"), tally);
    let heading = format!("# Exercise {n}: {}", exercise.title);
    let first_line = ws.read(&chapter).ok().and_then(|text| text.lines().next().map(str::to_string));
    tally.check(first_line.as_deref().is_none_or(|line| line == heading), || {
        format!(
            "exercise {n}: {} opens with {first_line:?}, not with the title in info.toml: {heading:?}",
            chapter.display()
        )
    });
    hint_tiers(ws, exercise, tally);
    tally.check(exercise.mistakes.len() >= MIN_MISTAKES, || {
        format!(
            "exercise {n}: {} mistakes listed, at least {MIN_MISTAKES} wanted (each caught by a test)",
            exercise.mistakes.len()
        )
    });
    mistake_ids(ws, exercise, tally);
    let later: Vec<u32> = exercise.depends.iter().copied().filter(|&d| d == 0 || d >= n).collect();
    tally.check(later.is_empty(), || format!("exercise {n}: depends on {later:?}, which do not come before it"));
}

/// Every hint tier says something, and the recipe's code stays in the last
/// tier: no assembled code of it (a backticked span of 20 characters or more
/// with a call and a `?`, `=` or `;`) appears in the stub or the guide
/// chapter, which give the idea and the pieces (API names), not the answer.
fn hint_tiers(ws: &Workspace, exercise: &Exercise, tally: &mut Tally) {
    let n = exercise.number;
    for (heading, text) in exercise.hint.tiers() {
        tally.check(!text.trim().is_empty(), || format!("exercise {n}: the hint's tier \"{heading}\" is empty"));
    }
    let code_spans = exercise
        .hint
        .recipe
        .split('`')
        .skip(1)
        .step_by(2)
        .filter(|span| span.len() >= 20 && span.contains('(') && span.contains(['?', '=', ';']));
    for span in code_spans {
        for place in [&exercise.file, &exercise.chapter_file()] {
            let text = ws.read(place).unwrap_or_default();
            tally.check(!text.contains(span), || {
                format!(
                    "exercise {n}: {} shows `{span}` from the hint's recipe: the answer's code belongs in the last tier only",
                    place.display()
                )
            });
        }
    }
}

/// Each mistake has a well-formed id of its own, and the exercise's tests use
/// it (as `"id"`: `mistake(n, "id")` or a fixture's `mistakes(&["id", ...])`);
/// every `mistake(n, "id")` in the tests names a mistake info.toml lists.
fn mistake_ids(ws: &Workspace, exercise: &Exercise, tally: &mut Tally) {
    let n = exercise.number;
    let tests = ws.read(&exercise.test_file()).unwrap_or_default();
    let mut seen = BTreeSet::new();
    for id in exercise.mistakes.iter().map(|m| m.id.as_str()) {
        let well_formed =
            !id.is_empty() && id.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
        tally.check(well_formed && seen.insert(id), || {
            format!("exercise {n}: mistake id `{id}` is repeated or not snake_case")
        });
        tally.check(tests.contains(&format!("\"{id}\"")), || {
            format!(
                "exercise {n}: no test in {} names mistake `{id}`: each mistake is caught by a test",
                exercise.test_file().display()
            )
        });
    }
    for (number, id) in mistake_calls(&tests) {
        let listed = ws.workbook.exercise(number).is_ok_and(|e| e.mistakes.iter().any(|m| m.id == id));
        tally.check(listed, || {
            format!(
                "{} names mistake({number}, \"{id}\"), which info.toml does not list",
                exercise.test_file().display()
            )
        });
    }
}

/// The `(n, id)` of every `mistake(n, "id")` in `source`.
fn mistake_calls(source: &str) -> Vec<(u32, String)> {
    source
        .split("mistake(")
        .skip(1)
        .filter_map(|rest| {
            let (number, rest) = rest.split_once(',')?;
            let id = rest.trim_start().strip_prefix('"')?.split('"').next()?;
            Some((number.trim().parse().ok()?, id.to_string()))
        })
        .collect()
}

/// The learner's file holds each of the exercise's functions with exactly the
/// shipped stub body (see `stub::stub_body`), i.e. `reset` leaves it byte for
/// byte as shipped.
fn shipped_stub(ws: &Workspace, exercise: &Exercise, tally: &mut Tally) {
    let n = exercise.number;
    let source = match ws.read(&exercise.file) {
        Ok(source) => source,
        Err(error) => return tally.check(false, || format!("exercise {n}: {error:#}")),
    };
    let file = exercise.file.display();
    let stub_line = exercise.stub_line();
    for (function, name) in exercise.functions.iter().zip(exercise.fn_names()) {
        let location = match stub::locate(&source, name) {
            Ok(location) => location,
            Err(error) => {
                tally.check(false, || format!("exercise {n}: {file}: {error}"));
                continue;
            }
        };
        let want = stub::stub_body(&location, &stub_line);
        tally.check(source[location.body.clone()] == want, || {
            format!(
                "exercise {n}: the body of `{function}` in {file}:{} is not the shipped stub; it must be exactly{}\n    (`cargo xtask reset {n} --yes` writes it)",
                location.line,
                want.trim_end().replace('\n', "\n  ")
            )
        });
    }
}

/// The solution file holds the same functions, written out.
fn solution(ws: &Workspace, exercise: &Exercise, tally: &mut Tally) {
    let n = exercise.number;
    let found = exercise.solution_file().and_then(|path| Ok((ws.read(&path)?, path)));
    let (source, path) = match found {
        Ok(found) => found,
        Err(error) => return tally.check(false, || format!("exercise {n}: solution: {error:#}")),
    };
    let path = path.display();
    for (function, name) in exercise.functions.iter().zip(exercise.fn_names()) {
        match stub::locate(&source, name) {
            Err(error) => tally.check(false, || format!("exercise {n}: solution: {path}: {error}")),
            Ok(location) => tally.check(!source[location.body].contains("todo!"), || {
                format!("exercise {n}: `{function}` in {path} still contains `todo!`")
            }),
        }
    }
}

/// Each `path` in backticks in a chapter that starts with one of the
/// workbook's top-level folders (`src/parallel/pipeline/mod.rs`, with or
/// without a `:line`) must exist; placeholders (`step_NNNNNN`, `*`, `<...>`)
/// are not paths.
fn cited_paths_exist(ws: &Workspace, tally: &mut Tally) {
    let Ok(entries) = std::fs::read_dir(&ws.root) else { return };
    let folders: Vec<String> = entries
        .flatten()
        .filter(|e| e.path().is_dir())
        .map(|e| format!("{}/", e.file_name().to_string_lossy()))
        .filter(|name| !name.starts_with('.') && name != "target/")
        .collect();
    for chapter in markdown_files(&ws.root.join("guide/src")) {
        let text = std::fs::read_to_string(&chapter).unwrap_or_default();
        let name = chapter.strip_prefix(&ws.root).unwrap_or(&chapter).display().to_string();
        // The lean file is the learner's to create (`cargo xtask lean`).
        for path in cited_paths(&text, &folders).filter(|path| *path != LEAN_FILE) {
            tally.check(ws.root.join(path).exists(), || format!("{name} cites `{path}`, which does not exist"));
        }
    }
}

/// The paths in backticks in `text` under one of `folders` (each ending in `/`).
fn cited_paths<'a>(text: &'a str, folders: &'a [String]) -> impl Iterator<Item = &'a str> + 'a {
    text.split('`').skip(1).step_by(2).filter_map(move |quoted| {
        let path = quoted.split(':').next().unwrap_or_default();
        let is_path = folders.iter().any(|f| path.starts_with(f.as_str()))
            && !path.contains(char::is_whitespace)
            && !path.contains(['*', '<', '{', '…'])
            && !path.contains("NNN");
        is_path.then_some(path)
    })
}

/// The `.md` files under `dir`, in a stable order.
pub fn markdown_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = files_under(dir, Path::new(""))
        .into_iter()
        .filter(|file| file.extension().is_some_and(|e| e == "md"))
        .map(|file| dir.join(file))
        .collect();
    files.sort();
    files
}

fn exists(ws: &Workspace, path: &Path, what: &str, tally: &mut Tally) {
    tally.check(ws.root.join(path).is_file(), || format!("{what} {} does not exist", path.display()));
}

/// Opens a section titled `title`, runs the whole graded binary on the
/// solutions or the stubs, and checks that the run finished.
fn run_section(ws: &Workspace, solutions: bool, title: &str, tally: &mut Tally) -> Option<TestRun> {
    // The stubs of every exercise, whatever a learner's clone leans on.
    let bodies = if solutions { Bodies::Reference } else { Bodies::ReferenceOf(vec![]) };
    let runner = Runner { root: ws.root.clone(), bodies, only_tests_of: None, quiet_build: false, gpu: None };
    tally.section(&format!("{title} ({})", runner.command_line()));
    let run = match runner.run(&[]) {
        Ok(run) => run,
        Err(error) => {
            tally.check(false, || format!("{error:#}"));
            return None;
        }
    };
    tally.check(run.finished, || "the test run stopped before it finished (a test crashed the process)".into());
    Some(run)
}

/// Part 2: every test passes on the reference solutions, and every exercise has
/// graded tests (and no test module grades an exercise that does not exist).
fn solutions_pass(ws: &Workspace, tally: &mut Tally) -> Option<TestRun> {
    let run = run_section(ws, true, "Reference solutions pass", tally)?;
    for result in &run.results {
        tally.check(result.outcome == Outcome::Passed, || match result.outcome {
            Outcome::Ignored => format!("{} is #[ignore]d, so it is never graded", result.name),
            _ => format!(
                "{} fails on the reference solution:\n{}",
                result.name,
                indented(result.message.as_deref().unwrap_or("(no message)"), 6)
            ),
        });
    }
    for exercise in &ws.workbook.exercises {
        tally.check(run.under(&exercise.test_filter()).next().is_some(), || {
            format!(
                "exercise {} has no graded test: add a module `{}` ({}) to the `{TEST_BINARY}` test binary",
                exercise.number,
                exercise.test_module(),
                exercise.test_file().display()
            )
        });
    }
    let tested: BTreeSet<u32> = run.results.iter().filter_map(|r| graded_exercise(&r.name)).collect();
    for number in tested {
        tally.check(ws.workbook.exercise(number).is_ok(), || {
            format!("exercise_{number:02} grades exercise {number}, which exercises/info.toml does not declare")
        });
    }
    Some(run)
}

/// Part 3: on the shipped stubs, every graded test fails and every other test passes.
fn stubs_fail(ws: &Workspace, tally: &mut Tally) -> Option<TestRun> {
    let run = run_section(ws, false, "Shipped stubs fail every graded test", tally)?;
    for result in &run.results {
        let graded = graded_exercise(&result.name).is_some() || phase_check(&result.name).is_some();
        let wanted = if graded { Outcome::Failed } else { Outcome::Passed };
        tally.check(result.outcome == wanted, || match (graded, result.outcome) {
            (_, Outcome::Ignored) => format!("{} is #[ignore]d, so it never runs", result.name),
            (true, _) => format!("{} passes on the shipped stub: it has no teeth", result.name),
            (false, _) => format!(
                "{} is not graded, yet fails on the shipped stubs:\n{}",
                result.name,
                indented(result.message.as_deref().unwrap_or("(no message)"), 6)
            ),
        });
    }
    Some(run)
}

/// Part 4: every mistake that no fixture output stands for, planted in the
/// reference solution, fails a test of its exercise that names it, and no
/// failure blames another of the exercise's mistakes. Only `exercises`'
/// when some are given.
fn planted_mistakes(ws: &Workspace, exercises: &[u32], tally: &mut Tally) {
    tally.section(&format!(
        "Planted mistakes are caught by name, their neighbours blamed on none ({})",
        planted::PLANTS_FILE
    ));
    let plants = match planted::load(&ws.root) {
        Ok(plants) => only_of(plants, exercises),
        Err(error) => return tally.check(false, || format!("{error:#}")),
    };
    for exercise in ws.workbook.exercises.iter().filter(|e| chosen(exercises, e.number)) {
        let outputs = planted::fixture_outputs(&ws.root, exercise.number);
        for mistake in exercise.mistakes.iter().filter(|m| !planted::has_fixture_output(&outputs, &m.id)) {
            let count = plants
                .iter()
                .filter(|p| p.exercise == exercise.number && p.mistake() == Some(mistake.id.as_str()))
                .count();
            tally.check(count == 1, || {
                format!(
                    "exercise {}: mistake `{}` has no fixture output and {count} plants in {}; it needs one",
                    exercise.number,
                    mistake.id,
                    planted::PLANTS_FILE
                )
            });
        }
    }
    run_planted(ws, &plants, |plant, exercise, run| {
        let problems = match (exercise, run) {
            (Ok(exercise), Ok(run)) => planted::judge(exercise, plant, run),
            (Err(error), _) | (_, Err(error)) => {
                vec![format!("planting `{}` in exercise {}: {error:#}", plant.label(), plant.exercise)]
            }
        };
        tally.check(problems.is_empty(), || problems.join("\n  "));
    });
}

/// The plants of `exercises`; all of them when none is given.
fn only_of(plants: Vec<planted::Plant>, exercises: &[u32]) -> Vec<planted::Plant> {
    plants.into_iter().filter(|p| chosen(exercises, p.exercise)).collect()
}

/// Whether exercise `number` is among `exercises`, which none given means all.
fn chosen(exercises: &[u32], number: u32) -> bool {
    exercises.is_empty() || exercises.contains(&number)
}

/// Plants each of `plants` in the reference solutions, those of independent
/// exercises in one build, runs their exercises' tests, and hands each plant
/// its exercise and the run to `judge`.
fn run_planted(
    ws: &Workspace,
    plants: &[planted::Plant],
    mut judge: impl FnMut(&planted::Plant, &anyhow::Result<&Exercise>, &anyhow::Result<TestRun>),
) {
    let builds = planted::builds(&ws.workbook, plants);
    println!("  {} plants in {} builds", plants.len(), builds.len());
    for build in builds {
        let exercises: Vec<anyhow::Result<&Exercise>> =
            build.iter().map(|p| ws.workbook.exercise(p.exercise)).collect();
        let filters: Vec<String> = exercises.iter().flatten().map(|e| e.test_filter()).collect();
        let run = planted::Planted::write(ws, &build).and_then(|planted| {
            let only_tests_of = Some(build.iter().map(|p| p.exercise).collect());
            let runner = Runner {
                root: ws.root.clone(),
                bodies: Bodies::Planted(planted.exercises.clone()),
                only_tests_of,
                quiet_build: true,
                gpu: None,
            };
            runner.run(&filters)
        });
        for (plant, exercise) in build.iter().zip(&exercises) {
            judge(plant, exercise, &run);
        }
    }
}

/// `verify --natural`: plants each mistake of solutions/natural.toml, a
/// learner's own words rather than a plant's, and counts how often the
/// failures name what it amounts to, name nothing, or name a mistake it is
/// not, by exercise and by phase. Fails when one misleads or passes.
pub fn natural(ws: &Workspace, exercises: &[u32]) -> anyhow::Result<bool> {
    let plants = only_of(planted::load_natural(&ws.root)?, exercises);
    println!("{}", bold(&format!("Natural mistakes ({}), planted one at a time", planted::NATURAL_FILE)));
    // By exercise: [named, unnamed, misleading, passed, amounting to a named mistake].
    let mut counts: std::collections::BTreeMap<u32, [usize; 5]> = Default::default();
    let mut ok = true;
    run_planted(ws, &plants, |plant, exercise, run| {
        let verdict = match (exercise, run) {
            (Ok(exercise), Ok(run)) => planted::classify(exercise, plant, run),
            (Err(error), _) | (_, Err(error)) => {
                println!("  {} exercise {}, {}: {error:#}", red("✗"), plant.exercise, plant.label());
                ok = false;
                return;
            }
        };
        let count = counts.entry(plant.exercise).or_default();
        count[4] += usize::from(planted::natural_is(plant).flatten().is_some());
        let (slot, line) = match &verdict {
            planted::Verdict::Named => (0, green("named")),
            planted::Verdict::Unnamed => (1, "unnamed".to_string()),
            planted::Verdict::Misleading(id) => (2, red(&format!("misleading: a failure names `{id}`"))),
            planted::Verdict::Passed => (3, red("passes every test")),
        };
        count[slot] += 1;
        ok &= slot < 2;
        println!("  exercise {:>2}, {}: {line}", plant.exercise, plant.label());
    });
    println!();
    let mut by_phase: std::collections::BTreeMap<u32, [usize; 5]> = Default::default();
    for (&number, count) in &counts {
        let phase = ws.workbook.exercise(number).map_or(0, |e| e.phase);
        let total = by_phase.entry(phase).or_default();
        for (sum, n) in total.iter_mut().zip(count) {
            *sum += n;
        }
        println!("  exercise {number:>2}: {}", natural_counts(count));
    }
    for (phase, count) in by_phase {
        println!("{}", bold(&format!("Phase {phase}: {}", natural_counts(&count))));
    }
    Ok(ok)
}

/// `[named, unnamed, misleading, passed, amounting to a named mistake]` in words.
fn natural_counts(count: &[usize; 5]) -> String {
    let total: usize = count[..4].iter().sum();
    format!(
        "{} of {total} named ({:.0}%; {} amount to a named mistake), {} unnamed, {} misleading, {} pass",
        count[0],
        100.0 * count[0] as f64 / total.max(1) as f64,
        count[4],
        count[1],
        count[2],
        count[3]
    )
}

/// Part 5: `depends` in info.toml is the truth: each exercise's tests pass
/// with only its chain's reference bodies compiled in, every other exercise
/// the shipped stub. A learner who leans on that chain can do the exercise,
/// and the plants that share a build do not reach each other.
fn dependencies_suffice(ws: &Workspace, tally: &mut Tally) {
    tally.section("Each exercise needs only what its `depends` says (its chain's reference bodies, stubs elsewhere)");
    for exercise in &ws.workbook.exercises {
        let chain = ws.workbook.chain(exercise.number);
        let bodies = Bodies::ReferenceOf(chain.iter().copied().chain([exercise.number]).collect());
        let only_tests_of = Some(vec![exercise.number]);
        let runner = Runner { root: ws.root.clone(), bodies, only_tests_of, quiet_build: true, gpu: None };
        let filter = exercise.test_filter();
        let run = match runner.run(std::slice::from_ref(&filter)) {
            Ok(run) => run,
            Err(error) => return tally.check(false, || format!("exercise {}: {error:#}", exercise.number)),
        };
        tally.check(run.finished && run.under(&filter).next().is_some(), || {
            format!("exercise {}: the tests did not run to the end (`{}`)", exercise.number, runner.command_line())
        });
        for result in run.under(&filter) {
            tally.check(result.outcome != Outcome::Failed, || {
                let message = result.message.as_deref().unwrap_or("(no message)");
                match unfinished_exercise(message).filter(|n| *n != exercise.number) {
                    Some(called) => format!(
                        "{} calls exercise {called}, which is not in exercise {}'s `depends` (nor in theirs): \
                         add it in {}",
                        result.name,
                        exercise.number,
                        metadata::INFO_FILE
                    ),
                    None => format!(
                        "{} fails with only its chain {chain:?} compiled from the reference (`{}`):\n{}",
                        result.name,
                        runner.command_line(),
                        indented(message, 6)
                    ),
                }
            });
        }
    }
}

/// Part 6: rustc's warnings reach the learner: nothing silences a lint in the
/// exercise wiring or files, and neither the stubs nor the references warn
/// (read from the builds of parts 2 and 3: cargo repeats a cached build's
/// warnings, and a separate `cargo build --lib` would rebuild candle, whose
/// features differ without the tests' dev-dependencies).
fn no_warnings(ws: &Workspace, builds: [(&str, Option<TestRun>); 2], tally: &mut Tally) {
    tally.section("Warnings stay on (the library as the stubs and the references build it)");
    let wiring = ws.read(Path::new("src/exercises.rs")).unwrap_or_default();
    tally.check(!wiring.contains("allow("), || "src/exercises.rs silences a lint: run `cargo xtask update`".into());
    for exercise in &ws.workbook.exercises {
        let files = [Ok(exercise.file.clone()), exercise.solution_file()];
        for file in files.into_iter().flatten() {
            let text = ws.read(&file).unwrap_or_default();
            tally.check(!text.contains("allow("), || {
                format!("{} silences a lint: the learner must see rustc's warnings", file.display())
            });
        }
    }
    for (what, run) in builds {
        let Some(run) = run else {
            tally.check(false, || format!("{what} did not build, so their warnings are unknown"));
            continue;
        };
        tally.check(run.lib_warnings.is_none(), || {
            format!(
                "{what} build with warnings ({}): cargo's output above shows them",
                run.lib_warnings.as_deref().unwrap_or("")
            )
        });
    }
}

/// Part 7: every path of the workbook a chapter cites exists, every figure
/// and quoted number is what its recorded data gives, every figure is shown
/// and every measured number included from a run, and the guide builds,
/// when mdbook is installed.
fn guide_builds(ws: &Workspace, tally: &mut Tally) {
    tally.section(
        "Guide: cited paths exist, figures and numbers are current, numbers come from runs, code fits the page, \
         the book builds (mdbook build guide)",
    );
    cited_paths_exist(ws, tally);
    figures_current_and_shown(ws, tally);
    numbers_from_runs(ws, tally);
    code_fits_the_page(ws, tally);
    match Command::new("mdbook").args(["build", "guide"]).current_dir(&ws.root).output() {
        Err(error) if error.kind() == ErrorKind::NotFound => {
            println!("  skipped: mdbook is not on PATH (`cargo install mdbook` adds this check)");
        }
        Err(error) => tally.check(false, || format!("cannot run mdbook: {error}")),
        Ok(output) => {
            let log = String::from_utf8_lossy(&output.stderr);
            eprint!("{log}");
            tally.check(output.status.success(), || "`mdbook build guide` failed (its errors are above)".into());
            // A warning is a page that renders wrong: an unclosed `<tag>` swallows the text after it.
            let warnings = log.lines().filter(|line| line.contains(" WARN ")).count();
            tally.check(warnings == 0, || format!("`mdbook build guide` warned {warnings} time(s) (above)"));
        }
    }
    tally.end_section();
}

/// The figures check (`figures check`) passes, and a chapter shows every
/// figure in `guide/src/figures/` as a link to itself.
fn figures_current_and_shown(ws: &Workspace, tally: &mut Tally) {
    match figures::run_figures(&ws.root, "check") {
        Ok(current) => tally.check(current, || {
            "a figure, number file or quoted value is stale (named above): run `cargo xtask figures`".into()
        }),
        Err(error) => tally.check(false, || format!("cannot check the figures: {error:#}")),
    }
    let chapters: String = markdown_files(&ws.root.join("guide/src"))
        .iter()
        .map(|chapter| std::fs::read_to_string(chapter).unwrap_or_default())
        .collect();
    for figure in files_under(&ws.root, Path::new(figures::FIGURES)) {
        let name = figure.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        tally.check(shows_full_size(&chapters, &name), || {
            format!(
                "{} is shown by no chapter as a link to itself: write [![...](../figures/{name})](../figures/{name}) \
                 (a phone shrinks the picture to its screen; the link opens it at full size)",
                figure.display()
            )
        });
    }
}

/// Whether `text` shows the figure file `name` as an image that links to
/// the same file: `[![alt](../figures/x.svg)](../figures/x.svg)`.
fn shows_full_size(text: &str, name: &str) -> bool {
    let file = format!("figures/{name}");
    let shown = format!("{file})](");
    text.match_indices(&shown).any(|(at, _)| {
        let Some((before, folder)) = text[..at].rsplit_once("](") else { return false };
        let link = text[at + shown.len()..].split_once(')').map_or("", |(path, _)| path);
        let alt_only = before.rsplit_once("[![").is_some_and(|(_, alt)| !alt.contains(']'));
        alt_only && link == format!("{folder}{file}")
    })
}

/// Every measured number a chapter shows is quoted from the files the
/// figures program writes from committed runs: none is typed with a unit
/// outside a quote (the worked examples `quoted::WORKED` lists aside), and
/// every anchor is quoted by some chapter. That each quote names an anchor,
/// and holds what it gives, is the figures check's.
fn numbers_from_runs(ws: &Workspace, tally: &mut Tally) {
    let guide = ws.root.join("guide/src");
    let numbers = ws.root.join(figures::NUMBERS);
    let mut quoted_anchors = BTreeSet::new();
    for chapter in markdown_files(&guide).into_iter().filter(|chapter| !chapter.starts_with(&numbers)) {
        let text = std::fs::read_to_string(&chapter).unwrap_or_default();
        let name = chapter.strip_prefix(&guide).unwrap_or(&chapter).to_string_lossy().replace('\\', "/");
        no_typed_numbers(&name, &text, tally);
        for quote in chapters::quotes(&text).unwrap_or_default() {
            quoted_anchors.insert((quote.file.to_string(), quote.anchor.to_string()));
        }
    }
    for file in files_under(&ws.root, Path::new(figures::NUMBERS)) {
        let text = ws.read(&file).unwrap_or_default();
        let name = file.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        for anchor in chapters::anchors(&text) {
            tally.check(quoted_anchors.contains(&(name.clone(), anchor.to_string())), || {
                format!("{}: `{anchor}` is quoted by no chapter: quote it, or stop writing it", file.display())
            });
        }
    }
    for (chapter, _) in quoted::WORKED {
        tally.check(guide.join(chapter).is_file(), || {
            format!("tools/src/quoted.rs allows numbers in guide/src/{chapter}, which does not exist")
        });
    }
}

/// No line of a chapter's code blocks is wider than the page shows.
fn code_fits_the_page(ws: &Workspace, tally: &mut Tally) {
    let guide = ws.root.join("guide/src");
    for chapter in markdown_files(&guide) {
        let text = std::fs::read_to_string(&chapter).unwrap_or_default();
        let name = chapter.strip_prefix(&guide).unwrap_or(&chapter).to_string_lossy().replace('\\', "/");
        for wide in code_width::wide_code_lines(&text) {
            tally.check(false, || {
                format!(
                    "guide/src/{name}:{}: a code line of {} columns scrolls sideways (the page shows {}): break a \
                     command with `\\`, elide illustrative output with `…`, draw a diagram narrower",
                    wide.line,
                    wide.columns,
                    code_width::COLUMNS
                )
            });
        }
    }
}

/// The chapter `name` (under `guide/src/`) types no measured number, and
/// holds every phrase `quoted::WORKED` allows in it.
fn no_typed_numbers(name: &str, text: &str, tally: &mut Tally) {
    let worked: Vec<&str> = quoted::WORKED.iter().filter(|(c, _)| *c == name).map(|(_, phrase)| *phrase).collect();
    let (typed, unused) = quoted::typed_numbers(text, &worked);
    tally.check(typed.is_empty(), || {
        let list: Vec<String> = typed.iter().map(|t| format!("line {}: `{}`", t.line, t.text)).collect();
        format!(
            "guide/src/{name} types measured numbers ({}): quote each from the file `cargo xtask figures` \
             writes from its run (guide/src/numbers/), as `<!-- from FILE:ANCHOR --><!-- end -->`, which \
             `cargo xtask figures` fills in; a constant or a number worked on the page goes in tools/src/quoted.rs",
            list.join(", ")
        )
    });
    for phrase in unused {
        tally.check(false, || {
            format!("tools/src/quoted.rs allows `{phrase}` in guide/src/{name}, which no longer holds it")
        });
    }
}

#[cfg(test)]
mod tests {
    use super::{cited_paths, shows_full_size};

    #[test]
    fn a_figure_is_shown_as_a_link_to_itself() {
        let name = "ring-steps.svg";
        assert!(shows_full_size("See [![Ring](../figures/ring-steps.svg)](../figures/ring-steps.svg).", name));
        assert!(!shows_full_size("![Ring](../figures/ring-steps.svg)", name), "an image alone shrinks on a phone");
        assert!(!shows_full_size("[![Ring](../figures/ring-steps.svg)](../figures/zero-memory.svg)", name));
        assert!(!shows_full_size("[![Ring](../figures/other-ring-steps.svg)](../figures/other-ring-steps.svg)", name));
    }

    #[test]
    fn the_guide_shows_flags_as_typed() {
        let book = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../guide/book.toml")).unwrap();
        let config: toml::Table = toml::from_str(&book).unwrap();
        assert_eq!(
            config["output"]["html"].get("smart-punctuation").and_then(|v| v.as_bool()),
            Some(false),
            "guide/book.toml: mdBook's smart punctuation shows `--ddp-overlap` outside code as an en dash and a word"
        );
    }

    #[test]
    fn a_chapter_cites_paths_under_the_workbooks_folders_not_placeholders() {
        let folders = ["src/".to_string(), "tests/".to_string()];
        let text = "see `src/parallel/pipeline/mod.rs:304`, `tests/graded/gpu.rs`, `step_NNNNNN`, \
                    `src/*.rs`, `src/<your file>`, `cargo test exercise_05` and `trainer/src/run.rs`";
        let cited: Vec<&str> = cited_paths(text, &folders).collect();
        assert_eq!(cited, ["src/parallel/pipeline/mod.rs", "tests/graded/gpu.rs"]);
    }
}
