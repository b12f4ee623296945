//! The learner's subcommands: next, list, check, check-phase, hint, reset.
//! Each reads the metadata, grades through `grading`, records through
//! `progress` and prints through `render`.

use std::collections::BTreeMap;
use std::io::{IsTerminal, Write};

use anyhow::{bail, Context, Result};

use crate::grading::{phase_filter, Outcome, Runner, TestResult, TestRun, TEST_BINARY};
use crate::lean;
use crate::machine::GpuBuild;
use crate::metadata::{Exercise, Hint};
use crate::progress::{Body, Progress, State, PROGRESS_FILE};
use crate::render::{self, bold, dim, green, red, yellow};
use crate::standing::{self, Standing};
use crate::stub;
use crate::workspace::Workspace;

/// Where `next` starts looking.
#[derive(Debug, Clone, Copy)]
pub enum Start {
    /// The first exercise.
    First,
    /// The first exercise of this phase.
    Phase(u32),
    /// This exercise, whatever its state.
    Exercise(u32),
}

/// Shows the first exercise from `start` on that the learner's own code
/// does not pass yet (leaned-on exercises skipped), and returns its number;
/// `None` when there is none.
pub fn next(ws: &Workspace, start: Start) -> Result<Option<u32>> {
    print_body_notes(ws)?;
    let candidates = match start {
        Start::First => to_grade(ws, 0)?,
        Start::Phase(phase) => {
            let first = ws.workbook.exercises_in(ws.workbook.phase(phase)?.number).map(|e| e.number).min();
            to_grade(ws, first.unwrap_or(0))?
        }
        Start::Exercise(number) => vec![ws.workbook.exercise(number)?],
    };
    let (states, run) = grade(ws, &candidates)?;
    let shown = match start {
        Start::Exercise(_) => candidates.iter().zip(states).next(),
        _ => candidates.iter().zip(states).find(|(_, state)| *state != State::Done),
    };
    let all = known_states(ws)?;
    let Some((exercise, state)) = shown else {
        nothing_left(ws, &Standing::of(all));
        return Ok(None);
    };
    println!();
    if let Some(finished) = standing::phase_completed_before(&ws.workbook, exercise, &all) {
        println!("{}", green(&format!("Phase {finished} is complete.")));
        println!("`cargo xtask check-phase {finished}` grades it as a whole.\n");
    }
    let chain: Vec<render::Link> = ws
        .workbook
        .chain(exercise.number)
        .into_iter()
        .map(|n| render::Link { number: n, state: all.get(&n).copied().unwrap_or(State::Unchecked) })
        .collect();
    let hints_read = Progress::load(&ws.root).hints(exercise.number).seen();
    render::exercise_card(&ws.workbook, exercise, &ws.position(exercise), &chain, hints_read);
    let number = exercise.number;
    match state {
        State::Failing => {
            let (passed, total) = count(run.under(&exercise.test_filter()));
            println!();
            println!("{}", red(&format!("Started: {passed}/{total} checks pass so far.")));
            println!("`cargo xtask check {number}` shows which fail and why.");
        }
        State::Done => println!("\n{}", green(&format!("Exercise {number} already passes."))),
        State::Leaned => println!(
            "\n{}",
            yellow(&render::wrap(
                &format!(
                    "Exercise {number} is leaned on: the reference body runs in place of yours. \
                     `cargo xtask lean --off {number}` compiles your code again."
                ),
                0
            ))
        ),
        State::DoesNotParse => println!(
            "\n{}",
            red(&render::wrap(
                &format!(
                    "Its file does not parse, where the note above says: the reference body runs in its place \
                     until you fix it; then `cargo xtask check {number}` grades your code."
                ),
                0
            ))
        ),
        State::NotStarted | State::Unchecked => {}
    }
    Ok(Some(number))
}

/// The exercises `next` grades to find the first not done from exercise
/// `first` on, leaned-on ones skipped. A shipped stub never passes, so that
/// one is at the latest the first still untouched: grading stops there.
fn to_grade(ws: &Workspace, first: u32) -> Result<Vec<&Exercise>> {
    let mut candidates = Vec::new();
    for exercise in ws.workbook.exercises.iter().filter(|e| e.number >= first && !ws.leans_on(e.number)) {
        candidates.push(exercise);
        if !ws.started(exercise)? {
            break;
        }
    }
    Ok(candidates)
}

/// Every exercise's state without running a test: the states just graded
/// and recorded, the others as last known (see [`State::known`]).
fn known_states(ws: &Workspace) -> Result<BTreeMap<u32, State>> {
    let progress = Progress::load(&ws.root);
    ws.workbook.exercises.iter().map(|e| Ok((e.number, known_state(ws, e, &progress)?))).collect()
}

