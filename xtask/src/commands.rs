//! The learner's subcommands: next, list, check, check-phase, hint, reset.
//! Each reads the metadata, grades through `grading`, records through
//! `progress` and prints through `render`.

use std::io::{IsTerminal, Write};

use anyhow::{bail, Context, Result};

use crate::doctor::GpuBuild;
use crate::grading::{phase_filter, Outcome, Runner, TestResult, TestRun, TEST_BINARY};
use crate::lean;
use crate::metadata::{Exercise, Hint};
use crate::progress::{Progress, State, PROGRESS_FILE};
use crate::render::{self, bold, dim, green, red};
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

/// Shows the first exercise from `start` on whose graded tests do not all
/// pass (leaned-on exercises skipped), and returns its number; `None` when
/// every one passes.
pub fn next(ws: &Workspace, start: Start) -> Result<Option<u32>> {
    print_lean_note(ws);
    let first = match start {
        Start::First => 0,
        Start::Phase(phase) => {
            ws.workbook.exercises_in(ws.workbook.phase(phase)?.number).map(|e| e.number).min().unwrap_or(0)
        }
        Start::Exercise(number) => ws.workbook.exercise(number)?.number,
    };
    // A shipped stub never passes, so the next exercise is at the latest the
    // first one still untouched: only the exercises up to it need grading.
    let mut candidates = Vec::new();
    for exercise in ws.workbook.exercises.iter().filter(|e| e.number >= first && !ws.leans_on(e.number)) {
        candidates.push(exercise);
        if !ws.started(exercise)? || matches!(start, Start::Exercise(_)) {
            break;
        }
    }
    let (states, run) = grade(ws, &candidates)?;
    let shown = match start {
        Start::Exercise(_) => candidates.iter().zip(states).next(),
        _ => candidates.iter().zip(states).find(|(_, state)| *state != State::Done),
    };
    let Some((exercise, state)) = shown else {
        all_done(ws);
        return Ok(None);
    };
    println!();
    if let Some(finished) = phase_just_finished(ws, exercise) {
        println!("{}", green(&format!("Phase {finished} is complete.")));
        println!("`cargo xtask check-phase {finished}` grades it as a whole.\n");
    }
    let progress = Progress::load(&ws.root);
    let chain: Vec<render::Link> = ws
        .workbook
        .chain(exercise.number)
        .into_iter()
        .map(|n| render::Link { number: n, state: link_state(ws, &progress, n) })
        .collect();
    render::exercise_card(&ws.workbook, exercise, &ws.position(exercise), &chain);
    match state {
        State::Failing => {
            let (passed, total) = count(run.under(&exercise.test_filter()));
            println!();
            println!("{}", red(&format!("Started: {passed}/{total} checks pass so far.")));
            println!("`cargo xtask check {}` shows which fail and why.", exercise.number);
        }
        State::Done => println!("\n{}", green(&format!("Exercise {} already passes.", exercise.number))),
        _ => {}
    }
    Ok(Some(exercise.number))
}

/// Where exercise `number` stands as a link of another's chain: leaned on,
/// or its last known state (a stub is not started, whatever was recorded).
fn link_state(ws: &Workspace, progress: &Progress, number: u32) -> render::LinkState {
    if ws.leans_on(number) {
        return render::LinkState::Reference;
    }
    let started = ws.workbook.exercise(number).and_then(|e| ws.started(e)).unwrap_or(true);
    match (started, progress.get(number)) {
        (_, _) if ws.solutions => render::LinkState::Done,
        (false, _) => render::LinkState::Unfinished(State::NotStarted),
        (true, Some(State::Done)) => render::LinkState::Done,
        (true, Some(state)) => render::LinkState::Unfinished(state),
        (true, None) => render::LinkState::Unfinished(State::Unchecked),
    }
}

/// The one line that says which exercises run their reference body, if any.
fn print_lean_note(ws: &Workspace) {
    if let Some(line) = lean::note(&ws.leaned) {
        println!("{}", dim(&line));
    }
}

