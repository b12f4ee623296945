//! `figures draw ROOT` draws every guide figure from the recorded data in
//! the workbook at ROOT, writes the numbers its chapters quote, and writes
//! each quoted value in the chapters again; `figures check ROOT` says which
//! figures, number files or chapters are not what their data gives today.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use figures::catalog::FIGURES;
use figures::numbers::{chapters, Sources, NUMBER_FILES};

/// Where the workbook keeps what this program reads and writes.
const DATA: &str = "guide/figure-data";
const FIGURES_DIR: &str = "guide/src/figures";
const NUMBERS_DIR: &str = "guide/src/numbers";
/// The chapters, which quote the numbers.
const GUIDE_DIR: &str = "guide/src";
const RESULTS: &str = "benchmarks/results.md";
const CONFIGS: &str = "configs";

fn main() -> ExitCode {
    match run() {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<ExitCode> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [command, root] = args.as_slice() else {
        bail!("usage: figures draw|check <workbook root>");
    };
    let root = PathBuf::from(root);
    let write = match command.as_str() {
        "draw" => true,
        "check" => false,
        other => bail!("unknown command `{other}`: draw or check"),
    };
    let data = root.join(DATA);
    let sources = Sources::read(&root.join(RESULTS), &data, &root.join(CONFIGS))?;
    let mut outputs = vec![];
    for figure in FIGURES {
        outputs.push((root.join(FIGURES_DIR).join(figure.file), figure.draw(&data)?));
    }
    let mut number_files = BTreeMap::new();
    for numbers in NUMBER_FILES {
        let text = numbers.render(&sources)?;
        number_files.insert(numbers.file, text.clone());
        outputs.push((root.join(NUMBERS_DIR).join(numbers.file), text));
    }
    let value = |file: &str, anchor: &str| number_files.get(file).and_then(|text| chapters::anchored(text, anchor));
    for chapter in markdown_under(&root.join(GUIDE_DIR))? {
        let text = std::fs::read_to_string(&chapter)?;
        let requoted = chapters::requote(&text, value).with_context(|| format!("{}", chapter.display()))?;
        // Only a chapter whose quotes changed is written, or stale.
        if requoted != text {
            outputs.push((chapter, requoted));
        }
    }
    let mut stale = 0;
    for (path, text) in &outputs {
        if write {
            std::fs::create_dir_all(path.parent().unwrap_or(Path::new(".")))?;
            std::fs::write(path, text)?;
            println!("wrote {}", path.display());
        } else if std::fs::read_to_string(path).ok().as_deref() != Some(text.as_str()) {
            println!("{} is stale: its data gives another text (run `cargo xtask figures`)", path.display());
            stale += 1;
        }
    }
    for leftover in leftovers(&root.join(NUMBERS_DIR), &outputs) {
        println!("{} is written by nothing: delete it", leftover.display());
        stale += 1;
    }
    Ok(if stale == 0 { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

/// The markdown files under `dir`, the number files aside.
fn markdown_under(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut found = vec![];
    for entry in std::fs::read_dir(dir).with_context(|| format!("cannot read {}", dir.display()))? {
        let path = entry?.path();
        if path.is_dir() && !path.ends_with("numbers") {
            found.extend(markdown_under(&path)?);
        } else if path.extension().is_some_and(|e| e == "md") {
            found.push(path);
        }
    }
    Ok(found)
}

/// The files in `dir` that no output is written to: what a renamed or
/// dropped number file left behind, which a chapter could still include.
fn leftovers(dir: &Path, outputs: &[(PathBuf, String)]) -> Vec<PathBuf> {
    let entries = std::fs::read_dir(dir).into_iter().flatten().flatten();
    entries.map(|e| e.path()).filter(|path| !outputs.iter().any(|(written, _)| written == path)).collect()
}
