//! The guide quotes measured numbers only from committed runs: a chapter
//! includes each one from the files `cargo xtask figures` writes into
//! `guide/src/numbers/` (`{{#include ../numbers/phase4.md:small-ddp-peak}}`)
//! instead of typing it. This finds a number typed with a unit of
//! measurement outside such an include, and an include that names an anchor
//! no number file has (mdBook would render it as nothing).

use std::collections::BTreeSet;
use std::path::{Component, Path, PathBuf};

/// The units a measured speed, size or time is given in.
const UNITS: [&str; 8] = ["tok/s", "tokens/s", "GFLOP/s", "TFLOP/s", "MiB", "GiB", "ms", "MFU"];

/// Numbers with a unit that no run measures, by chapter (under `guide/src/`):
/// constants of PyTorch or the workbook, and sizes a chapter works out by
/// hand in front of the reader. The phrase holds the number, so that the
/// same number typed elsewhere in the chapter is still found. A chapter's
/// "Check yourself" section is not read: its questions posit their numbers.
pub const WORKED: [(&str, &str); 16] = [
    // Constants: PyTorch's default bucket, the workbook's frame and broadcast piece.
    ("phase2/10-train-step.md", "holds 25 MiB"),
    ("phase2/launching.md", "bounded (16 MiB)"),
    ("phase2/launching.md", "in 4 MiB pieces"),
    ("phase4/19-overlapped-ddp.md", "`bucket_cap_mb`, 25 MiB by default"),
    ("phase4/19-overlapped-ddp.md", "With 25 MiB buckets"),
    ("phase4/26-data-parallel.md", "embeddings), a 25 MiB"),
    ("phase4/26-data-parallel.md", "(25 MiB; the first only 1 MiB,"),
    // Worked by hand: bytes of a shape, or bytes over an assumed bandwidth.
    ("phase3/fsdp-knobs.md", "972.8 MB = 928 MiB"),
    ("phase4/21-gpipe.md", "8 × 1024 × 768 × 2 = 12 MiB"),
    ("phase4/23-tensor-parallel-block.md", "each is 1.5 MiB, 72 MiB"),
    ("phase4/24-one-f-one-b.md", "logits in f32, 98 MiB"),
    ("phase4/26-data-parallel.md", "6.0 ms at an assumed"),
    ("phase4/26-data-parallel.md", "(276 MB, 2.8 ms)"),
    // Counted, not timed: the tiny config's model states and one FSDP step's
    // traffic, which the trainer prints and the page works out from Ψ.
    ("training.md", "13.3 MiB for parameters"),
    ("training.md", "ring volume 4.85 MiB"),
    ("training.md", "5.81 MiB is 14 bytes per parameter"),
];

/// A number with a unit typed in a chapter: where, and what.
#[derive(Debug, PartialEq)]
pub struct Typed {
    pub line: usize,
    pub text: String,
}

/// The numbers with a unit of measurement typed in a chapter's `text`,
/// outside its includes, its "Check yourself" section and the `worked`
/// phrases; and the `worked` phrases the text does not hold.
pub fn typed_numbers<'a>(text: &str, worked: &[&'a str]) -> (Vec<Typed>, Vec<&'a str>) {
    let mut masked = mask_includes(text);
    mask_check_yourself(&mut masked);
    let unused = worked.iter().copied().filter(|phrase| !mask_all(&mut masked, phrase)).collect();
    let mut found: Vec<(usize, Typed)> = UNITS
        .iter()
        .flat_map(|unit| masked.match_indices(unit).map(move |(at, _)| (at, *unit)))
        .filter_map(|(at, unit)| {
            let start = number_before(masked.as_bytes(), at, at + unit.len())?;
            let line = masked[..start].matches('\n').count() + 1;
            let text = masked[start..at + unit.len()].split_whitespace().collect::<Vec<_>>().join(" ");
            Some((start, Typed { line, text }))
        })
        .collect();
    found.sort_by_key(|(start, _)| *start);
    (found.into_iter().map(|(_, typed)| typed).collect(), unused)
}

