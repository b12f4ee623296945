//! Whether an exercise file parses as Rust, and where it stops if not. One
//! syntax error would otherwise fail the whole crate, and with it the grading
//! of every exercise and `cargo train`: the build script compiles the
//! reference in place of a file that does not parse, and the workbook's tool
//! reports it with the same check and the same words.

// Each program that compiles this file uses part of it.
#![allow(dead_code)]

use std::fmt;

/// Where the parser stopped in a file, and what it expected there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyntaxError {
    /// 1-based, as an editor counts lines.
    pub line: usize,
    /// 1-based, in characters, as rustc counts columns.
    pub column: usize,
    /// The parser's message, e.g. "expected `;`".
    pub message: String,
}

/// What stops a file from being cut into tokens, at the place it points to.
const UNREADABLE: &str = "a bracket without its partner, a string, character or comment never closed, or a \
                          character Rust does not read";

/// `Ok` when `source` is a Rust file; otherwise the first syntax error.
/// Only the syntax is checked: a file that parses may still fail to compile.
pub fn check(source: &str) -> Result<(), SyntaxError> {
    let checked = syn::parse_file(source).map(drop).map_err(|error| {
        let start = error.span().start();
        // The parser's own words when the text cannot even be cut into
        // tokens ("cannot parse string into token stream") name no cause.
        let message = match source.trim_start_matches('\u{feff}').parse::<proc_macro2::TokenStream>() {
            Err(_) => UNREADABLE.to_string(),
            // A message is one line; keep it so in a build warning.
            Ok(_) => error.to_string().replace('\n', " "),
        };
        SyntaxError { line: start.line.max(1), column: start.column + 1, message }
    });
    // Every parse keeps its text for the spans' locations until this: a tool
    // that checks on every save (`watch`) would otherwise grow without end.
    // No span outlives this function.
    proc_macro2::extra::invalidate_current_thread_spans();
    checked
}

impl SyntaxError {
    /// What every report says about `file`: where it stops parsing, and that
    /// the reference runs in its place meanwhile.
    pub fn sentence(&self, file: &str) -> String {
        format!("{file} does not parse ({self}); it runs on the reference until you fix it")
    }
}

impl fmt::Display for SyntaxError {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "line {}, column {}: {}", self.line, self.column, self.message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_good_file_parses() {
        let source = "//! A doc.\n\npub fn double(x: f32) -> f32 {\n    todo!(\"Exercise 1: double it\")\n}\n";
        assert_eq!(check(source), Ok(()));
    }

    #[test]
    fn a_missing_semicolon_is_found_where_the_next_statement_starts() {
        let source = "pub fn double(x: f32) -> f32 {\n    let y = x * 2.0\n    y\n}\n";
        let error = check(source).expect_err("a statement without its `;`");
        assert_eq!((error.line, error.column), (3, 5), "{error}");
        assert_eq!(error.message, "expected `;`");
    }

    #[test]
    fn an_unclosed_brace_is_found_where_it_opens() {
        let error = check("pub fn double(x: f32) -> f32 {\n    x * 2.0\n").expect_err("no closing brace");
        assert_eq!((error.line, error.column), (1, 30), "{error}");
        assert_eq!(error.message, UNREADABLE);
        let error = check("fn f() {\n    let s = \"abc;\n}\n").expect_err("a string never closed");
        assert_eq!((error.line, error.column), (2, 13), "{error}");
    }

    #[test]
    fn the_sentence_names_the_file_and_the_place() {
        let error = SyntaxError { line: 12, column: 9, message: "expected `;`".to_string() };
        assert_eq!(
            error.sentence("exercises/phase1_model/ex02_rotate_half.rs"),
            "exercises/phase1_model/ex02_rotate_half.rs does not parse (line 12, column 9: expected `;`); it runs \
             on the reference until you fix it"
        );
    }
}
