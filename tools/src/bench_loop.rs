//! `bench loop`: the two waits a learner feels, measured as they meet them.
//!
//! In a fresh clone of this repository's last commit (its own build folder,
//! the crates already downloaded): the first `cargo test exercise_01`, which
//! compiles everything; then, with exercise 5 written (its reference body),
//! `--rounds` edits of that file, each followed by `cargo test exercise_05`:
//! the edit → verdict loop. Each verdict is split into cargo's build and the
//! tests' run. The clone is removed afterwards; the learner's own files are
//! never touched.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use xtask::render;
use xtask::workspace::{cargo, Workspace};

use crate::bench::{cpu_model, extremes, median, replace_section, RESULTS};

const HEADING: &str = "## Edit → verdict";
/// The exercise whose edits are timed.
const EDITED: u32 = 5;

/// One `cargo test` as the learner runs it: its wall time, and the build's
/// share as cargo reports it.
struct Verdict {
    seconds: f64,
    build_seconds: f64,
}

pub fn bench_loop(ws: &Workspace, rounds: usize) -> Result<bool> {
    if rounds == 0 {
        bail!("--rounds must be at least 1");
    }
    let load = std::fs::read_to_string("/proc/loadavg").ok().and_then(|l| l.split(' ').next().map(str::to_string));
    let clone = Clone::new(&ws.root)?;
    println!("{}", render::bold("First verdict on a fresh clone: `cargo test exercise_01` (compiles everything)"));
    let first = verdict(&clone.path, "exercise_01")?;
    println!("  {:.0} s, of which the build {:.0} s", first.seconds, first.build_seconds);

    let exercise = ws.workbook.exercise(EDITED)?;
    let file = clone.path.join(&exercise.file);
    std::fs::copy(clone.path.join(exercise.solution_file()?), &file)
        .with_context(|| format!("cannot write exercise {EDITED}'s body into the clone"))?;
    let filter = format!("exercise_{EDITED:02}"); // as the learner types it
    println!("{}", render::bold(&format!("Edit → verdict: exercise {EDITED} written, edited, `cargo test {filter}`")));
    verdict(&clone.path, &filter)?; // builds the written exercise once
    let mut verdicts = vec![];
    for round in 1..=rounds {
        let mut text = std::fs::read_to_string(&file)?;
        text.push_str(&format!("// edit {round}\n"));
        std::fs::write(&file, text)?;
        let v = verdict(&clone.path, &filter)?;
        println!("  edit {round}: {:.2} s (build {:.2} s, run {:.2} s)", v.seconds, v.build_seconds, v.run_seconds());
        verdicts.push(v);
    }
    let body = report(&first, &verdicts, load.as_deref().unwrap_or("unknown"));
    println!("{body}");
    replace_section(&ws.root.join(RESULTS), HEADING, &body)?;
    println!("written to {RESULTS}");
    Ok(true)
}

impl Verdict {
    fn run_seconds(&self) -> f64 {
        (self.seconds - self.build_seconds).max(0.0)
    }
}

/// Runs `cargo test filter` in `dir` as a learner would and times it. The
/// tests may fail (a stub's do); the build must not.
fn verdict(dir: &Path, filter: &str) -> Result<Verdict> {
    let start = Instant::now();
    let output = cargo(dir)
        .args(["test", filter])
        // The clone builds in its own folder, on its own choice of bodies.
        .env_remove("CARGO_TARGET_DIR")
        .env_remove(xtask::LEAN_VARIABLE)
        .env_remove(xtask::grading::ONLY_TESTS_VARIABLE)
        .output()
        .context("cannot run cargo")?;
    let seconds = start.elapsed().as_secs_f64();
    let stderr = String::from_utf8_lossy(&output.stderr);
    let Some(build_seconds) = finished_in(&stderr) else {
        bail!("`cargo test {filter}` did not build in the clone:\n{stderr}");
    };
    Ok(Verdict { seconds, build_seconds })
}

/// The seconds in cargo's `Finished ... target(s) in 2.72s` line (or `in 8m 33s`).
fn finished_in(stderr: &str) -> Option<f64> {
    let line = stderr.lines().find(|l| l.trim_start().starts_with("Finished"))?;
    let time = line.rsplit(" in ").next()?.trim();
    let (minutes, seconds) = match time.split_once("m ") {
        Some((m, s)) => (m.parse::<f64>().ok()?, s),
        None => (0.0, time),
    };
    Some(minutes * 60.0 + seconds.trim_end_matches('s').parse::<f64>().ok()?)
}

fn report(first: &Verdict, verdicts: &[Verdict], load: &str) -> String {
    let range = |values: &[f64]| {
        let (low, high) = extremes(values);
        format!("{:.1} s ({low:.1} to {high:.1})", median(values))
    };
    let totals: Vec<f64> = verdicts.iter().map(|v| v.seconds).collect();
    let builds: Vec<f64> = verdicts.iter().map(|v| v.build_seconds).collect();
    let runs: Vec<f64> = verdicts.iter().map(Verdict::run_seconds).collect();
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    format!(
        "Written by `cargo xtask bench loop` ({cpu}, {cores} cores, load average {load} at the start), in a\n\
         fresh clone of the last commit with the crates already downloaded. The edit rounds append a\n\
         line to exercise {EDITED}'s file, its body written, and run `cargo test exercise_{EDITED:02}`;\n\
         the build is what cargo reports as its own, the run the rest.\n\n\
         | wait | seconds |\n|---|---:|\n\
         | first `cargo test exercise_01` on a fresh clone (one run) | {first_min:.0} min {first_s:.0} s (build {build_min:.0} min {build_s:.0} s) |\n\
         | edit → verdict, median (range) over {n} edits | {total} |\n\
         | of which the build | {build} |\n\
         | of which the run | {run} |\n",
        cpu = cpu_model(),
        n = verdicts.len(),
        first_min = (first.seconds / 60.0).floor(),
        first_s = first.seconds % 60.0,
        build_min = (first.build_seconds / 60.0).floor(),
        build_s = first.build_seconds % 60.0,
        total = range(&totals),
        build = range(&builds),
        run = range(&runs),
    )
}

/// A clone of the repository's last commit in a temporary folder, removed on drop.
struct Clone {
    path: PathBuf,
}

impl Clone {
    fn new(root: &Path) -> Result<Self> {
        let path = std::env::temp_dir().join(format!("workbook-bench-loop-{}", std::process::id()));
        let status = Command::new("git")
            .args(["clone", "--quiet", "--no-hardlinks"])
            .arg(root)
            .arg(&path)
            .status()
            .context("cannot run git to clone the workbook")?;
        if !status.success() {
            bail!("git could not clone {} into {}", root.display(), path.display());
        }
        Ok(Self { path })
    }
}

impl Drop for Clone {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

#[cfg(test)]
mod tests {
    use super::finished_in;

    #[test]
    fn reads_cargos_build_time_in_seconds_and_minutes() {
        let seconds =
            "   Compiling workbook\n    Finished `test` profile [unoptimized + debuginfo] target(s) in 2.72s\n";
        assert_eq!(finished_in(seconds), Some(2.72));
        let minutes = "    Finished `test` profile [unoptimized + debuginfo] target(s) in 8m 33s\n";
        assert_eq!(finished_in(minutes), Some(513.0));
        assert_eq!(finished_in("error: could not compile"), None);
    }
}