/// Where the number that `unit` (at `at..end`) follows begins, if a number
/// does: `162 tok/s`, `4,182\nMiB`, `7.9k tokens/s`, `29.5% MFU`.
fn number_before(text: &[u8], at: usize, end: usize) -> Option<usize> {
    let word_char = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    if at > 0 && word_char(text[at - 1]) && !text[at - 1].is_ascii_digit() {
        return None; // inside a word: `items`, `terms`
    }
    if text.get(end).is_some_and(|&b| word_char(b)) {
        return None; // the start of a longer word: `msg`, `MiBs`
    }
    let mut i = at;
    while i > 0 && text[i - 1].is_ascii_whitespace() {
        i -= 1;
    }
    if i > 1 && matches!(text[i - 1], b'%' | b'k' | b'M' | b'G') && text[i - 2].is_ascii_digit() {
        i -= 1;
    }
    if i == 0 || !text[i - 1].is_ascii_digit() {
        return None;
    }
    let digits_end = i;
    while i > 0 && (text[i - 1].is_ascii_digit() || matches!(text[i - 1], b',' | b'.')) {
        i -= 1;
    }
    while i < digits_end && !text[i].is_ascii_digit() {
        i += 1; // a leading `,` or `.` is punctuation, not the number's
    }
    let is_number = i < digits_end && (i == 0 || !word_char(text[i - 1]));
    is_number.then_some(i)
}

/// `text` with every `{{#include …}}` blanked out.
fn mask_includes(text: &str) -> String {
    let mut masked = text.to_string();
    for (start, end) in includes(text).map(|include| include.span) {
        blank(&mut masked, start, end);
    }
    masked
}

/// Blanks out the `## Check yourself` section, up to the next heading of its level or above.
fn mask_check_yourself(text: &mut String) {
    let Some(start) = line_starting(text, 0, "## Check yourself") else { return };
    let after = start + 1;
    let end = [line_starting(text, after, "## "), line_starting(text, after, "# ")]
        .into_iter()
        .flatten()
        .min()
        .unwrap_or(text.len());
    blank(text, start, end);
}

/// Where the first line at or after `from` that starts with `prefix` begins.
fn line_starting(text: &str, from: usize, prefix: &str) -> Option<usize> {
    text[from..].match_indices(prefix).map(|(at, _)| from + at).find(|&at| at == 0 || text.as_bytes()[at - 1] == b'\n')
}

/// Blanks out every occurrence of `phrase`; false if there is none.
fn mask_all(text: &mut String, phrase: &str) -> bool {
    let starts: Vec<usize> = text.match_indices(phrase).map(|(at, _)| at).collect();
    for &start in &starts {
        blank(text, start, start + phrase.len());
    }
    !phrase.is_empty() && !starts.is_empty()
}

/// Replaces `text[start..end]` with spaces, keeping its line breaks (and so
/// every later line's number) and its length in bytes.
fn blank(text: &mut String, start: usize, end: usize) {
    let blanked: String =
        text[start..end].chars().map(|c| if c == '\n' { "\n".to_string() } else { " ".repeat(c.len_utf8()) }).collect();
    text.replace_range(start..end, &blanked);
}

/// One `{{#include path:anchor}}` of a chapter.
#[derive(Debug, PartialEq)]
pub struct Include<'a> {
    pub path: &'a str,
    pub anchor: Option<&'a str>,
    span: (usize, usize),
}

/// The includes of a chapter's `text`, in order.
pub fn includes(text: &str) -> impl Iterator<Item = Include<'_>> {
    const OPEN: &str = "{{#include ";
    text.match_indices(OPEN).filter_map(move |(start, _)| {
        let spec_start = start + OPEN.len();
        let spec_end = spec_start + text[spec_start..].find("}}")?;
        let spec = text[spec_start..spec_end].trim();
        let (path, anchor) = spec.split_once(':').map_or((spec, None), |(path, anchor)| (path, Some(anchor)));
        Some(Include { path, anchor, span: (start, spec_end + 2) })
    })
}

/// The file an include in `chapter` names, with its `..` resolved.
pub fn resolve(chapter: &Path, path: &str) -> PathBuf {
    let mut resolved = PathBuf::new();
    for component in chapter.parent().unwrap_or(Path::new("")).join(path).components() {
        match component {
            Component::ParentDir => {
                resolved.pop();
            }
            Component::CurDir => {}
            other => resolved.push(other),
        }
    }
    resolved
}

/// The anchors a number file defines (`ANCHOR: name` lines).
pub fn anchors(text: &str) -> BTreeSet<&str> {
    text.lines().filter_map(|line| line.strip_prefix("ANCHOR: ")).map(str::trim).collect()
}

