//! Running the graded tests and reading their verdicts.
//!
//! The tests are ordinary libtest tests in one test binary, `graded`, with
//! one module per exercise (`exercise_05::...`). We run them through cargo,
//! pass its build progress and compile errors on to the terminal as they come
//! (stderr), and parse libtest's plain report (stdout): one line per test,
//! then a `---- name stdout ----` section per failure.

use std::io::{BufRead, BufReader, IsTerminal, Read};
use std::path::PathBuf;
use std::process::Stdio;

use anyhow::{bail, Context, Result};

use crate::lean::LEAN_VARIABLE;
use crate::workspace::cargo;

/// Where `verify` (tools/) puts its planted copies, and the variable that
/// names them to the build script.
#[path = "../../build/planted_dir.rs"]
mod planted_dir;

use planted_dir::PLANTED_VARIABLE;

/// The test binary that holds every graded test.
pub const TEST_BINARY: &str = "graded";

/// Read by the workbook's build script: the exercises whose test modules the
/// `graded` binary compiles.
pub const ONLY_TESTS_VARIABLE: &str = "WORKBOOK_ONLY_TESTS_OF";

/// How one test ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Passed,
    Failed,
    Ignored,
}

/// One test's verdict and, for a failure, what it panicked with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TestResult {
    /// Full path inside the binary, e.g. `exercise_05::masks_the_future`.
    pub name: String,
    pub outcome: Outcome,
    pub message: Option<String>,
}

/// Everything one run of the test binary reported.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct TestRun {
    pub results: Vec<TestResult>,
    /// Whether libtest printed its final `test result:` line; a run that
    /// crashed (stack overflow, abort) stops without it.
    pub finished: bool,
    /// cargo's `` `workbook` (lib) generated N warnings `` line, when the
    /// library built with warnings (cargo repeats it for a cached build too).
    pub lib_warnings: Option<String>,
}

/// Which body of each exercise a build compiles.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Bodies {
    /// The learner's files, and the reference where they lean on it (`exercises/lean.txt`).
    Learners,
    /// Every reference body (`--features solutions`).
    Reference,
    /// Every reference body, but these exercises' planted copies (`verify`).
    Planted(Vec<u32>),
    /// The reference bodies of these exercises and the shipped stubs of the
    /// others, whatever the learner leans on: the workbook's own checks.
    ReferenceOf(Vec<u32>),
}

/// Runs the graded test binary, on the learner's code or on the solutions.
pub struct Runner {
    pub root: PathBuf,
    pub bodies: Bodies,
    /// Compile only these exercises' test modules (every module when `None`):
    /// builds that grade a few exercises link a fraction of the binary.
    pub only_tests_of: Option<Vec<u32>>,
    /// Keep cargo's build output to ourselves unless the build fails (for
    /// verify's planted builds, whose warnings are the plants' own).
    pub quiet_build: bool,
    /// A GPU feature to build with as well (`cuda` or `nccl`), for the GPU checks.
    pub gpu: Option<&'static str>,
}

impl Runner {
    /// The cargo command, without test filters, as a learner would type it.
    pub fn command_line(&self) -> String {
        let features = match self.features() {
            Some(features) => format!(" --features {features}"),
            None => String::new(),
        };
        let lean = match &self.bodies {
            Bodies::ReferenceOf(numbers) => format!("{LEAN_VARIABLE}={} ", list(numbers)),
            Bodies::Planted(numbers) => format!("{PLANTED_VARIABLE}={} ", list(numbers)),
            _ => String::new(),
        };
        format!("{lean}cargo test --test {TEST_BINARY}{features} --no-fail-fast")
    }

    /// The cargo features of the build, comma-separated, if any.
    fn features(&self) -> Option<String> {
        let solutions = matches!(self.bodies, Bodies::Reference | Bodies::Planted(_)).then_some("solutions");
        let features: Vec<&str> = solutions.into_iter().chain(self.gpu).collect();
        (!features.is_empty()).then(|| features.join(","))
    }