/// `exercise`'s state as [`State::known`] tells it; with `--solutions`
/// every body is the reference, which passes.
fn known_state(ws: &Workspace, exercise: &Exercise, progress: &Progress) -> Result<State> {
    if ws.solutions {
        return Ok(State::Done);
    }
    Ok(State::known(ws.body(exercise)?, progress.get(exercise.number)))
}

/// The lines that say which exercises run their reference body, if any:
/// those leaned on, and each whose file does not parse, with where it stops.
fn print_body_notes(ws: &Workspace) -> Result<()> {
    print_body_notes_but(ws, None)
}

/// [`print_body_notes`], without exercise `except`'s file when it does not
/// parse (its own report says so).
fn print_body_notes_but(ws: &Workspace, except: Option<u32>) -> Result<()> {
    if let Some(line) = lean::note(&ws.leaned) {
        println!("{}", dim(&line));
    }
    for exercise in ws.workbook.exercises.iter().filter(|e| Some(e.number) != except) {
        if let Some(sentence) = ws.does_not_parse(exercise)? {
            println!("{}", yellow(&render::wrap(&format!("note: {sentence}."), 0)));
        }
    }
    Ok(())
}

/// All exercises, by phase, with their state and the progress per phase.
pub fn list(ws: &Workspace, quick: bool) -> Result<bool> {
    print_body_notes(ws)?;
    let exercises: Vec<&Exercise> = ws.workbook.exercises.iter().collect();
    if !quick {
        grade(ws, &exercises)?;
    }
    let states = known_states(ws)?;
    let progress = Progress::load(&ws.root);
    let title_width = exercises.iter().map(|e| e.title.chars().count()).max().unwrap_or(0);
    let state = |e: &Exercise| states.get(&e.number).copied().unwrap_or(State::Unchecked);
    for phase in &ws.workbook.phases {
        let in_phase: Vec<&Exercise> = ws.workbook.exercises_in(phase.number).collect();
        if in_phase.is_empty() {
            continue;
        }
        let phase_standing = Standing::of(in_phase.iter().map(|e| (e.number, state(e))));
        println!();
        println!(
            "{}  {}",
            bold(&format!("Phase {}: {}", phase.number, phase.title)),
            render::standing(&phase_standing)
        );
        println!("  {}", dim(&render::wrap(&phase.summary, 2)));
        for exercise in in_phase {
            let mut leaned_calls = ws.workbook.chain(exercise.number);
            leaned_calls.retain(|&n| ws.leans_on(n));
            render::list_row(exercise, state(exercise), &leaned_calls, progress.hints(exercise.number), title_width);
        }
    }
    println!();
    println!("{} {}", bold("Overall:"), render::standing(&Standing::of(states)));
    if quick {
        println!("{}", dim(&format!("(last known states from {PROGRESS_FILE}; drop --quick to run the tests)")));
    }
    Ok(true)
}

/// Grades one exercise: every test's verdict, failure messages, a summary.
pub fn check(ws: &Workspace, number: u32) -> Result<bool> {
    let exercise = ws.workbook.exercise(number)?;
    let started = ws.started(exercise)?;
    println!("{}", bold(&format!("Checking exercise {number}: {}", exercise.title)));
    if ws.leans_on(number) {
        println!(
            "It is leaned on: the build compiles its reference body ({}), so its checks would grade the \
             reference, not your code. `cargo xtask lean --off {number}` grades yours.",
            lean::LEAN_FILE
        );
        return Ok(false);
    }
    if let Some(sentence) = ws.does_not_parse(exercise)? {
        println!("{}", red(&render::wrap(&format!("{sentence}."), 0)));
        println!(
            "{}",
            render::wrap(
                "Its checks would grade the reference, not your code, so none ran. Fix it and run this again \
                 (under `cargo xtask watch`, save it).",
                0
            )
        );
        record(ws, [(number, State::DoesNotParse)])?;
        return Ok(false);
    }
    print_body_notes_but(ws, Some(number))?;
    let prefix = exercise.test_filter();
    let run = ws.runner().run(std::slice::from_ref(&prefix))?;
    if run.under(&prefix).next().is_none() {
        if !run.finished {
            bail!("the tests of exercise {number} crashed before any of them reported");
        }
        bail!(
            "no graded tests found for exercise {number}: expected a module `{}` ({}) in the `{TEST_BINARY}` test binary",
            exercise.test_module(),
            exercise.test_file().display()
        );
    }
    println!();
    render::verdicts(&ws.workbook, exercise, run.under(&prefix));
    let (passed, total) = count(run.under(&prefix));
    let state = state_of(started, &run, exercise);
    record(ws, [(number, state)])?;
    println!();
    let summary = format!("exercise {number}: {passed}/{total} checks passed");
    if state == State::Done {
        println!("{}", green(&bold(&summary)));
        // Said once the learner has found it: on the card it would be the answer.
        println!("What it shows: {}", exercise.insight);
        println!("Well done! `cargo xtask next` shows what comes next.");
    } else {
        println!("{}", red(&bold(&summary)));
        if !started {
            println!(
                "It is still the shipped stub: write {} in {}.",
                render::code_list(&exercise.functions),
                ws.position(exercise)
            );
        }
        let stuck = match render::hint_ladder(number, Progress::load(&ws.root).hints(number).seen()) {
            Some(ladder) => format!("Stuck? {ladder}."),
            None => {
                format!("Stuck? You have read every tier of the hint: `cargo xtask hint {number}` shows them again.")
            }
        };
        println!("{}", render::wrap(&stuck, 0));
    }
    Ok(state == State::Done)
}

