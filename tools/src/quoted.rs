//! The guide quotes measured numbers only from committed runs: a chapter
//! holds each one between comments that name the file `cargo xtask figures`
//! writes it into under `guide/src/numbers/` and its anchor
//! (`<!-- from phase4.md:small-ddp-peak -->4,236 MiB<!-- end -->`), and
//! `figures` writes it there again from that file. This finds a number
//! typed with a unit of measurement outside such a quote.

use ::figures::numbers::chapters;

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
/// outside its quotes, its "Check yourself" section and the `worked`
/// phrases; and the `worked` phrases the text does not hold.
pub fn typed_numbers<'a>(text: &str, worked: &[&'a str]) -> (Vec<Typed>, Vec<&'a str>) {
    let mut masked = mask_quotes(text);
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

/// `text` with every quote, value and comments, blanked out (none when one
/// is unclosed: `figures check` reports that).
fn mask_quotes(text: &str) -> String {
    let mut masked = text.to_string();
    for quoted in chapters::quotes(text).unwrap_or_default() {
        blank(&mut masked, quoted.whole.start, quoted.whole.end);
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
    fn the_same_number_in_a_quote_passes() {
        let text = "DDP ran at <!-- from throughput.md:ddp-tok-s -->162 tok/s<!-- end --> on two cores.";
        assert_eq!(typed(text, &[]), Vec::<String>::new());
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
}
