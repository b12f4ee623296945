//! Finding an exercise's functions in its source file and putting back their
//! stubs.
//!
//! The shipped stub is not stored anywhere: it is regenerated from the metadata
//! (the canonical `todo!` line) and the function's own parameters, and written
//! between each function's braces. The stub borrows its parameters
//! (`let _ = (&x, &weight);`) so that rustc's unused-variable warnings stay on
//! for the learner's code, where they name real bugs, without firing on the stub.
//!
//! The file is cut into tokens by proc-macro2, the lexer syn parses with, so a
//! `"{"`, a `// }` or a lifetime in the learner's code cannot confuse the
//! search, and a file that does not parse yet (work in progress) is still read
//! as long as its brackets pair up. Each token knows its bytes in the file:
//! only the text between a body's braces is ever replaced, and the learner's
//! formatting and comments around it stay as they are.

use std::ops::Range;

use anyhow::{anyhow, bail, Result};
use proc_macro2::{Delimiter, TokenStream, TokenTree};
use syn::{FnArg, Pat, Signature};

use crate::workspace::UNREADABLE;

/// Where a function sits in a source file.
#[derive(Debug, PartialEq, Eq)]
pub struct FnLocation {
    /// 1-based line of the `fn` keyword.
    pub line: usize,
    /// The whitespace before the line holding `fn`; the body is indented 4 more.
    pub indent: String,
    /// Bytes between the body's `{` and its matching `}`, both excluded.
    pub body: Range<usize>,
    /// The parameters bound to plain names, in order, `self` and `_`-names left
    /// out; none when the signature does not parse.
    pub params: Vec<String>,
}

/// Finds the one function named `name` in `source`.
pub fn locate(source: &str, name: &str) -> Result<FnLocation> {
    let located = match source.parse::<TokenStream>() {
        Ok(tokens) => locate_in(source, tokens, name),
        Err(error) => {
            let at = error.span().start();
            Err(anyhow!(
                "the file cannot be read as Rust from line {}, column {}: {UNREADABLE}",
                at.line,
                at.column + 1
            ))
        }
    };
    // Every parse keeps its text for the spans' locations until this: `watch`
    // would otherwise grow without end. No span outlives this function.
    proc_macro2::extra::invalidate_current_thread_spans();
    located
}

fn locate_in(source: &str, tokens: TokenStream, name: &str) -> Result<FnLocation> {
    let mut found = Vec::new();
    fns_named(tokens, name, &mut found);
    let tokens = match found.len() {
        1 => found.remove(0),
        0 => bail!("no `fn {name}` found"),
        n => bail!("{n} functions named `{name}`: rename the others so the exercise is unambiguous"),
    };
    // The body is the first `{...}` after the name; a `;` first ends a declaration.
    let end = tokens.iter().position(|token| match token {
        TokenTree::Group(group) => group.delimiter() == Delimiter::Brace,
        TokenTree::Punct(punct) => punct.as_char() == ';',
        _ => false,
    });
    let Some((TokenTree::Group(body), signature)) = end.map(|end| (&tokens[end], &tokens[..end])) else {
        bail!("`fn {name}` has no body");
    };
    let fn_at = tokens[0].span().byte_range().start;
    let line_start = source[..fn_at].rfind('\n').map_or(0, |i| i + 1);
    Ok(FnLocation {
        line: tokens[0].span().start().line,
        indent: source[line_start..].chars().take_while(|c| *c == ' ' || *c == '\t').collect(),
        body: body.span_open().byte_range().end..body.span_close().byte_range().start,
        params: param_names(signature.iter().cloned().collect()),
    })
}

/// For each `fn name` in `tokens`, at any depth, the tokens from `fn` to the
/// end of its bracket.
fn fns_named(tokens: TokenStream, name: &str, found: &mut Vec<Vec<TokenTree>>) {
    let tokens: Vec<TokenTree> = tokens.into_iter().collect();
    for (at, token) in tokens.iter().enumerate() {
        match (token, tokens.get(at + 1)) {
            (TokenTree::Group(group), _) => fns_named(group.stream(), name, found),
            (TokenTree::Ident(keyword), Some(TokenTree::Ident(ident))) if keyword == "fn" && ident == name => {
                found.push(tokens[at..].to_vec());
            }
            _ => {}
        }
    }
}

/// The plain names bound by the parameters of `signature` (from `fn` to the
/// body's `{`).
fn param_names(signature: TokenStream) -> Vec<String> {
    let Ok(signature) = syn::parse2::<Signature>(signature) else { return Vec::new() };
    let plain = |input: &FnArg| match input {
        FnArg::Typed(typed) => match &*typed.pat {
            Pat::Ident(pat) if pat.by_ref.is_none() && pat.subpat.is_none() => Some(pat.ident.to_string()),
            _ => None,
        },
        FnArg::Receiver(_) => None,
    };
    let names = signature.inputs.iter().filter_map(plain);
    names.filter(|name| !name.starts_with('_') && !name.starts_with("r#")).collect()
}