/// Grades every exercise of one phase: a line per exercise and a total.
pub fn check_phase(ws: &Workspace, number: u32) -> Result<bool> {
    let phase = ws.workbook.phase(number)?;
    let exercises: Vec<&Exercise> = ws.workbook.exercises_in(number).collect();
    if exercises.is_empty() {
        bail!("phase {number} ({}) has no exercises yet", phase.title);
    }
    println!("{}", bold(&format!("Checking phase {number}: {}", phase.title)));
    print_body_notes(ws)?;
    let (states, run) = grade(ws, &exercises)?;
    println!();
    let title_width = exercises.iter().map(|e| e.title.chars().count()).max().unwrap_or(0);
    for (exercise, state) in exercises.iter().zip(&states) {
        let (passed, total) = count(run.under(&exercise.test_filter()));
        let verdict = match state {
            State::Done => green(&format!("{passed}/{total} checks passed")),
            State::Failing | State::Unchecked => red(&format!("{passed}/{total} checks passed")),
            other => render::state_label(*other),
        };
        println!("  {:>2}  {:<title_width$}  {verdict}", exercise.number, exercise.title);
    }
    let in_phase = Standing::of(exercises.iter().map(|e| e.number).zip(states.iter().copied()));
    // A leaned-on exercise runs the reference, which passes: the phase's
    // whole-run checks go ahead with it.
    let whole_phase = check_whole_phase(ws, number, in_phase.open.is_empty())?;
    let (summary, passes) = standing::phase_summary(number, &states, whole_phase);
    let summary = render::wrap(&summary, 0);
    println!();
    match passes {
        true => println!("{}", green(&bold(&summary))),
        false => println!("{}", red(&bold(&summary))),
    }
    if !in_phase.leaned.is_empty() {
        println!("`cargo xtask lean --off {}` grades your code there.", lean::ranges(&in_phase.leaned));
    }
    if !in_phase.open.is_empty() {
        println!("`cargo xtask check N` shows the failing checks of exercise N.");
    }
    Ok(passes)
}

/// Runs the checks of phase `number` as a whole (`tests/graded/phase_N.rs`,
/// e.g. training on several CPU ranks), once its exercises pass. `None` when
/// the phase has none.
fn check_whole_phase(ws: &Workspace, number: u32, exercises_pass: bool) -> Result<Option<bool>> {
    if !ws.root.join(format!("tests/graded/phase_{number}.rs")).exists() {
        return Ok(None);
    }
    let label = "multi-rank checks (CPU ranks as processes and threads)";
    if !exercises_pass {
        println!("      {label}  {}", dim("waiting for the exercises above"));
        return Ok(Some(false));
    }
    let filter = phase_filter(number);
    // Cargo's lines would land inside the table (they are shown if the
    // build fails); a terminal sees the row wait, then its verdict over it.
    let terminal = std::io::stdout().is_terminal();
    if terminal {
        print!("      {label}  {}\r", dim("running…"));
        std::io::stdout().flush()?;
    }
    let run = Runner { quiet_build: true, ..ws.runner() }.run(std::slice::from_ref(&filter))?;
    let cpu_passes = print_verdict(label, &run, &filter, &format!("cargo test {filter}"));
    let gpu_passes = match crate::machine::gpu_build() {
        Some(build) => check_on_gpu(ws, number, &build)?,
        None => true,
    };
    Ok(Some(cpu_passes && gpu_passes))
}