/// What an include of `anchor` brings in from `text`: the lines between
/// `ANCHOR: anchor` and `ANCHOR_END: anchor`, without other anchors' lines,
/// as mdBook does.
pub fn anchored(text: &str, anchor: &str) -> Option<String> {
    let mut lines = text.lines().skip_while(|line| line.strip_prefix("ANCHOR: ").map(str::trim) != Some(anchor));
    lines.next()?;
    let inside = lines.take_while(|line| line.strip_prefix("ANCHOR_END: ").map(str::trim) != Some(anchor));
    let kept: Vec<&str> =
        inside.filter(|line| !line.starts_with("ANCHOR: ") && !line.starts_with("ANCHOR_END: ")).collect();
    Some(kept.join("\n"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn typed(text: &str, worked: &[&str]) -> Vec<String> {
        typed_numbers(text, worked).0.into_iter().map(|t| t.text).collect()
    }

    #[test]
    fn a_hand_typed_measurement_is_found_with_its_line() {
        let text = "# Profiling\n\nDDP ran at 162 tok/s on two cores.\n";
        let (found, _) = typed_numbers(text, &[]);
        assert_eq!(found, [Typed { line: 3, text: "162 tok/s".into() }]);
    }

    #[test]
    fn every_unit_and_way_of_writing_a_number_is_found() {
        let text = "a peak of 4,182\nMiB, 7.9k tokens/s, 29.5% MFU, 0.25 MiB, 5ms, 46 TFLOP/s and 115 GFLOP/s";
        let found = typed(text, &[]);
        assert_eq!(found, ["4,182 MiB", "7.9k tokens/s", "29.5% MFU", "0.25 MiB", "5ms", "46 TFLOP/s", "115 GFLOP/s"]);
    }

    #[test]
    fn units_without_a_number_or_inside_words_are_not_numbers() {
        let text = "the MFU, DDP's tokens/s, items in bf16 MiB, 4 terms, f32 ms, 12 msgs, step 3, MiB.";
        assert_eq!(typed(text, &[]), Vec::<String>::new());
    }

    #[test]
    fn the_same_number_from_an_include_passes() {
        let text = "DDP ran at {{#include ../numbers/throughput.md:ddp-tok-s}} on two cores.";
        assert_eq!(typed(text, &[]), Vec::<String>::new());
        let include = includes(text).next().unwrap();
        assert_eq!((include.path, include.anchor), ("../numbers/throughput.md", Some("ddp-tok-s")));
    }

    #[test]
    fn a_worked_example_passes_but_the_same_number_elsewhere_does_not() {
        let text = "a cut carries 8 × 1024 × 768 × 2 = 12 MiB each way; a rank measured 12 MiB.";
        let (found, unused) = typed_numbers(text, &["8 × 1024 × 768 × 2 = 12 MiB", "= 99 MiB"]);
        assert_eq!(found, [Typed { line: 1, text: "12 MiB".into() }]);
        assert_eq!(unused, ["= 99 MiB"], "an allowed phrase the chapter no longer holds is reported");
    }

    #[test]
    fn the_check_yourself_section_posits_its_numbers() {
        let text = "# Ch\n\n## Check yourself\n\n1. At 200 ms a step...\n\n## Next\n\nIt took 93 ms.\n";
        let (found, _) = typed_numbers(text, &[]);
        assert_eq!(found, [Typed { line: 9, text: "93 ms".into() }]);
    }

    #[test]
    fn an_anchor_brings_in_its_lines_only() {
        let file = "ANCHOR: a\none\nANCHOR: b\ntwo\nANCHOR_END: b\nANCHOR_END: a\nthree\n";
        assert_eq!(anchored(file, "a").as_deref(), Some("one\ntwo"));
        assert_eq!(anchored(file, "b").as_deref(), Some("two"));
        assert_eq!(anchored(file, "c"), None);
    }

    #[test]
    fn an_include_resolves_against_its_chapter_and_anchors_are_read() {
        let chapter = Path::new("guide/src/phase2/profiling.md");
        assert_eq!(resolve(chapter, "../numbers/gpu.md"), Path::new("guide/src/numbers/gpu.md"));
        let file =
            "<!-- header -->\nANCHOR: peak\n67 TFLOP/s\nANCHOR_END: peak\nANCHOR: rows\n| a |\nANCHOR_END: rows\n";
        assert_eq!(anchors(file).into_iter().collect::<Vec<_>>(), ["peak", "rows"]);
    }
}
