//! The exercise list, loaded from `exercises/info.toml`.
//!
//! Every fact about an exercise (where it lives, what it teaches, its hint) is
//! data in that one file; this module only reads it and derives the paths that
//! follow from it by convention (solution file, test module, guide chapter).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde::Deserialize;

/// Where the metadata lives, relative to the repository root.
pub const INFO_FILE: &str = "exercises/info.toml";

/// The layout of info.toml this tool reads. Version 2 added `format_version`,
/// `guide_front`, the phases' `overview` and `after`, and an id for each mistake;
/// version 3 split each hint into tiers (`hint.idea`, `hint.pieces`, `hint.recipe`).
pub const FORMAT_VERSION: u32 = 3;

/// The whole exercise set: phases and exercises, both in file order.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Workbook {
    /// Checked by [`Workbook::parse`] before anything else is read.
    #[serde(rename = "format_version")]
    _format_version: u32,
    /// The guide's chapters before the first phase.
    pub guide_front: Vec<Chapter>,
    /// The guide's chapters after the last phase (appendices), if any.
    #[serde(default)]
    pub guide_back: Vec<Chapter>,
    #[serde(rename = "phase")]
    pub phases: Vec<Phase>,
    #[serde(rename = "exercise")]
    pub exercises: Vec<Exercise>,
}

/// A group of exercises that build one part of the trainer.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Phase {
    pub number: u32,
    pub title: String,
    pub summary: String,
    /// The chapter that opens the phase in the guide.
    pub overview: Chapter,
    /// Guide chapters after the phase's exercises.
    #[serde(default)]
    pub after: Vec<Chapter>,
}

/// A typical mistake: the graded tests look `text` up by `id`, and its fixture
/// output, where it has one, is the tensor `mistake_<id>`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Mistake {
    pub id: String,
    pub text: String,
}

/// A guide chapter that is not an exercise's.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Chapter {
    pub title: String,
    /// Relative to `guide/src`.
    pub chapter: PathBuf,
}

/// One exercise: the functions the learner writes in one file, graded by one
/// test module.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Exercise {
    pub number: u32,
    pub title: String,
    pub phase: u32,
    /// The file the learner edits, relative to the repository root.
    pub file: PathBuf,
    /// The functions to write, all in `file`, each shipped with the same `todo!`
    /// body: `name` for a free function, `Type::method` for a method. The
    /// first is the one `file:line` points at; the list is never empty.
    pub functions: Vec<String>,
    /// The types the learner designs, declared in `file` (fields and all):
    /// the phase module re-exports them. Most exercises have none.
    #[serde(default)]
    pub types: Vec<String>,
    pub concept: String,
    pub difficulty: String,
    pub read: String,
    pub insight: String,
    pub depends: Vec<u32>,
    /// What calls this exercise before its phase: that runtime runs the
    /// reference body while the learner's file still holds its stub.
    #[serde(default)]
    pub called_early_by: Option<String>,
    pub hint: Hint,
    /// The guide chapter, relative to `guide/src`.
    pub chapter: PathBuf,
    pub mistakes: Vec<Mistake>,
}

/// An exercise's hint in tiers, each shown only once the learner asks for
/// more than the one before: the idea, then the pieces, then the recipe.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Hint {
    /// The concept and the approach, in words and math.
    pub idea: String,
    /// The building blocks: which calls and types, not yet assembled.
    pub pieces: String,
    /// The near-code recipe, step by step.
    pub recipe: String,
}

impl Hint {
    /// How many tiers a hint has.
    pub const TIERS: u8 = 3;