/// The text between the braces of the shipped stub: a borrow of each
/// parameter, then `stub_line`.
pub fn stub_body(location: &FnLocation, stub_line: &str) -> String {
    let indent = &location.indent;
    let borrows: Vec<String> = location.params.iter().map(|p| format!("&{p}")).collect();
    let uses = match &borrows[..] {
        [] => String::new(),
        [one] => format!("\n{indent}    let _ = {one};"),
        many => format!("\n{indent}    let _ = ({});", many.join(", ")),
    };
    format!("{uses}\n{indent}    {stub_line}\n{indent}")
}

/// The stub's body before it borrowed its parameters: just `stub_line`.
pub fn old_stub_body(indent: &str, stub_line: &str) -> String {
    format!("\n{indent}    {stub_line}\n{indent}")
}

/// `source` with the body of every function in `names` replaced by the
/// shipped stub.
pub fn reset(source: &str, names: &[&str], stub_line: &str) -> Result<String> {
    names.iter().try_fold(source.to_string(), |reset, name| reset_one(&reset, name, stub_line))
}

/// Whether every function in `names` is still exactly the shipped stub, byte
/// for byte.
pub fn is_stub(source: &str, names: &[&str], stub_line: &str) -> Result<bool> {
    Ok(reset(source, names, stub_line)? == source)
}

/// `source` with the body of `fn name` replaced by the shipped stub.
fn reset_one(source: &str, name: &str, stub_line: &str) -> Result<String> {
    let location = locate(source, name)?;
    let mut reset = String::with_capacity(source.len());
    reset.push_str(&source[..location.body.start]);
    reset.push_str(&stub_body(&location, stub_line));
    reset.push_str(&source[location.body.end..]);
    Ok(reset)
}

#[cfg(test)]
mod tests {
    use super::*;

    const STUB: &str = r#"todo!("Exercise 9: demo; run `cargo xtask hint 9`")"#;

    const FREE: &str = r##"//! A module whose docs mention `fn demo() {` on purpose.
use x::y;

/// Calls demo. Not this one: `fn demo` in a doc comment.
pub fn demo(x: &[f32; 2], f: impl Fn(u8) -> u8) -> Result<String> {
    let open = "{ not a brace";
    let close = '}';
    let raw = r#"a } "quoted" { b"#;
    let bytes = b"}}";
    /* a block comment with } and /* a nested { */ still a comment } */
    let label: &'static str = "ok"; // trailing } comment
    'outer: for i in 0..2 { if i > 0 { break 'outer; } }
    Ok(format!("{open}{close}{raw}{}", bytes.len()))
}

