//! `WORKBOOK_ONLY_TESTS_OF=5,7` compiles only those exercises' modules into
//! the `graded` test binary (`cfg(tests_of = "5")`, and `cfg(only_some_tests)`):
//! the workbook's own checks, which rebuild it once per exercise, link a
//! fraction of it. Unset, every module is compiled.

#[path = "../build/lean_file.rs"]
mod lean_file;

const ONLY_TESTS_VARIABLE: &str = "WORKBOOK_ONLY_TESTS_OF";

fn main() {
    println!("cargo::rerun-if-env-changed={ONLY_TESTS_VARIABLE}");
    println!("cargo::rustc-check-cfg=cfg(only_some_tests)");
    println!("cargo::rustc-check-cfg=cfg(tests_of, values(any()))");
    let Ok(list) = std::env::var(ONLY_TESTS_VARIABLE) else { return };
    let Ok(numbers) = lean_file::parse(&list) else {
        eprintln!("{ONLY_TESTS_VARIABLE}={list:?} is not a list of exercise numbers");
        std::process::exit(1);
    };
    println!("cargo::rustc-cfg=only_some_tests");
    for number in numbers {
        println!("cargo::rustc-cfg=tests_of=\"{number}\"");
    }
}
