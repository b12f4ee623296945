//! Where a chapter quotes a number: in its own text, between two HTML
//! comments that name the number file and anchor it comes from,
//!
//! ```text
//! ran at <!-- from phase4.md:tiny-ring-speed -->0.94×<!-- end --> of DDP's speed
//! ```
//!
//! The comments vanish on the page, and the chapter reads whole as plain
//! markdown too (on a forge, in an editor), where an mdBook include would
//! show its directive. `figures draw` writes each quoted value again from
//! its number file; `figures check` says which chapter holds a stale one.

use std::collections::BTreeSet;
use std::ops::Range;

use anyhow::{bail, Result};

const OPEN: &str = "<!-- from ";
const OPEN_END: &str = " -->";
const CLOSE: &str = "<!-- end -->";

/// One quoted value of a chapter.
#[derive(Debug, PartialEq)]
pub struct Quoted<'a> {
    /// The number file, by its name in `guide/src/numbers/`.
    pub file: &'a str,
    pub anchor: &'a str,
    /// Where the value stands in the chapter.
    pub value: Range<usize>,
    /// The value with its two comments.
    pub whole: Range<usize>,
}

/// The quotes of a chapter's `text`, in order; an opening comment without
/// its `file:anchor` or its closing one is an error.
pub fn quotes(text: &str) -> Result<Vec<Quoted<'_>>> {
    let mut found = vec![];
    let mut from = 0;
    while let Some(at) = text[from..].find(OPEN).map(|at| from + at) {
        let line = text[..at].matches('\n').count() + 1;
        let spec_start = at + OPEN.len();
        let Some(spec_end) = text[spec_start..].find(OPEN_END).map(|end| spec_start + end) else {
            bail!("line {line}: `{OPEN}` is not closed by `{OPEN_END}`");
        };
        let Some((file, anchor)) = text[spec_start..spec_end].trim().split_once(':') else {
            bail!("line {line}: a quote names its number as `file.md:anchor`");
        };
        let value_start = spec_end + OPEN_END.len();
        let Some(value_end) = text[value_start..].find(CLOSE).map(|end| value_start + end) else {
            bail!("line {line}: the quote of {file}:{anchor} has no `{CLOSE}`");
        };
        let end = value_end + CLOSE.len();
        found.push(Quoted { file, anchor, value: value_start..value_end, whole: at..end });
        from = end;
    }
    Ok(found)
}

/// `text` with each quoted value replaced by what `value(file, anchor)`
/// gives now (a value of several lines on lines of its own between the
/// comments); an anchor it does not know is an error.
pub fn requote(text: &str, value: impl Fn(&str, &str) -> Option<String>) -> Result<String> {
    let mut requoted = String::with_capacity(text.len());
    let mut copied = 0;
    for quoted in quotes(text)? {
        let Some(now) = value(quoted.file, quoted.anchor) else {
            bail!("it quotes {}:{}, which no number file writes", quoted.file, quoted.anchor);
        };
        requoted.push_str(&text[copied..quoted.value.start]);
        // A table or a code block stands between comments on lines of their own.
        match now.contains('\n') {
            true => requoted.push_str(&format!("\n{now}\n")),
            false => requoted.push_str(&now),
        }
        copied = quoted.value.end;
    }
    requoted.push_str(&text[copied..]);
    Ok(requoted)
}

/// The anchors a number file defines (`ANCHOR: name` lines).
pub fn anchors(text: &str) -> BTreeSet<&str> {
    text.lines().filter_map(|line| line.strip_prefix("ANCHOR: ")).map(str::trim).collect()
}

/// The value under `anchor` in a number file's `text`: the lines between
/// `ANCHOR: anchor` and `ANCHOR_END: anchor`.
pub fn anchored(text: &str, anchor: &str) -> Option<String> {
    let mut lines = text.lines().skip_while(|line| line.strip_prefix("ANCHOR: ").map(str::trim) != Some(anchor));
    lines.next()?;
    let inside = lines.take_while(|line| line.strip_prefix("ANCHOR_END: ").map(str::trim) != Some(anchor));
    Some(inside.collect::<Vec<_>>().join("\n"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_quote_names_its_file_and_anchor_and_holds_its_value() {
        let text = "ran at <!-- from phase4.md:tiny-ring-speed -->0.94×<!-- end --> of DDP's.";
        let found = quotes(text).unwrap();
        assert_eq!(found.len(), 1);
        assert_eq!((found[0].file, found[0].anchor), ("phase4.md", "tiny-ring-speed"));
        assert_eq!(&text[found[0].value.clone()], "0.94×");
        assert_eq!(&text[found[0].whole.clone()], "<!-- from phase4.md:tiny-ring-speed -->0.94×<!-- end -->");
    }

    #[test]
    fn requoting_replaces_the_values_only() {
        let text = "a <!-- from f.md:x -->1<!-- end --> and\n<!-- from f.md:rows -->\n| 1 |\n<!-- end -->\n";
        let now = |file: &str, anchor: &str| (file == "f.md").then(|| format!("new\n{anchor}").replace("\nx", " x"));
        let requoted = requote(text, now).unwrap();
        assert_eq!(
            requoted,
            "a <!-- from f.md:x -->new x<!-- end --> and\n<!-- from f.md:rows -->\nnew\nrows\n<!-- end -->\n"
        );
        let err = requote(text, |_, _| None).unwrap_err().to_string();
        assert!(err.contains("f.md:x, which no number file writes"), "{err}");
    }

    #[test]
    fn an_unclosed_quote_is_an_error_naming_its_line() {
        let err = quotes("one\n<!-- from f.md:x -->1 and on").unwrap_err().to_string();
        assert!(err.contains("line 2") && err.contains("no `<!-- end -->`"), "{err}");
        assert!(quotes("<!-- from f.md -->1<!-- end -->").is_err(), "a quote without an anchor");
    }

    #[test]
    fn an_anchor_brings_in_its_lines_and_anchors_are_listed() {
        let file = "<!-- header -->\nANCHOR: a\none\ntwo\nANCHOR_END: a\nANCHOR: b\nthree\nANCHOR_END: b\n";
        assert_eq!(anchored(file, "a").as_deref(), Some("one\ntwo"));
        assert_eq!(anchored(file, "c"), None);
        assert_eq!(anchors(file).into_iter().collect::<Vec<_>>(), ["a", "b"]);
    }
}
