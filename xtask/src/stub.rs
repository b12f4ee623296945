//! Finding an exercise's functions in its source file and putting back their
//! stubs.
//!
//! The shipped stub is not stored anywhere: it is regenerated from the metadata
//! (the canonical `todo!` line) and the function's own parameters, and written
//! between each function's braces. The stub borrows its parameters
//! (`let _ = (&x, &weight);`) so that rustc's unused-variable warnings stay on
//! for the learner's code, where they name real bugs, without firing on the stub.
//! The braces are matched on a copy of the source in which comments and
//! string/char literals are blanked out, so a `"{"` or a `// }` in the
//! learner's code cannot confuse the match.

use std::ops::Range;

use anyhow::{bail, Result};

/// Where a function sits in a source file.
#[derive(Debug, PartialEq, Eq)]
pub struct FnLocation {
    /// 1-based line of the `fn` keyword.
    pub line: usize,
    /// The whitespace before the line holding `fn`; the body is indented 4 more.
    pub indent: String,
    /// Bytes between the body's `{` and its matching `}`, both excluded.
    pub body: Range<usize>,
    /// The parameters bound to plain names, in order, `self` and `_`-names left out.
    pub params: Vec<String>,
}

/// Finds the one function named `name` in `source`.
pub fn locate(source: &str, name: &str) -> Result<FnLocation> {
    let code = blank_non_code(source);
    let idents = identifiers(&code);
    let mut found = Vec::new();
    for pair in idents.windows(2) {
        let (keyword, ident) = (&pair[0], &pair[1]);
        if &code[keyword.clone()] == b"fn" && &code[ident.clone()] == name.as_bytes() {
            found.push(keyword.start);
        }
    }
    let fn_at = match found[..] {
        [at] => at,
        [] => bail!("no `fn {name}` found"),
        _ => bail!("{} functions named `{name}`: rename the others so the exercise is unambiguous", found.len()),
    };
    let Some(open) = body_open(&code, fn_at) else {
        bail!("`fn {name}` has no body");
    };
    let Some(close) = matching_close(&code, open) else {
        bail!("the body of `fn {name}` has no closing brace");
    };
    let line_start = source[..fn_at].rfind('\n').map_or(0, |i| i + 1);
    let indent: String = source[line_start..].chars().take_while(|c| *c == ' ' || *c == '\t').collect();
    let params = param_names(&code[fn_at..open]);
    Ok(FnLocation { line: source[..fn_at].matches('\n').count() + 1, indent, body: open + 1..close, params })
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

/// The plain names bound by the parameter list in `signature` (blanked code
/// from `fn` to the body's `{`).
fn param_names(signature: &[u8]) -> Vec<String> {
    let Some(open) = signature.iter().position(|&c| c == b'(') else { return Vec::new() };
    let mut params = Vec::new();
    let (mut depth, mut start) = (0i32, open + 1);
    for (i, &c) in signature.iter().enumerate().skip(open) {
        match c {
            b'(' | b'[' | b'<' | b'{' => depth += 1,
            b'>' if signature[i - 1] == b'-' => {} // the arrow of `Fn(A) -> B`
            b')' | b']' | b'>' | b'}' => depth -= 1,
            b',' if depth == 1 => {
                params.push(start..i);
                start = i + 1;
            }
            _ => {}
        }
        if depth == 0 {
            params.push(start..i);
            break;
        }
    }
    params
        .into_iter()
        .filter_map(|range| {
            let param = std::str::from_utf8(&signature[range]).ok()?;
            let (pattern, _) = param.split_once(':')?;
            let name = pattern.trim().trim_start_matches("mut ").trim();
            let plain = name.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'_') && !name.is_empty();
            (plain && !name.starts_with('_')).then(|| name.to_string())
        })
        .collect()
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

/// A copy of `source` with comments and string/char literals replaced by
/// spaces (newlines kept), so byte offsets still line up with the original.
fn blank_non_code(source: &str) -> Vec<u8> {
    let b = source.as_bytes();
    let mut code = b.to_vec();
    let mut i = 0;
    while i < b.len() {
        let end = match b[i] {
            b'/' if b.get(i + 1) == Some(&b'/') => b[i..].iter().position(|&c| c == b'\n').map_or(b.len(), |n| i + n),
            b'/' if b.get(i + 1) == Some(&b'*') => block_comment_end(b, i),
            b'"' => quoted_end(b, i + 1),
            b'\'' => match char_literal_end(b, i) {
                Some(end) => end,
                None => {
                    i += 1; // a lifetime or loop label
                    continue;
                }
            },
            c if is_ident_start(c) => {
                let ident_end = ident_end(b, i);
                match prefixed_literal_end(b, &b[i..ident_end], ident_end) {
                    Some(end) => end,
                    None => {
                        i = ident_end;
                        continue;
                    }
                }
            }
            _ => {
                i += 1;
                continue;
            }
        };
        for c in &mut code[i..end] {
            if *c != b'\n' {
                *c = b' ';
            }
        }
        i = end;
    }
    code
}

/// `/* ... */`, which nests in Rust.
fn block_comment_end(b: &[u8], start: usize) -> usize {
    let (mut depth, mut i) = (0usize, start);
    while i + 1 < b.len() {
        match (b[i], b[i + 1]) {
            (b'/', b'*') => {
                depth += 1;
                i += 2;
            }
            (b'*', b'/') => {
                depth -= 1;
                i += 2;
                if depth == 0 {
                    return i;
                }
            }
            _ => i += 1,
        }
    }
    b.len()
}

/// The end of a `"..."` literal whose contents start at `i`; `\` escapes.
fn quoted_end(b: &[u8], mut i: usize) -> usize {
    while i < b.len() {
        match b[i] {
            b'\\' => i += 2,
            b'"' => return i + 1,
            _ => i += 1,
        }
    }
    b.len()
}

/// The end of a char literal starting at the `'` at `start`, or `None` when
/// the quote begins a lifetime (`'a`) or a label.
fn char_literal_end(b: &[u8], start: usize) -> Option<usize> {
    let first = *b.get(start + 1)?;
    if first == b'\\' {
        // '\n', '\'', '\u{1F600}': the closing quote follows the escape.
        let close = b[start + 3..].iter().position(|&c| c == b'\'')?;
        return Some(start + 3 + close + 1);
    }
    let width = match first {
        0x00..=0x7f => 1,
        0xc0..=0xdf => 2,
        0xe0..=0xef => 3,
        _ => 4,
    };
    (b.get(start + 1 + width) == Some(&b'\'')).then_some(start + 2 + width)
}

/// String and char literals with a prefix: `b"..."`, `b'x'`, `c"..."`,
/// `r"..."`, `r#"..."#`, `br##"..."##`. `None` for plain identifiers,
/// including raw identifiers such as `r#type`.
fn prefixed_literal_end(b: &[u8], prefix: &[u8], after: usize) -> Option<usize> {
    let next = *b.get(after)?;
    match (prefix, next) {
        (b"b" | b"c", b'"') => Some(quoted_end(b, after + 1)),
        (b"b", b'\'') => char_literal_end(b, after),
        (b"r" | b"br" | b"cr", b'"' | b'#') => {
            let hashes = b[after..].iter().take_while(|&&c| c == b'#').count();
            if b.get(after + hashes) != Some(&b'"') {
                return None;
            }
            let mut i = after + hashes + 1;
            while i < b.len() {
                if b[i] == b'"' && b[i + 1..].iter().take(hashes).filter(|&&c| c == b'#').count() == hashes {
                    return Some(i + 1 + hashes);
                }
                i += 1;
            }
            Some(b.len())
        }
        _ => None,
    }
}

fn is_ident_start(c: u8) -> bool {
    c.is_ascii_alphabetic() || c == b'_' || c >= 0x80
}

fn ident_end(b: &[u8], start: usize) -> usize {
    let len = b[start..].iter().take_while(|&&c| c.is_ascii_alphanumeric() || c == b'_' || c >= 0x80).count();
    start + len
}

/// The byte ranges of all identifiers and keywords in blanked code.
fn identifiers(code: &[u8]) -> Vec<Range<usize>> {
    let mut idents = Vec::new();
    let mut i = 0;
    while i < code.len() {
        if is_ident_start(code[i]) {
            let end = ident_end(code, i);
            idents.push(i..end);
            i = end;
        } else if code[i].is_ascii_digit() {
            i = ident_end(code, i); // a number such as 1e5 or 2usize is not an identifier
        } else {
            i += 1;
        }
    }
    idents
}

/// The body's `{`: the first brace after `fn` outside the parameter list and
/// any brackets; `None` when a `;` ends the item first (a declaration).
fn body_open(code: &[u8], fn_at: usize) -> Option<usize> {
    let mut depth = 0i32;
    for (i, &c) in code.iter().enumerate().skip(fn_at) {
        match c {
            b'(' | b'[' => depth += 1,
            b')' | b']' => depth -= 1,
            b'{' if depth == 0 => return Some(i),
            b';' if depth == 0 => return None,
            _ => {}
        }
    }
    None
}

fn matching_close(code: &[u8], open: usize) -> Option<usize> {
    let mut depth = 0usize;
    for (i, &c) in code.iter().enumerate().skip(open) {
        match c {
            b'{' => depth += 1,
            b'}' => {
                depth -= 1;
                if depth == 0 {
                    return Some(i);
                }
            }
            _ => {}
        }
    }
    None
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
}