fn after() {}
"##;

    #[test]
    fn finds_the_function_past_strings_comments_and_lifetimes() {
        let location = locate(FREE, "demo").unwrap();
        assert_eq!(location.line, 5);
        assert_eq!(location.indent, "");
        let body = &FREE[location.body];
        assert!(body.starts_with("\n    let open"));
        assert!(body.ends_with("bytes.len()))\n"));
    }

    #[test]
    fn reset_replaces_only_the_body() {
        let reset = reset(FREE, &["demo"], STUB).unwrap();
        let expected_fn = format!(
            "pub fn demo(x: &[f32; 2], f: impl Fn(u8) -> u8) -> Result<String> {{\n    let _ = (&x, &f);\n    {STUB}\n}}\n\nfn after() {{}}\n"
        );
        assert!(reset.ends_with(&expected_fn), "{reset}");
        assert!(reset.starts_with("//! A module whose docs mention `fn demo() {` on purpose."));
        assert!(is_stub(&reset, &["demo"], STUB).unwrap());
        assert!(!is_stub(FREE, &["demo"], STUB).unwrap());
        assert_eq!(super::reset(&reset, &["demo"], STUB).unwrap(), reset, "reset is idempotent");
    }

    #[test]
    fn methods_keep_their_indentation() {
        let source = "impl RmsNorm {\n    pub fn new() -> Self { Self }\n\n    pub fn forward(\n        &self,\n        x: &Tensor,\n    ) -> Result<Tensor> {\n        x.sqr()\n    }\n}\n";
        let reset = reset(source, &["forward"], STUB).unwrap();
        assert_eq!(
            reset,
            format!("impl RmsNorm {{\n    pub fn new() -> Self {{ Self }}\n\n    pub fn forward(\n        &self,\n        x: &Tensor,\n    ) -> Result<Tensor> {{\n        let _ = &x;\n        {STUB}\n    }}\n}}\n")
        );
        assert_eq!(locate(source, "forward").unwrap().line, 4);
    }

    #[test]
    fn the_stub_borrows_each_plainly_named_parameter() {
        let names = |signature: &str| locate(&format!("{signature} {{}}"), "f").unwrap().params;
        assert_eq!(names("fn f()"), Vec::<String>::new());
        assert_eq!(names("fn f(&self)"), Vec::<String>::new());
        assert_eq!(names("fn f(&'a mut self, mut x: u8, _y: u8)"), ["x"]);
        assert_eq!(names("fn f(m: HashMap<String, (u8, u8)>, g: impl Fn(u8, u8) -> u8, (a, b): (u8, u8))"), ["m", "g"]);
        assert_eq!(names("fn f<T: Into<u8>>(self, t: T,)"), ["t"]);
        let shipped = reset("fn f(x: u8) -> u8 {\n    x\n}\n", &["f"], STUB).unwrap();
        assert_eq!(shipped, format!("fn f(x: u8) -> u8 {{\n    let _ = &x;\n    {STUB}\n}}\n"));
    }

    #[test]
    fn an_edited_stub_with_surrounding_whitespace_is_not_the_stub() {
        let shipped = format!("fn demo() {{\n    {STUB}\n}}\n");
        assert!(is_stub(&shipped, &["demo"], STUB).unwrap());
        let edited = format!("fn demo() {{\n    {STUB}\n\n}}\n");
        assert!(!is_stub(&edited, &["demo"], STUB).unwrap());
    }

    #[test]
    fn several_functions_are_reset_together_and_are_the_stub_only_together() {
        let source = "impl Trainer {\n    fn save(&self) { self.write() }\n    fn helper() {}\n    fn load() -> Self {\n        Self::read()\n    }\n}\n";
        let names = ["save", "load"];
        let shipped = reset(source, &names, STUB).unwrap();
        assert_eq!(
            shipped,
            format!("impl Trainer {{\n    fn save(&self) {{\n        {STUB}\n    }}\n    fn helper() {{}}\n    fn load() -> Self {{\n        {STUB}\n    }}\n}}\n")
        );
        assert!(is_stub(&shipped, &names, STUB).unwrap());
        assert!(!is_stub(source, &names, STUB).unwrap());
        let half_done = reset(source, &["load"], STUB).unwrap();
        assert!(!is_stub(&half_done, &names, STUB).unwrap());
        assert!(is_stub(&half_done, &["load"], STUB).unwrap());
        assert!(reset(source, &["save", "missing"], STUB).unwrap_err().to_string().contains("no `fn missing`"));
    }

    #[test]
    fn names_must_match_whole_identifiers_once() {
        let source = "fn demo_two() {}\nfn demo() { 1 }\n";
        assert_eq!(locate(source, "demo").unwrap().line, 2);
        assert!(locate(source, "missing").unwrap_err().to_string().contains("no `fn missing`"));
        let twice = "fn demo() {}\nmod m { fn demo() {} }\n";
        assert!(locate(twice, "demo").unwrap_err().to_string().contains("2 functions named `demo`"));
        let declared = "trait T { fn demo(&self); }\n";
        assert!(locate(declared, "demo").unwrap_err().to_string().contains("has no body"));
    }

    #[test]
    fn raw_identifiers_and_escaped_chars_are_code() {
        let source = "fn r#type() {}\nfn demo() { let q = '\\''; let b = b'{'; let r#type = 1; let u = '\\u{7B}'; }\n";
        let location = locate(source, "demo").unwrap();
        assert_eq!(location.line, 2);
        assert!(source[location.body].ends_with("'\\u{7B}'; "));
    }

    #[test]
    fn a_body_that_does_not_parse_is_still_found_and_reset() {
        let source = "fn demo(x: u8) -> u8 {\n    let y = x +\n}\n\nfn after() {}\n";
        assert!(syn::parse_file(source).is_err(), "the learner's work in progress");
        assert_eq!(&source[locate(source, "demo").unwrap().body], "\n    let y = x +\n");
        let shipped = reset(source, &["demo"], STUB).unwrap();
        assert_eq!(shipped, format!("fn demo(x: u8) -> u8 {{\n    let _ = &x;\n    {STUB}\n}}\n\nfn after() {{}}\n"));
    }

    #[test]
    fn a_file_whose_brackets_do_not_pair_says_where() {
        let source = "fn demo() {\n    if x {\n}\n";
        let error = locate(source, "demo").unwrap_err().to_string();
        assert!(error.starts_with("the file cannot be read as Rust from line 1, column 11: a bracket"), "{error}");
    }

    #[test]
    fn the_parameters_follow_the_generics_and_a_broken_signature_borrows_none() {
        let names = |signature: &str| locate(&format!("{signature} {{}}"), "f").unwrap().params;
        assert_eq!(names("fn f<F: Fn(u8) -> u8>(self: Box<Self>, f: F, ref r: u8)"), ["f"]);
        assert_eq!(names("fn f(x: u8) -> <u8"), Vec::<String>::new());
    }

    #[test]
    fn bytes_and_lines_count_past_a_byte_order_mark_and_wide_characters() {
        let source = "\u{feff}//! Über café — ✓\nfn demo() -> char { 'é' }\n";
        let location = locate(source, "demo").unwrap();
        assert_eq!((location.line, &source[location.body]), (2, " 'é' "));
    }
}