/// Runs the GPU checks in a build with the GPU feature: the single-GPU ones
/// (`tests/graded/gpu.rs`: your model and train step on GPU 0 against
/// PyTorch's numbers, with NCCL a one-rank NCCL group) and, on two GPUs or
/// more, phase `number`'s multi-rank checks over NCCL (`tests/graded/gpu_ranks.rs`).
fn check_on_gpu(ws: &Workspace, number: u32, build: &GpuBuild) -> Result<bool> {
    println!(
        "      {}",
        dim(&format!(
            "a CUDA device is here: building with --features {} (the first build compiles candle's CUDA kernels, minutes)",
            build.feature
        ))
    );
    let runner = Runner { gpu: Some(build.feature), ..ws.runner() };
    let single = "gpu::".to_string();
    let ranks = build.multi_rank().then(|| format!("gpu_ranks::phase_{number}_"));
    let filters: Vec<String> = std::iter::once(single.clone()).chain(ranks.clone()).collect();
    let run = runner.run(&filters)?;
    let rerun = |filter: &str| format!("{} {filter}", runner.command_line());
    let mut passes = print_verdict("single-GPU checks (GPU 0)", &run, &single, &rerun(&single));
    // Phase 4 has no multi-rank checks on GPUs: no test runs under its filter.
    if let Some(filter) = ranks.filter(|filter| count(run.under(filter)).1 > 0) {
        let label = format!("multi-rank checks on {} GPUs (one process per GPU, NCCL)", build.gpus);
        passes &= print_verdict(&label, &run, &filter, &rerun(&filter));
    }
    Ok(passes)
}

/// Prints `label` with how many of `run`'s tests under `filter` passed, and
/// the `rerun` command that shows why when some failed; returns whether all
/// (and at least one) passed.
fn print_verdict(label: &str, run: &TestRun, filter: &str, rerun: &str) -> bool {
    let (passed, total) = count(run.under(filter));
    let passes = passed == total && total > 0;
    let verdict = match passes {
        true => green(&format!("{passed}/{total} checks passed")),
        false => red(&format!("{passed}/{total} checks passed (`{rerun}` shows why)")),
    };
    println!("      {label}  {verdict}");
    passes
}

/// Prints the hint's tiers read so far (at least the first; one tier further
/// for each `--more`), with the last tier the mistakes the tests catch (each
/// says what is right, so it comes with the recipe), and records the tiers
/// read: apart once the exercise passes.
pub fn hint(ws: &Workspace, number: u32, more: u8) -> Result<bool> {
    let exercise = ws.workbook.exercise(number)?;
    let mut progress = Progress::load(&ws.root);
    let shown = progress.hints(number).seen().max(1).saturating_add(more).min(Hint::TIERS);
    println!("{}", bold(&format!("Hint for exercise {number}: {}", exercise.title)));
    for (tier, (heading, text)) in exercise.hint.tiers().into_iter().enumerate().take(shown.into()) {
        println!();
        println!("{}", bold(&format!("{heading} ({} of {}):", tier + 1, Hint::TIERS)));
        println!("{}", render::indented(text.trim(), 2));
    }
    println!();
    let passed = !ws.solutions && known_state(ws, exercise, &progress)? == State::Done;
    match (render::hint_ladder(number, shown), passed) {
        (Some(ladder), false) => println!("{}", dim(&render::wrap(&format!("Try it with this first; {ladder}."), 0))),
        (Some(ladder), true) => println!("{}", dim(&render::wrap(&format!("Your code passes already; {ladder}."), 0))),
        (None, _) => println!("{}", dim("That was the last tier.")),
    }
    if !ws.solutions {
        progress.read_hint(number, shown, passed);
        progress.save(&ws.root)?;
    }
    if shown == Hint::TIERS {
        println!();
        println!("{}", bold("Common mistakes the tests catch:"));
        for mistake in exercise.mistakes.iter().map(|m| &m.text) {
            println!("  - {mistake}");
        }
    }
    println!();
    println!("More in the guide: {}", exercise.chapter_file().display());
    Ok(true)
}

