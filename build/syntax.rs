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
    /// 1-based, in characters, as rustc counts columns. `None` where the
    /// parser stopped at the first token of its line: it notices a missing
    /// piece (a `;`, an operand) only at the token after it, so the mistake
    /// is that token or lies before it, possibly at the end of an earlier line.
    pub column: Option<usize>,
    /// The parser's message, e.g. "expected `;`".
    pub message: String,
}

/// What stops a file from being cut into tokens, at the place it points to.
pub const UNREADABLE: &str = "a bracket without its partner, a string, character or comment never closed, or a \
                          character Rust does not read; where reading stopped may be well after the cause: \
                          `cargo build` shows rustc's own account, which points at where the bracket or string began";

/// `Ok` when `source` is a Rust file; otherwise the first syntax error.
/// Only the syntax is checked: a file that parses may still fail to compile.
pub fn check(source: &str) -> Result<(), SyntaxError> {
    let checked = syn::parse_file(source).map(drop).map_err(|error| {
        let start = error.span().start();
        let line = start.line.max(1);
        let starts_its_line = || {
            let text = source.lines().nth(line - 1).unwrap_or_default();
            text.chars().take(start.column).all(char::is_whitespace)
        };
        // The parser's own words when the text cannot even be cut into
        // tokens ("cannot parse string into token stream") name no cause.
        // The place of such a text is where the tokenizer stopped: the
        // bracket, string or character itself, whichever line it starts.
        let (message, column) = match source.trim_start_matches('\u{feff}').parse::<proc_macro2::TokenStream>() {
            Err(_) => (UNREADABLE.to_string(), Some(start.column + 1)),
            // A message is one line; keep it so in a build warning.
            Ok(_) => (error.to_string().replace('\n', " "), (!starts_its_line()).then_some(start.column + 1)),
        };
        SyntaxError { line, column, message }
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
        match self.column {
            Some(column) => write!(f, "line {}, column {column}: {}", self.line, self.message),
            None => write!(f, "at or just before line {}: {}", self.line, self.message),
        }
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
    fn a_mistake_noticed_at_the_start_of_a_line_is_placed_at_or_just_before_it() {
        let source = "pub fn double(x: f32) -> f32 {\n    let y = x * 2.0\n    y\n}\n";
        let error = check(source).expect_err("a statement without its `;`");
        assert_eq!((error.line, error.column), (3, None), "{error}");
        assert_eq!(error.to_string(), "at or just before line 3: expected `;`");
        let error = check("fn f() {\n    let y = 1 +\n}\n").expect_err("an operator without its operand");
        assert_eq!(error.to_string(), "at or just before line 3: unexpected end of input, expected an expression");
    }

    #[test]
    fn a_mistake_noticed_inside_a_line_keeps_its_column() {
        let error = check("fn f() {\n    let y = 2.0 let z = 3.0;\n}\n").expect_err("two statements, one `;`");
        assert_eq!(error.to_string(), "line 2, column 17: expected `;`");
    }

    #[test]
    fn an_unclosed_brace_is_found_where_it_opens() {
        let error = check("pub fn double(x: f32) -> f32 {\n    x * 2.0\n").expect_err("no closing brace");
        assert_eq!((error.line, error.column), (1, Some(30)), "{error}");
        assert_eq!(error.message, UNREADABLE);
        let error = check("fn f() {\n    let s = \"abc;\n}\n").expect_err("a string never closed");
        assert_eq!((error.line, error.column), (2, Some(13)), "{error}");
    }

    #[test]
    fn the_sentence_names_the_file_and_the_place() {
        let error = SyntaxError { line: 12, column: None, message: "expected `;`".to_string() };
        assert_eq!(
            error.sentence("exercises/phase1_model/ex02_rotate_half.rs"),
            "exercises/phase1_model/ex02_rotate_half.rs does not parse (at or just before line 12: expected `;`); \
             it runs on the reference until you fix it"
        );
    }
}
