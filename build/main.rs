//! Chooses, per exercise, which body the crate compiles: the learner's file in
//! `exercises/`, or the reference in `solutions/` for the exercises the learner
//! leans on (`cargo xtask lean`, recorded in `exercises/lean.txt`) and for
//! those whose file does not parse (with a warning that says where it stops),
//! so that one syntax error does not stop every other exercise from building.
//!
//! A build script, not RUSTFLAGS, so that the choice reaches plain `cargo test`
//! and `cargo train`, and changing it rebuilds this crate alone, never candle.
//! It sets `cfg(reference = "N")` for each exercise that compiles its reference
//! body (read by `src/exercises.rs`) and writes `exercise_bodies.rs`: which
//! exercises are leaned on, which do not parse and why, and which still hold
//! their shipped `todo!`, so the trainer can say what a run needs before it
//! starts. An exercise that still holds its stub also gets `cfg(stand_in =
//! "N")`: where an earlier phase's runtime already calls it (the FSDP trainer
//! calls exercise 22), the reference stands in until the learner starts it.
//!
//! `WORKBOOK_LEAN`, when set, replaces the file (the workbook's own checks use
//! it, so that a learner's choice never changes what they grade).
//! `WORKBOOK_PLANTED` names the exercises whose copy under `target/planted/`
//! `verify` compiles in place of the reference (`cfg(planted = "N")`).

use std::path::{Path, PathBuf};

#[path = "body.rs"]
mod body;
#[path = "lean_file.rs"]
mod lean_file;
#[path = "planted_dir.rs"]
mod planted_dir;
#[path = "syntax.rs"]
mod syntax;

use body::Body;
use lean_file::{LEAN_FILE, LEAN_VARIABLE};
use planted_dir::PLANTED_VARIABLE;

fn main() {
    // The folder, not the file: a missing file would rebuild on every run, and
    // every exercise edit must refresh the list of unfinished ones anyway.
    println!("cargo::rerun-if-changed=exercises");
    println!("cargo::rerun-if-env-changed={LEAN_VARIABLE}");
    println!("cargo::rerun-if-env-changed={PLANTED_VARIABLE}");
    println!("cargo::rustc-check-cfg=cfg(reference, values(any()))");
    println!("cargo::rustc-check-cfg=cfg(planted, values(any()))");
    println!("cargo::rustc-check-cfg=cfg(stand_in, values(any()))");

    let leaned = match std::env::var(LEAN_VARIABLE) {
        Ok(list) => lean_file::parse(&list).unwrap_or_else(|bad| {
            fail(&format!("{LEAN_VARIABLE}={list:?}: `{bad}` is not an exercise number or range"))
        }),
        Err(_) => lean_file::read(Path::new(".")).unwrap_or_else(|bad| {
            fail(&format!(
                "{LEAN_FILE}: `{bad}` is not an exercise number or range (like 6 or 1-15): fix the file, or \
                 choose again with `cargo xtask lean`"
            ))
        }),
    };

    let exercises = exercise_files(Path::new("exercises"));
    let all_reference = std::env::var_os("CARGO_FEATURE_SOLUTIONS").is_some();
    let mut unparsable = Vec::new();
    let mut bodies: Vec<(u32, Body)> = Vec::new();
    for (number, file) in &exercises {
        // An unreadable file is left to rustc, which says why.
        let source = std::fs::read_to_string(file).unwrap_or_default();
        let leaned = all_reference || leaned.contains(number);
        // A file compiled from the reference anyway is not parsed: its text is unused.
        let parsed = if leaned { Ok(()) } else { syntax::check(&source) };
        let holds_stub = source.contains(&format!("todo!(\"Exercise {number}:"));
        let body = Body::of(leaned, parsed.is_ok(), holds_stub);
        if let (Body::DoesNotParse, Err(error)) = (body, parsed) {
            let sentence = error.sentence(&file.to_string_lossy().replace('\\', "/"));
            println!("cargo::warning={sentence}");
            unparsable.push((*number, sentence));
        }
        bodies.push((*number, body));
    }
    let planted = std::env::var(PLANTED_VARIABLE)
        .map_or(Ok(Default::default()), |list| lean_file::parse(&list))
        .unwrap_or_else(|bad| fail(&format!("{PLANTED_VARIABLE}: `{bad}` is not an exercise number or range")));
    for (number, body) in &bodies {
        if planted.contains(number) {
            println!("cargo::rustc-cfg=planted=\"{number}\"");
        } else if body.compiles_reference() {
            println!("cargo::rustc-cfg=reference=\"{number}\"");
        }
    }
    let with = |body| bodies.iter().filter(|(_, b)| *b == body).map(|(n, _)| *n).collect::<Vec<u32>>();
    let reference = with(Body::Leaned);
    let unfinished = with(Body::NotStarted);
    for number in &unfinished {
        println!("cargo::rustc-cfg=stand_in=\"{number}\"");
    }

    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let text = format!(
        "/// The exercises compiled from their reference body in `solutions/`: all of\n\
         /// them with `--features solutions`, otherwise those leaned on (`cargo xtask lean`).\n\
         pub const REFERENCE: &[u32] = &{reference:?};\n\
         /// The exercises whose file in `exercises/` does not parse, each with the\n\
         /// sentence that says where: their reference body is compiled in its place.\n\
         pub const UNPARSABLE: &[(u32, &str)] = &{unparsable:?};\n\
         /// The exercises compiled from `exercises/` whose file still holds its\n\
         /// shipped `todo!`: calling them panics.\n\
         pub const UNFINISHED: &[u32] = &{unfinished:?};\n"
    );
    std::fs::write(out.join("exercise_bodies.rs"), text).expect("cannot write to OUT_DIR");
}

fn fail(problem: &str) -> ! {
    eprintln!("{problem}");
    std::process::exit(1);
}

/// `exercises/phase*/exNN_*.rs`, by number.
fn exercise_files(dir: &Path) -> Vec<(u32, PathBuf)> {
    let mut files = Vec::new();
    let phases = std::fs::read_dir(dir).into_iter().flatten().flatten().filter(|e| e.path().is_dir());
    for phase in phases {
        for file in std::fs::read_dir(phase.path()).into_iter().flatten().flatten() {
            let name = file.file_name().to_string_lossy().into_owned();
            let number = name.strip_prefix("ex").and_then(|rest| rest.get(..2)).and_then(|n| n.parse().ok());
            if let (Some(number), true) = (number, name.ends_with(".rs")) {
                files.push((number, file.path()));
            }
        }
    }
    files.sort();
    files
}
