// Code in a table cell wraps where a reader expects it to: at its spaces,
// and inside a long path or name after a `/`, `.`, `_`, `:`, `(`, `,` or
// `=` and before the capital of a CamelCase word, never after a flag's
// leading dashes (`--prefetch` stays whole). On a phone a long flag may also
// break after a hyphen inside it (`--activation-` / `checkpointing`), where
// a column beside the pinned first one would otherwise show it in pieces.
// CSS alone cannot say this (a hyphen is always a break, a slash never), so
// each piece between those places becomes a span that does not wrap
// (tables.css), with a <wbr> between pieces. The text is unchanged: what a
// reader copies is what was typed. Without this script a cell's code stays
// on one line.
(() => {
    "use strict";
    // Where a word may break: after separators that follow something else
    // (`.step_NNNNNN` keeps its leading dot), and inside `MixedPrecision`.
    const pieces = (word) => word
        .replace(/([^/._:(,=][/._:(,=]+)(?=[^/._:(,=])/g, "$1\n")
        .replace(/([a-z])(?=[A-Z])/g, "$1\n")
        .split("\n");
    const span = (text) => {
        const element = document.createElement("span");
        element.textContent = text;
        return element;
    };
    for (const code of document.querySelectorAll("td code, th code")) {
        if (code.children.length > 0) {
            continue;
        }
        const words = code.textContent.split(/(\s+)/);
        code.textContent = "";
        for (const word of words) {
            if (word.trim() === "") {
                code.append(word);
                continue;
            }
            pieces(word).forEach((text, i) => {
                if (i > 0) {
                    code.append(document.createElement("wbr"));
                }
                const parts = text.replace(/([A-Za-z]-)(?=[A-Za-z])/g, "$1\n").split("\n");
                if (parts.length === 1) {
                    code.append(span(text));
                    return;
                }
                // Whole but on a phone (tables.css).
                const hyphens = span("");
                hyphens.className = "hyphens";
                parts.forEach((part, j) => {
                    if (j > 0) {
                        hyphens.append(document.createElement("wbr"));
                    }
                    hyphens.append(span(part));
                });
                code.append(hyphens);
            });
        }
        code.classList.add("wraps");
    }
})();