/// Puts the shipped `todo!` stub back into every function of the exercise,
/// after asking (unless `yes`).
pub fn reset(ws: &Workspace, number: u32, yes: bool) -> Result<bool> {
    let exercise = ws.workbook.exercise(number)?;
    let functions = render::code_list(&exercise.functions);
    let source = ws.read(&exercise.file)?;
    let shipped = stub::reset(&source, &exercise.fn_names(), &exercise.stub_line())
        .with_context(|| format!("cannot reset {functions} in {}", exercise.file.display()))?;
    if shipped == source {
        println!("Exercise {number} is already the shipped stub; nothing to reset.");
        return Ok(true);
    }
    println!("This replaces your code in {functions} ({}) with the shipped `todo!` stub.", ws.position(exercise));
    println!("Your code there will be lost; the rest of the file stays as it is.");
    if !yes && !confirm(&format!("Reset exercise {number}? [y/N] "))? {
        println!("Nothing changed.");
        return Ok(true);
    }
    let path = ws.root.join(&exercise.file);
    std::fs::write(&path, shipped).with_context(|| format!("cannot write {}", path.display()))?;
    record(ws, [])?;
    println!("Exercise {number} is back to its shipped stub.");
    Ok(true)
}

fn confirm(question: &str) -> Result<bool> {
    print!("{question}");
    std::io::stdout().flush()?;
    let mut answer = String::new();
    std::io::stdin().read_line(&mut answer).context("cannot read the answer from stdin")?;
    if !std::io::stdin().is_terminal() {
        println!(); // a piped answer is not echoed, so end the prompt's line here
    }
    Ok(matches!(answer.trim().to_ascii_lowercase().as_str(), "y" | "yes"))
}

/// What `next` says when, from where it started, the learner's own code
/// passes every exercise not leaned on: well done only when that is all of them.
fn nothing_left(ws: &Workspace, all: &Standing) {
    println!();
    if !all.complete() {
        all.what_is_left().iter().for_each(|line| println!("{}", render::wrap(line, 0)));
        return;
    }
    println!("{}", green(&bold(&format!("All {} exercises pass, all of them your own code. Well done!", all.total()))));
    println!("Next, grade each phase as a whole (this also runs the phase-level checks):");
    for phase in &ws.workbook.phases {
        if ws.workbook.exercises_in(phase.number).next().is_some() {
            println!("  cargo xtask check-phase {}   ({})", phase.number, phase.title);
        }
    }
    println!("and `cargo xtask list` for the overview.");
}

/// States of `exercises`: leaned on, not parsing, not started, or the
/// learner's code graded in one test run, which is also returned. Every
/// state is recorded.
fn grade(ws: &Workspace, exercises: &[&Exercise]) -> Result<(Vec<State>, TestRun)> {
    let bodies: Vec<Body> = exercises.iter().map(|e| ws.body(e)).collect::<Result<_>>()?;
    let graded = |(_, body): &(&&Exercise, &Body)| **body == Body::Yours;
    let filters: Vec<String> = exercises.iter().zip(&bodies).filter(graded).map(|(e, _)| e.test_filter()).collect();
    let run = if filters.is_empty() { TestRun::default() } else { ws.runner().run(&filters)? };
    let state = |(e, body): (&&Exercise, &Body)| match body {
        Body::Yours => state_of(true, &run, e),
        other => State::known(*other, None),
    };
    let states: Vec<State> = exercises.iter().zip(&bodies).map(state).collect();
    record(ws, exercises.iter().map(|e| e.number).zip(states.iter().copied()))?;
    Ok((states, run))
}

/// Done when the run finished and every graded test of the exercise passed.
fn state_of(started: bool, run: &TestRun, exercise: &Exercise) -> State {
    let (passed, total) = count(run.under(&exercise.test_filter()));
    if !started {
        State::NotStarted
    } else if run.finished && total > 0 && passed == total {
        State::Done
    } else {
        State::Failing
    }
}

/// (passed, run) among the tests given; ignored tests are not counted.
fn count<'a>(results: impl Iterator<Item = &'a TestResult>) -> (usize, usize) {
    results.fold((0, 0), |(passed, total), result| match result.outcome {
        Outcome::Passed => (passed + 1, total + 1),
        Outcome::Failed => (passed, total + 1),
        Outcome::Ignored => (passed, total),
    })
}

/// Updates the progress file with freshly graded states; every other
/// exercise keeps its last known state unless what runs has changed since
/// (see [`State::known`]). Grading the solutions says nothing about the
/// learner, so it is not recorded.
fn record(ws: &Workspace, graded: impl IntoIterator<Item = (u32, State)>) -> Result<()> {
    if ws.solutions {
        return Ok(());
    }
    let mut progress = Progress::load(&ws.root);
    for (number, state) in graded {
        progress.set(number, state);
    }
    for exercise in &ws.workbook.exercises {
        progress.set(exercise.number, known_state(ws, exercise, &progress)?);
    }
    progress.retain(|number| ws.workbook.exercise(number).is_ok());
    progress.save(&ws.root)
}