    /// Runs the tests whose names contain any of `filters` (all when empty).
    /// Fails when the code does not compile: cargo has already shown why.
    pub fn run(&self, filters: &[String]) -> Result<TestRun> {
        let mut command = cargo(&self.root);
        command.args(["test", "--test", TEST_BINARY, "--no-fail-fast"]);
        if let Some(features) = self.features() {
            command.args(["--features", &features]);
        }
        let colour_unset = ["NO_COLOR", "CARGO_TERM_COLOR"].iter().all(|var| std::env::var_os(var).is_none());
        if colour_unset && std::io::stderr().is_terminal() {
            // Its stderr is a pipe to us, but ends on the learner's terminal.
            command.args(["--color", "always"]);
        }
        command.args(["--", "--color", "never"]).args(filters);
        // Read by build/main.rs; set even when empty, so the learner's lean.txt does not count.
        if let Bodies::ReferenceOf(numbers) = &self.bodies {
            command.env(LEAN_VARIABLE, list(numbers));
        }
        match &self.bodies {
            Bodies::Planted(numbers) => command.env(PLANTED_VARIABLE, list(numbers)),
            _ => command.env_remove(PLANTED_VARIABLE),
        };
        match &self.only_tests_of {
            Some(numbers) => command.env(ONLY_TESTS_VARIABLE, list(numbers)),
            None => command.env_remove(ONLY_TESTS_VARIABLE),
        };
        // A backtrace would bury the one-line verdict, and candle folds it into error strings.
        command.env("RUST_BACKTRACE", "0");
        // stdout carries libtest's report, which we parse; stderr carries
        // cargo's build progress and compile errors, which the learner sees.
        command.stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = command.spawn().context("cannot run cargo")?;
        let stderr = child.stderr.take().expect("stderr is piped");
        let quiet = self.quiet_build;
        let relay = std::thread::spawn(move || relay_build_output(stderr, quiet));
        let mut stdout = String::new();
        let read = child.stdout.take().expect("stdout is piped").read_to_string(&mut stdout);
        let status = child.wait().context("cannot wait for cargo")?;
        let (held_back, lib_warnings) = relay.join().unwrap_or_default();
        read.context("cannot read the test output")?;
        let run = TestRun { lib_warnings, ..parse(&stdout) };
        if !status.success() && !stdout.lines().any(|line| line.starts_with("running ")) {
            held_back.iter().for_each(|line| eprintln!("{line}"));
            bail!(
                "the workbook did not build (cargo's errors are above); fix them and run this again, \
                 or run `{}` to see the build on its own",
                self.command_line()
            );
        }
        if !run.finished {
            eprintln!(
                "warning: the tests stopped before they finished (a test crashed the whole process, \
                 e.g. a stack overflow); run `{} -- {}` to see where",
                self.command_line(),
                filters.join(" ")
            );
        }
        Ok(run)
    }
}

/// The exercise whose shipped `todo!` a failure message comes from, if any.
pub fn unfinished_exercise(message: &str) -> Option<u32> {
    let rest = message.split("not yet implemented: Exercise ").nth(1)?;
    rest.split(':').next()?.trim().parse().ok()
}

/// Exercise numbers as the build scripts read them: `1,2,7`.
fn list(numbers: &[u32]) -> String {
    numbers.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
}

/// Passes cargo's build output through to the learner as it comes, minus
/// its status and closing "test failed" lines: the verdicts we print say
/// that better.
/// With `quiet`, holds it back instead and returns it, for a failed build.
/// Also returns cargo's line saying the workbook library warned, if it did.
fn relay_build_output(stderr: impl Read, quiet: bool) -> (Vec<String>, Option<String>) {
    let mut filter = CargoNoise::default();
    let mut held_back = Vec::new();
    let mut lib_warnings = None;
    for line in BufReader::new(stderr).split(b'\n').map_while(std::io::Result::ok) {
        let line = String::from_utf8_lossy(&line);
        if line.contains("`workbook` (lib) generated") {
            lib_warnings = Some(line.to_string());
        }
        for shown in filter.pass(&line) {
            match quiet {
                true => held_back.push(shown),
                false => eprintln!("{shown}"),
            }
        }
    }
    (held_back, lib_warnings)
}