    /// Each tier's heading, first tier first.
    pub const HEADINGS: [&'static str; Hint::TIERS as usize] = ["The idea", "The pieces", "The recipe"];

    /// Each tier with its heading, first tier first.
    pub fn tiers(&self) -> [(&'static str, &str); Hint::TIERS as usize] {
        let [idea, pieces, recipe] = Self::HEADINGS;
        [(idea, &self.idea), (pieces, &self.pieces), (recipe, &self.recipe)]
    }
}

impl Workbook {
    /// Reads and parses `exercises/info.toml` under `root`.
    pub fn load(root: &Path) -> Result<Self> {
        let path = root.join(INFO_FILE);
        let text = std::fs::read_to_string(&path).with_context(|| format!("cannot read {}", path.display()))?;
        Self::parse(&text).with_context(|| format!("{INFO_FILE} is not valid"))
    }

    /// Parses the text of an `info.toml`.
    pub fn parse(text: &str) -> Result<Self> {
        let version = toml::from_str::<toml::Table>(text)?.get("format_version").and_then(|v| v.as_integer());
        if version != Some(FORMAT_VERSION.into()) {
            let found = version.map_or("no format_version".to_string(), |v| format!("format_version {v}"));
            bail!(
                "it has {found}, and this `cargo xtask` reads format_version {FORMAT_VERSION}: \
                 take info.toml from the same version of the workbook as xtask/"
            );
        }
        let workbook: Self = toml::from_str(text)?;
        if workbook.exercises.is_empty() {
            bail!("it declares no [[exercise]]");
        }
        if let Some(exercise) = workbook.exercises.iter().find(|e| e.functions.is_empty()) {
            bail!("exercise {}: `functions` is empty: name at least one function to write", exercise.number);
        }
        Ok(workbook)
    }

    /// The exercise numbered `number`, or an error that says which numbers exist.
    pub fn exercise(&self, number: u32) -> Result<&Exercise> {
        match self.exercises.iter().find(|e| e.number == number) {
            Some(exercise) => Ok(exercise),
            None => bail!("no exercise {number}: the exercises are numbered {}", self.numbers_in_words()),
        }
    }

    /// The phase numbered `number`, or an error that says which phases exist.
    pub fn phase(&self, number: u32) -> Result<&Phase> {
        match self.phases.iter().find(|p| p.number == number) {
            Some(phase) => Ok(phase),
            None => {
                let numbers: Vec<String> = self.phases.iter().map(|p| p.number.to_string()).collect();
                bail!("no phase {number}: the phases are {}", numbers.join(", "))
            }
        }
    }

    /// Every exercise whose code exercise `number` calls, directly or through
    /// another (per `depends`), in order; without `number` itself.
    pub fn chain(&self, number: u32) -> BTreeSet<u32> {
        let mut chain = BTreeSet::new();
        let mut pending = vec![number];
        while let Some(n) = pending.pop() {
            let Ok(exercise) = self.exercise(n) else { continue };
            pending.extend(exercise.depends.iter().filter(|d| chain.insert(**d)));
        }
        chain.remove(&number);
        chain
    }

    /// The exercises of one phase, in order.
    pub fn exercises_in(&self, phase: u32) -> impl Iterator<Item = &Exercise> {
        self.exercises.iter().filter(move |e| e.phase == phase)
    }

    fn numbers_in_words(&self) -> String {
        let lowest = self.exercises.iter().map(|e| e.number).min().unwrap_or(0);
        let highest = self.exercises.iter().map(|e| e.number).max().unwrap_or(0);
        format!("{lowest} to {highest}")
    }
}

impl Exercise {
    /// The test module that grades this exercise, e.g. `exercise_05`.
    pub fn test_module(&self) -> String {
        format!("exercise_{:02}", self.number)
    }

    /// The file holding the graded tests, relative to the repository root.
    pub fn test_file(&self) -> PathBuf {
        PathBuf::from(format!("tests/graded/{}.rs", self.test_module()))
    }

    /// The reference body: the same path with `exercises/` replaced by `solutions/`.
    pub fn solution_file(&self) -> Result<PathBuf> {
        let rest = self.file.strip_prefix("exercises").with_context(|| {
            format!("exercise {}: `file` must lie under exercises/, not {}", self.number, self.file.display())
        })?;
        Ok(Path::new("solutions").join(rest))
    }

    /// The phase module and the exercise module its file becomes, e.g.
    /// `("phase1_model", "ex01_rms_norm")`.
    pub fn modules(&self) -> Result<(String, String)> {
        fn stem(path: Option<&Path>) -> Option<&str> {
            path?.file_stem()?.to_str()
        }
        match (stem(self.file.parent()), stem(Some(&self.file))) {
            (Some(phase), Some(module)) if self.file.extension().is_some_and(|e| e == "rs") => {
                Ok((phase.to_string(), module.to_string()))
            }
            _ => bail!(
                "exercise {}: `file` must be exercises/<phase folder>/<module>.rs, not {}",
                self.number,
                self.file.display()
            ),
        }
    }

    /// What the phase module re-exports: the free functions among
    /// `functions`, and the learner's own `types`.
    pub fn exported_items(&self) -> impl Iterator<Item = &str> {
        let free_functions = self.functions.iter().map(String::as_str).filter(|f| !f.contains("::"));
        free_functions.chain(self.types.iter().map(String::as_str))
    }

    /// The guide chapter, relative to the repository root.
    pub fn chapter_file(&self) -> PathBuf {
        Path::new("guide/src").join(&self.chapter)
    }

    /// The bare function names (`forward` for `RmsNorm::forward`), in the
    /// order of `functions`.
    pub fn fn_names(&self) -> Vec<&str> {
        self.functions.iter().map(|function| function.rsplit("::").next().unwrap_or(function)).collect()
    }

    /// The line the learner's shipped stub holds, e.g.
    /// `todo!("Exercise 2: rotate_half; run `cargo xtask hint 2`")`.
    pub fn stub_line(&self) -> String {
        // The title sits inside a format string: double the braces so `todo!`
        // prints it verbatim, and quote it as a Rust literal (`{:?}`).
        let message = format!("Exercise {}: {}; run `cargo xtask hint {}`", self.number, self.title, self.number);
        format!("todo!({:?})", message.replace('{', "{{").replace('}', "}}"))
    }

    /// The test filter that selects this exercise's graded tests.
    pub fn test_filter(&self) -> String {
        format!("{}::", self.test_module())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn real() -> Workbook {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        Workbook::load(root).expect("the real info.toml parses")
    }

    #[test]
    fn a_chain_holds_what_an_exercise_calls_through_others_too() {
        let workbook = real();
        // 3 calls 2 directly; 5 calls 3, so 2 as well; 1 calls nothing.
        assert_eq!(workbook.chain(3), [2].into());
        assert!(workbook.chain(5).is_superset(&[2, 3].into()));
        assert!(!workbook.chain(5).contains(&5));
        assert!(workbook.chain(1).is_empty());
    }

    #[test]
    fn real_info_toml_parses_with_contiguous_numbers() {
        let workbook = real();
        for (index, exercise) in workbook.exercises.iter().enumerate() {
            assert_eq!(exercise.number as usize, index + 1);
            assert!(workbook.phase(exercise.phase).is_ok());
        }
        assert_eq!(workbook.phases[0].number, 1);
    }

    #[test]
    fn derived_paths_follow_the_conventions() {
        let workbook = real();
        let rotate = workbook.exercise(2).unwrap();
        assert_eq!(rotate.test_module(), "exercise_02");
        assert_eq!(rotate.test_filter(), "exercise_02::");
        assert_eq!(rotate.test_file(), Path::new("tests/graded/exercise_02.rs"));
        assert_eq!(rotate.solution_file().unwrap(), Path::new("solutions/phase1_model/ex02_rotate_half.rs"));
        assert_eq!(rotate.chapter_file(), Path::new("guide/src/phase1/02-rotate-half.md"));
        assert_eq!(rotate.stub_line(), "todo!(\"Exercise 2: rotate_half; run `cargo xtask hint 2`\")");
        assert_eq!(workbook.exercise(1).unwrap().fn_names(), ["forward"]);
    }

    #[test]
    fn unknown_numbers_say_which_exist() {
        let workbook = real();
        let last = workbook.exercises.len();
        let error = workbook.exercise(99).unwrap_err().to_string();
        assert_eq!(error, format!("no exercise 99: the exercises are numbered 1 to {last}"));
        assert!(workbook.phase(9).unwrap_err().to_string().starts_with("no phase 9: the phases are 1"));
    }

    #[test]
    fn stub_line_escapes_quotes_and_braces() {
        let mut exercise = real().exercises.remove(0);
        exercise.title = r#"say "{hi}""#.into();
        assert_eq!(exercise.stub_line(), r#"todo!("Exercise 1: say \"{{hi}}\"; run `cargo xtask hint 1`")"#);
    }

    /// A one-phase, one-exercise info.toml whose exercise writes `functions`.
    fn minimal(functions: &str) -> String {
        format!(
            r#"format_version = 3
guide_front = []

[[phase]]
number = 1
title = "t"
summary = "s"
overview = {{ title = "o", chapter = "phase1/index.md" }}

[[exercise]]
number = 1
title = "Checkpoints"
phase = 1
file = "exercises/phase1_x/ex01_checkpoints.rs"
functions = {functions}
concept = "c"
difficulty = "d"
read = "r"
insight = "i"
depends = []
hint = {{ idea = "i", pieces = "p", recipe = "r" }}
chapter = "phase1/01.md"
mistakes = []
"#
        )
    }

    #[test]
    fn an_exercise_may_write_several_functions() {
        let workbook = Workbook::parse(&minimal(r#"["Trainer::save_checkpoint", "load_checkpoint"]"#)).unwrap();
        let exercise = workbook.exercise(1).unwrap();
        assert_eq!(exercise.functions, ["Trainer::save_checkpoint", "load_checkpoint"]);
        assert_eq!(exercise.fn_names(), ["save_checkpoint", "load_checkpoint"]);
        assert_eq!(exercise.exported_items().collect::<Vec<_>>(), ["load_checkpoint"], "a method is not re-exported");
        assert_eq!(exercise.modules().unwrap(), ("phase1_x".to_string(), "ex01_checkpoints".to_string()));
    }

    #[test]
    fn another_format_version_says_which_is_read() {
        for (text, found) in [
            (minimal("[\"f\"]").replace("format_version = 3", "format_version = 2"), "format_version 2"),
            (minimal("[\"f\"]").replace("format_version = 3\n", ""), "no format_version"),
        ] {
            let error = Workbook::parse(&text).unwrap_err().to_string();
            assert!(
                error.starts_with(&format!("it has {found}, and this `cargo xtask` reads format_version 3")),
                "{error}"
            );
        }
    }

    #[test]
    fn an_exercise_without_functions_is_rejected() {
        let error = Workbook::parse(&minimal("[]")).unwrap_err().to_string();
        assert_eq!(error, "exercise 1: `functions` is empty: name at least one function to write");
        let singular = minimal(r#""f""#).replace("functions", "function");
        assert!(Workbook::parse(&singular).is_err(), "the old `function` field is gone");
    }

    #[test]
    fn typos_in_field_names_are_rejected() {
        let text =
            minimal("[\"f\"]").replace("number = 1\ntitle = \"Checkpoints\"", "numbr = 1\ntitle = \"Checkpoints\"");
        assert!(Workbook::parse(&text).unwrap_err().to_string().contains("numbr"));
    }
}