/// All exercises, by phase, with their state and the progress per phase.
pub fn list(ws: &Workspace, quick: bool) -> Result<bool> {
    print_lean_note(ws);
    let exercises: Vec<&Exercise> = ws.workbook.exercises.iter().collect();
    let states: Vec<State> = if quick {
        let progress = record(ws, [])?;
        exercises.iter().map(|e| progress.get(e.number).unwrap_or(State::Unchecked)).collect()
    } else {
        grade(ws, &exercises)?.0
    };
    let progress = Progress::load(&ws.root);
    let title_width = exercises.iter().map(|e| e.title.chars().count()).max().unwrap_or(0);
    let done = |state: &&State| **state == State::Done;
    for phase in &ws.workbook.phases {
        let in_phase: Vec<(&Exercise, State)> =
            exercises.iter().zip(&states).filter(|(e, _)| e.phase == phase.number).map(|(e, s)| (*e, *s)).collect();
        if in_phase.is_empty() {
            continue;
        }
        let phase_done = in_phase.iter().map(|(_, s)| s).filter(done).count();
        println!();
        println!(
            "{}  {}",
            bold(&format!("Phase {}: {}", phase.number, phase.title)),
            render::tally(phase_done, in_phase.len())
        );
        println!("  {}", dim(&render::wrap(&phase.summary, 2)));
        for (exercise, state) in in_phase {
            let state = if ws.leans_on(exercise.number) { None } else { Some(state) };
            render::list_row(exercise, state, progress.hint_tiers(exercise.number), title_width);
        }
    }
    let all_done = states.iter().filter(done).count();
    println!();
    println!("{} {}", bold("Overall:"), render::tally(all_done, states.len()));
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
    print_lean_note(ws);
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
        println!(
            "Stuck? `cargo xtask hint {number}` gives the idea and the mistakes these checks catch; `--more` goes further."
        );
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
    print_lean_note(ws);
    let (states, run) = grade(ws, &exercises)?;
    println!();
    let title_width = exercises.iter().map(|e| e.title.chars().count()).max().unwrap_or(0);
    for (exercise, state) in exercises.iter().zip(&states) {
        let (passed, total) = count(run.under(&exercise.test_filter()));
        let verdict = match state {
            _ if ws.leans_on(exercise.number) => dim("reference body (leaned on)"),
            State::Done => green(&format!("{passed}/{total} checks passed")),
            State::NotStarted => dim("not started"),
            _ => red(&format!("{passed}/{total} checks passed")),
        };
        println!("  {:>2}  {:<title_width$}  {verdict}", exercise.number, exercise.title);
    }
    // A leaned-on exercise runs the reference, which passes: the phase's
    // whole-run checks go ahead with it.
    let mut passing =
        exercises.iter().zip(&states).filter(|(e, s)| **s == State::Done || ws.leans_on(e.number)).count();
    let mut total = exercises.len();
    if let Some(whole_phase_passes) = check_whole_phase(ws, number, passing == total)? {
        total += 1;
        passing += usize::from(whole_phase_passes);
    }
    println!();
    let summary = format!("phase {number}: {passing}/{total} checks pass");
    if passing == total {
        println!("{}", green(&bold(&summary)));
    } else {
        println!("{}", red(&bold(&summary)));
        println!("`cargo xtask check N` shows the failing checks of exercise N.");
    }
    Ok(passing == total)
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
    let run = ws.runner().run(std::slice::from_ref(&filter))?;
    let cpu_passes = print_verdict(label, &run, &filter, &format!("cargo test {filter}"));
    let gpu_passes = match crate::doctor::gpu_build() {
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

/// Prints the hint's tiers read so far (at least the first; with `more`, one
/// tier further), with the last tier the mistakes the tests catch (each says
/// what is right, so it comes with the recipe), and records the tiers read.
pub fn hint(ws: &Workspace, number: u32, more: bool) -> Result<bool> {
    let exercise = ws.workbook.exercise(number)?;
    let mut progress = Progress::load(&ws.root);
    let seen = progress.hint_tiers(number);
    let shown = if more { seen.max(1) + 1 } else { seen.max(1) }.min(Hint::TIERS);
    println!("{}", bold(&format!("Hint for exercise {number}: {}", exercise.title)));
    for (tier, (heading, text)) in exercise.hint.tiers().into_iter().enumerate().take(shown.into()) {
        println!();
        println!("{}", bold(&format!("{heading} ({} of {}):", tier + 1, Hint::TIERS)));
        println!("{}", render::indented(text.trim(), 2));
    }
    println!();
    match exercise.hint.tiers().get(usize::from(shown)) {
        Some((next, _)) => println!(
            "{}",
            dim(&format!("Try it with this first; `cargo xtask hint {number} --more` shows {}.", next.to_lowercase()))
        ),
        None => println!("{}", dim("That was the last tier.")),
    }
    if !ws.solutions {
        progress.read_hint(number, shown);
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

fn all_done(ws: &Workspace) {
    let count = ws.workbook.exercises.len();
    println!();
    println!("{}", green(&bold(&format!("All {count} exercises pass. Well done!"))));
    println!("Next, grade each phase as a whole (this also runs the phase-level checks):");
    for phase in &ws.workbook.phases {
        if ws.workbook.exercises_in(phase.number).next().is_some() {
            println!("  cargo xtask check-phase {}   ({})", phase.number, phase.title);
        }
    }
    println!("and `cargo xtask list` for the overview.");
}

/// The phase that ends just before `exercise`, when `exercise` opens a new one.
fn phase_just_finished(ws: &Workspace, exercise: &Exercise) -> Option<u32> {
    let previous = ws.workbook.exercise(exercise.number.checked_sub(1)?).ok()?;
    (previous.phase != exercise.phase).then_some(previous.phase)
}

/// States of `exercises`: a stub is not started; the others are graded in one
/// test run, which is also returned. The states are recorded, except those of
/// exercises leaned on: their tests would grade the reference.
fn grade(ws: &Workspace, exercises: &[&Exercise]) -> Result<(Vec<State>, TestRun)> {
    let started: Vec<bool> = exercises.iter().map(|e| ws.started(e)).collect::<Result<_>>()?;
    let graded = |(e, s): &(&&Exercise, &bool)| **s && !ws.leans_on(e.number);
    let filters: Vec<String> = exercises.iter().zip(&started).filter(graded).map(|(e, _)| e.test_filter()).collect();
    let run = if filters.is_empty() { TestRun::default() } else { ws.runner().run(&filters)? };
    let states: Vec<State> = exercises.iter().zip(&started).map(|(e, s)| state_of(*s, &run, e)).collect();
    let fresh = exercises.iter().zip(&states).filter(|(e, _)| !ws.leans_on(e.number));
    record(ws, fresh.map(|(e, s)| (e.number, *s)))?;
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
/// exercise keeps its last known state unless its body is the stub again.
/// Grading the solutions says nothing about the learner, so it is not recorded.
fn record(ws: &Workspace, graded: impl IntoIterator<Item = (u32, State)>) -> Result<Progress> {
    let mut progress = Progress::load(&ws.root);
    if ws.solutions {
        return Ok(progress);
    }
    for (number, state) in graded {
        progress.set(number, state);
    }
    for exercise in &ws.workbook.exercises {
        let state = match (ws.started(exercise)?, progress.get(exercise.number)) {
            (false, _) => State::NotStarted,
            (true, None | Some(State::NotStarted)) => State::Unchecked,
            (true, Some(known)) => known,
        };
        progress.set(exercise.number, state);
    }
    progress.retain(|number| ws.workbook.exercise(number).is_ok());
    progress.save(&ws.root)?;
    Ok(progress)
}
