//! The guide's code blocks fit its page: no line of a fenced block is wider
//! than 80 columns, about what the 750 px column shows at mdBook's code
//! size. A longer line scrolls sideways on every screen, and the end of a
//! command or of a diagram's row is what a reader misses. A command breaks
//! with `\`, illustrative output elides with `…`, a diagram is drawn
//! narrower.

/// The widest line a code block may hold.
pub const COLUMNS: usize = 80;

/// A line of a code block wider than [`COLUMNS`]: where, and how wide.
#[derive(Debug, PartialEq)]
pub struct WideLine {
    pub line: usize,
    pub columns: usize,
}

/// The lines of a chapter's fenced code blocks wider than [`COLUMNS`].
pub fn wide_code_lines(text: &str) -> Vec<WideLine> {
    let mut wide = vec![];
    // The open block's fence (``` or ~~~, as long as it was typed) and indent.
    let mut open: Option<(String, usize)> = None;
    for (index, line) in text.lines().enumerate() {
        let indent = line.len() - line.trim_start().len();
        let trimmed = line.trim_start();
        match &open {
            None => {
                let fence: String = trimmed.chars().take_while(|&c| c == '`' || c == '~').collect();
                if fence.len() >= 3 && fence.chars().all(|c| c == fence.as_bytes()[0] as char) {
                    open = Some((fence, indent));
                }
            }
            Some((fence, _))
                if trimmed.starts_with(fence.as_str())
                    && trimmed.trim_end().trim_matches(fence.as_bytes()[0] as char).is_empty() =>
            {
                open = None;
            }
            Some((_, fence_indent)) => {
                // A block indented under a list item loses that indent on the page.
                let columns = line[indent.min(*fence_indent)..].chars().count();
                if columns > COLUMNS {
                    wide.push(WideLine { line: index + 1, columns });
                }
            }
        }
    }
    wide
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    fn wide(text: &str) -> Vec<(usize, usize)> {
        wide_code_lines(text).into_iter().map(|w| (w.line, w.columns)).collect()
    }

    #[test]
    fn a_code_line_over_80_columns_is_found_with_its_line() {
        let text = format!("prose {}\n\n```text\n{}\n{}\n```\n", "p".repeat(100), "a".repeat(80), "b".repeat(81));
        assert_eq!(wide(&text), [(5, 81)], "prose may be long; code may be 80 columns, not 81");
    }

    #[test]
    fn columns_are_characters_not_bytes() {
        let text = format!("```text\n{}\n```\n", "│ → ".repeat(20));
        assert_eq!(wide(&text), [], "80 characters, 160 bytes");
    }

    #[test]
    fn a_block_under_a_list_item_is_measured_without_its_indent() {
        let text = format!("1. Run:\n\n   ```text\n   {}\n   ```\n", "c".repeat(80));
        assert_eq!(wide(&text), []);
    }

    #[test]
    fn a_longer_fence_holds_a_shorter_one() {
        let text = format!("````markdown\n```text\n{}\n```\n````\n{}\n", "m".repeat(81), "after ".repeat(20));
        assert_eq!(wide(&text), [(3, 81)]);
    }

    #[test]
    fn every_code_block_of_the_guide_fits_80_columns() {
        let guide = Path::new(env!("CARGO_MANIFEST_DIR")).join("../guide/src");
        let mut found = vec![];
        for chapter in crate::verify::markdown_files(&guide) {
            let text = std::fs::read_to_string(&chapter).unwrap();
            let name = chapter.strip_prefix(&guide).unwrap().display().to_string();
            for line in wide_code_lines(&text) {
                found.push(format!("guide/src/{name}:{}: {} columns", line.line, line.columns));
            }
        }
        assert!(
            found.is_empty(),
            "code lines wider than {COLUMNS} columns scroll sideways even at 1280 px; break a command with `\\`, \
             elide illustrative output with `…`, draw a diagram narrower:\n{}",
            found.join("\n")
        );
    }
}