/// Drops cargo's `Finished` and `Running` status lines (the build's end and
/// the test binary's path, which would sit above the verdicts), and its
/// `error: test failed, to rerun pass ...` and `error: 1 target failed:`
/// (with the list of targets under it), unless a `Caused by:` follows: that
/// one explains a crash and is kept whole.
#[derive(Default)]
struct CargoNoise {
    in_target_list: bool,
    /// A "test failed" line and the blank lines after it, until we know
    /// whether a `Caused by:` comes.
    held: Vec<String>,
}

impl CargoNoise {
    /// The lines to show now, given the next line of cargo's stderr.
    fn pass(&mut self, line: &str) -> Vec<String> {
        let plain = anstream::adapter::strip_str(line).to_string();
        let plain = plain.trim_end();
        if !self.held.is_empty() {
            if plain.is_empty() {
                self.held.push(line.to_string());
                return Vec::new();
            }
            let held = std::mem::take(&mut self.held);
            if plain.starts_with("Caused by:") {
                return held.into_iter().chain([line.to_string()]).collect();
            }
        }
        if self.in_target_list && plain.starts_with("    `") {
            return Vec::new();
        }
        let status = plain.trim_start();
        if status.starts_with("Finished `") || status.starts_with("Running ") {
            return Vec::new();
        }
        self.in_target_list = plain.starts_with("error: ") && plain.ends_with(" failed:") && plain.contains(" target");
        if plain.starts_with("error: test failed, to rerun pass") {
            self.held.push(line.to_string());
        }
        if self.in_target_list || !self.held.is_empty() {
            return Vec::new();
        }
        vec![line.to_string()]
    }
}

impl TestRun {
    /// The results of tests whose names start with `prefix` (e.g. `exercise_05::`).
    pub fn under<'a>(&'a self, prefix: &'a str) -> impl Iterator<Item = &'a TestResult> + 'a {
        self.results.iter().filter(move |r| r.name.starts_with(prefix))
    }
}

/// `Some(5)` for a graded test such as `exercise_05::masks_the_future`.
pub fn graded_exercise(test_name: &str) -> Option<u32> {
    let (module, _) = test_name.split_once("::")?;
    let digits = module.strip_prefix("exercise_")?;
    if digits.len() != 2 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// `Some(3)` for a check of a phase as a whole, such as `phase_3::ranks_match_ddp`.
pub fn phase_check(test_name: &str) -> Option<u32> {
    let (module, _) = test_name.split_once("::")?;
    module.strip_prefix("phase_")?.parse().ok()
}

/// The filter selecting the whole-phase checks of phase `number`.
pub fn phase_filter(number: u32) -> String {
    format!("phase_{number}::")
}

/// Reads libtest's plain (`--format pretty`, not a terminal) report.
pub fn parse(stdout: &str) -> TestRun {
    let mut run = TestRun::default();
    let mut section: Option<(String, Vec<&str>)> = None;
    for line in stdout.lines() {
        if let Some(name) = section_header(line) {
            attach(&mut run, section.take());
            section = Some((name.to_string(), Vec::new()));
        } else if line == "failures:" || line == "successes:" || line.starts_with("test result: ") {
            attach(&mut run, section.take());
            run.finished |= line.starts_with("test result: ");
        } else if let Some((_, lines)) = section.as_mut() {
            lines.push(line);
        } else if let Some(result) = verdict(line) {
            run.results.push(result);
        }
    }
    attach(&mut run, section);
    // libtest reports in order of completion; by name reads the same every run.
    run.results.sort_by(|a, b| a.name.cmp(&b.name));
    run
}

/// `test exercise_05::name ... ok` (also `- should panic` and `ignored, reason`).
fn verdict(line: &str) -> Option<TestResult> {
    let (name, outcome) = line.strip_prefix("test ")?.rsplit_once(" ... ")?;
    let outcome = match outcome {
        "ok" => Outcome::Passed,
        "FAILED" => Outcome::Failed,
        o if o.starts_with("ignored") => Outcome::Ignored,
        _ => return None,
    };
    let name = name.strip_suffix(" - should panic").unwrap_or(name).to_string();
    Some(TestResult { name, outcome, message: None })
}

/// `---- exercise_05::name stdout ----`
fn section_header(line: &str) -> Option<&str> {
    let inner = line.strip_prefix("---- ")?.strip_suffix(" ----")?;
    inner.strip_suffix(" stdout").or_else(|| inner.strip_suffix(" stderr"))
}

fn attach(run: &mut TestRun, section: Option<(String, Vec<&str>)>) {
    let Some((name, lines)) = section else { return };
    let message = panic_message(&lines);
    if let Some(result) = run.results.iter_mut().find(|r| r.name == name) {
        result.message = Some(match result.message.take() {
            Some(earlier) => format!("{earlier}\n{message}"),
            None => message,
        });
    }
}

/// The panic message inside a failure section, without the `thread ...
/// panicked at` line, the backtrace note or anything the test printed before.
/// A test that returned `Err` has no panic; then the whole section is kept.
fn panic_message(lines: &[&str]) -> String {
    let start =
        lines.iter().position(|l| l.starts_with("thread '") && l.contains(" panicked at ")).map_or(0, |i| i + 1);
    let end = lines[start..]
        .iter()
        .position(|l| l.starts_with("note: run with `RUST_BACKTRACE") || l.starts_with("stack backtrace:"))
        .map_or(lines.len(), |i| start + i);
    lines[start..end].join("\n").trim().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    const REPORT: &str = "
running 6 tests
test scaffolding::fixtures_load ... ok
test exercise_05::masks_the_future ... ok
test exercise_05::scales_by_sqrt_d ... FAILED
test exercise_05::softmax_rows_sum_to_one - should panic ... ok
test exercise_05::slow_reference ... ignored, needs a GPU
test exercise_02::swaps_halves ... FAILED

failures:

---- exercise_05::scales_by_sqrt_d stdout ----
printed by the test before panicking
thread 'exercise_05::scales_by_sqrt_d' (81234) panicked at tests/graded/exercise_05.rs:40:5:
assertion `left == right` failed: scores scaled by d instead of sqrt(d)
  left: 0.5
 right: 0.25
note: run with `RUST_BACKTRACE=1` environment variable to display a backtrace

---- exercise_02::swaps_halves stdout ----

thread 'exercise_02::swaps_halves' panicked at exercises/phase1_model/ex02_rotate_half.rs:9:5:
not yet implemented: Exercise 2: rotate_half; run `cargo xtask hint 2`


failures:
    exercise_02::swaps_halves
    exercise_05::scales_by_sqrt_d

test result: FAILED. 3 passed; 2 failed; 1 ignored; 0 measured; 0 filtered out; finished in 0.02s

";

    #[test]
    fn reads_every_verdict() {
        let run = parse(REPORT);
        assert!(run.finished);
        let verdicts: Vec<(&str, Outcome)> = run.results.iter().map(|r| (r.name.as_str(), r.outcome)).collect();
        assert_eq!(
            verdicts,
            [
                ("exercise_02::swaps_halves", Outcome::Failed),
                ("exercise_05::masks_the_future", Outcome::Passed),
                ("exercise_05::scales_by_sqrt_d", Outcome::Failed),
                ("exercise_05::slow_reference", Outcome::Ignored),
                ("exercise_05::softmax_rows_sum_to_one", Outcome::Passed),
                ("scaffolding::fixtures_load", Outcome::Passed),
            ]
        );
        assert_eq!(run.under("exercise_05::").count(), 4);
    }

    #[test]
    fn keeps_only_the_panic_message_of_failures() {
        let run = parse(REPORT);
        let message = |name: &str| run.results.iter().find(|r| r.name == name).unwrap().message.clone();
        assert_eq!(
            message("exercise_05::scales_by_sqrt_d").unwrap(),
            "assertion `left == right` failed: scores scaled by d instead of sqrt(d)\n  left: 0.5\n right: 0.25"
        );
        assert_eq!(
            message("exercise_02::swaps_halves").unwrap(),
            "not yet implemented: Exercise 2: rotate_half; run `cargo xtask hint 2`"
        );
        assert_eq!(message("exercise_05::masks_the_future"), None);
    }

    #[test]
    fn a_test_returning_err_keeps_its_whole_output() {
        let report = "running 1 test\ntest exercise_01::loads ... FAILED\n\nfailures:\n\n---- exercise_01::loads stdout ----\nError: shape mismatch in rms_norm\n\nfailures:\n    exercise_01::loads\n\ntest result: FAILED. 0 passed; 1 failed";
        let run = parse(report);
        assert_eq!(run.results[0].message.as_deref(), Some("Error: shape mismatch in rms_norm"));
    }

    #[test]
    fn a_crashed_run_is_not_finished() {
        let report =
            "running 2 tests\ntest exercise_07::deep ... ok\n\nthread 'exercise_07::deeper' has overflowed its stack\n";
        let run = parse(report);
        assert!(!run.finished);
        assert_eq!(run.results.len(), 1);
        assert!(parse("").results.is_empty());
    }

    #[test]
    fn long_running_notices_are_not_verdicts() {
        let run =
            parse("test exercise_07::trains has been running for over 60 seconds\ntest exercise_07::trains ... ok\n");
        assert_eq!(run.results.len(), 1);
        assert_eq!(run.results[0].outcome, Outcome::Passed);
    }

    #[test]
    fn cargo_status_and_closing_failure_lines_are_dropped() {
        let mut filter = CargoNoise::default();
        let test_failed = "\x1b[1m\x1b[91merror\x1b[0m: test failed, to rerun pass `--test graded`";
        let stderr = [
            ("   Compiling workbook v0.1.0 (/work)", true),
            ("\x1b[1m\x1b[92m    Finished\x1b[0m `test` profile [unoptimized] target(s) in 0.12s", false),
            ("\x1b[1m\x1b[92m     Running\x1b[0m graded/main.rs (target/debug/deps/graded-88f6)", false),
            (test_failed, false),
            ("error: 1 target failed:", false),
            ("    `--test graded`", false),
            ("error[E0308]: mismatched types", true),
            ("    `--test graded` is fine outside a target list", true),
        ];
        for (line, kept) in stderr {
            assert_eq!(filter.pass(line), if kept { vec![line] } else { vec![] }, "{line:?}");
        }
    }

    #[test]
    fn a_crash_keeps_cargos_explanation() {
        let mut filter = CargoNoise::default();
        let shown: Vec<String> = ["error: test failed, to rerun pass `--test graded`", "", "Caused by:", "  signal: 6"]
            .into_iter()
            .flat_map(|line| filter.pass(line))
            .collect();
        assert_eq!(shown, ["error: test failed, to rerun pass `--test graded`", "", "Caused by:", "  signal: 6"]);
    }

    #[test]
    fn a_todo_names_its_exercise_wherever_it_sits_in_a_message() {
        assert_eq!(unfinished_exercise("not yet implemented: Exercise 6: Weight initialisation; run"), Some(6));
        let relayed = "DDP failed: rank 1 failed: panicked: not yet implemented: Exercise 8: AdamW parameter groups";
        assert_eq!(unfinished_exercise(relayed), Some(8));
        assert_eq!(unfinished_exercise("expected 6 got 7"), None);
    }

    #[test]
    fn graded_names_carry_their_exercise_number() {
        assert_eq!(graded_exercise("exercise_05::masks_the_future"), Some(5));
        assert_eq!(graded_exercise("exercise_12::deep::case_1"), Some(12));
        assert_eq!(graded_exercise("scaffolding::exercise_05"), None);
        assert_eq!(graded_exercise("exercise_5::short"), None);
        assert_eq!(graded_exercise("exercise_05"), None);
    }
}
