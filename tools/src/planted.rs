//! Planted mistakes: the typical mistakes that no fixture output stands for,
//! committed on purpose in the reference solutions, to prove that a test
//! catches each one by name and that no test blames another.
//!
//! A mistake with a fixture output (`mistake_<id>` in `tests/fixtures/`) is
//! named exactly when a learner's output equals that output, so the fixture
//! itself is the proof. The others (a missing barrier, clipping before the
//! average, a typed-in default) are behaviours: `solutions/mistakes.toml`
//! plants each as a small edit of its exercise's reference solution, and
//! `verify` builds the solutions with the edit and runs the exercise's tests.
//!
//! `solutions/natural.toml` holds mistakes of another kind: the ones a
//! learner makes in their own words, written as edits of the same solutions
//! but not as the plants above were. `verify --natural` plants them the same
//! way and counts how often a failure names what each one is, names nothing,
//! or names something it is not: how well the messages hold up away from the
//! mistakes they were written against.
//!
//! Plants of independent exercises (neither calls the other's code, per
//! `depends`) share a build. A planted solution is a copy under
//! `target/planted/`, which the build compiles in place of the reference
//! (see `build/planted_dir.rs`): the tracked files are never edited, so a
//! run that is killed leaves nothing to put back.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde::Deserialize;

use xtask::grading::{Outcome, TestRun};
use xtask::metadata::{Exercise, Workbook};
use xtask::render::indented;
use xtask::workspace::Workspace;

/// Where the plants are listed, relative to the repository root.
pub const PLANTS_FILE: &str = "solutions/mistakes.toml";

/// The planted copies' folder, relative to the repository root; the paths
/// `cargo xtask update` writes into `src/exercises.rs` point into it.
pub const PLANTED_DIR: &str = "target/planted";

/// Where the natural mistakes are listed, relative to the repository root.
pub const NATURAL_FILE: &str = "solutions/natural.toml";

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PlantsFile {
    plant: Vec<NamedEntry>,
    #[serde(default)]
    neighbour: Vec<NeighbourEntry>,
}

/// A `[[plant]]`: a mistake of info.toml, which a failure must name.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct NamedEntry {
    exercise: u32,
    mistake: String,
    edits: Vec<(String, String)>,
}

/// A `[[neighbour]]`: a mistake close to named ones whose output no test can
/// tell apart from others', so a failure must name no cause at all.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct NeighbourEntry {
    exercise: u32,
    what: String,
    edits: Vec<(String, String)>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct NaturalFile {
    natural: Vec<NaturalEntry>,
}

/// A `[[natural]]`: a mistake as a learner writes it; `is` names the mistake
/// of info.toml it amounts to, if it amounts to one.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct NaturalEntry {
    exercise: u32,
    what: String,
    #[serde(default)]
    is: Option<String>,
    edits: Vec<(String, String)>,
}

/// One mistake written into a reference solution.
#[derive(Debug)]
pub struct Plant {
    pub exercise: u32,
    kind: PlantKind,
    /// `[old, new]` pairs applied in order; each `old` occurs exactly once.
    pub edits: Vec<(String, String)>,
}

/// What a plant's failures must say.
#[derive(Debug)]
enum PlantKind {
    /// A mistake of info.toml, by its id: a failure must name it.
    Named(String),
    /// A near miss, by what it does: no failure may name any mistake.
    Neighbour(String),
    /// A learner's own mistake, by what it does, and the mistake of
    /// info.toml it amounts to, if any: counted, not required.
    Natural { what: String, is: Option<String> },
}

impl Plant {
    /// Its mistake's id in info.toml; `None` for a neighbour.
    pub fn mistake(&self) -> Option<&str> {
        match &self.kind {
            PlantKind::Named(id) => Some(id),
            PlantKind::Neighbour(_) | PlantKind::Natural { .. } => None,
        }
    }

    /// How verify's messages call it.
    pub fn label(&self) -> String {
        match &self.kind {
            PlantKind::Named(id) => id.clone(),
            PlantKind::Neighbour(what) => format!("neighbour: {what}"),
            PlantKind::Natural { what, .. } => what.clone(),
        }
    }
}

/// Reads the plants, named mistakes and neighbours.
pub fn load(root: &Path) -> Result<Vec<Plant>> {
    let path = root.join(PLANTS_FILE);
    let text = std::fs::read_to_string(&path).with_context(|| format!("cannot read {}", path.display()))?;
    let file = toml::from_str::<PlantsFile>(&text).with_context(|| format!("{PLANTS_FILE} is not valid"))?;
    let named = file.plant.into_iter().map(|p| Plant {
        exercise: p.exercise,
        kind: PlantKind::Named(p.mistake),
        edits: p.edits,
    });
    let neighbours = file.neighbour.into_iter().map(|n| Plant {
        exercise: n.exercise,
        kind: PlantKind::Neighbour(n.what),
        edits: n.edits,
    });
    Ok(named.chain(neighbours).collect())
}

/// Reads the natural mistakes.
pub fn load_natural(root: &Path) -> Result<Vec<Plant>> {
    let path = root.join(NATURAL_FILE);
    let text = std::fs::read_to_string(&path).with_context(|| format!("cannot read {}", path.display()))?;
    let file = toml::from_str::<NaturalFile>(&text).with_context(|| format!("{NATURAL_FILE} is not valid"))?;
    let natural = file.natural.into_iter().map(|n| Plant {
        exercise: n.exercise,
        kind: PlantKind::Natural { what: n.what, is: n.is },
        edits: n.edits,
    });
    Ok(natural.collect())
}

/// What a natural mistake's failures said.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    /// A failure names the mistake it amounts to, and none names another.
    Named,
    /// Tests fail and no failure names any mistake.
    Unnamed,
    /// A failure names a mistake it is not: the id.
    Misleading(String),
    /// Every test passes.
    Passed,
}

/// What `run`'s failures of `exercise` said about natural mistake `plant`.
pub fn classify(exercise: &Exercise, plant: &Plant, run: &TestRun) -> Verdict {
    let is = match &plant.kind {
        PlantKind::Natural { is, .. } => is.as_deref(),
        _ => plant.mistake(),
    };
    let filter = exercise.test_filter();
    let messages: Vec<&str> = run
        .under(&filter)
        .filter(|r| r.outcome == Outcome::Failed)
        .map(|r| r.message.as_deref().unwrap_or(""))
        .collect();
    if messages.is_empty() {
        return Verdict::Passed;
    }
    let named = |text: &str| messages.iter().any(|m| m.contains(text));
    if let Some(other) = exercise.mistakes.iter().find(|m| Some(m.id.as_str()) != is && named(&m.text)) {
        return Verdict::Misleading(other.id.clone());
    }
    match exercise.mistakes.iter().find(|m| Some(m.id.as_str()) == is) {
        Some(own) if named(&own.text) => Verdict::Named,
        _ => Verdict::Unnamed,
    }
}

/// Whether a natural mistake amounts to one of info.toml's; `None` for
/// other plants.
pub fn natural_is(plant: &Plant) -> Option<Option<&str>> {
    match &plant.kind {
        PlantKind::Natural { is, .. } => Some(is.as_deref()),
        _ => None,
    }
}

/// `source` with the plant's edits applied.
pub fn apply(plant: &Plant, source: &str) -> Result<String> {
    let mut planted = source.to_string();
    for (old, new) in &plant.edits {
        match planted.matches(old.as_str()).count() {
            1 => planted = planted.replacen(old.as_str(), new, 1),
            found => bail!(
                "planting `{}` in exercise {}: {old:?} occurs {found} times in the solution, not once",
                plant.label(),
                plant.exercise
            ),
        }
    }
    Ok(planted)
}

/// The mistake outputs exercise `number`'s fixture holds: each `mistake_<rest>`
/// tensor's `<rest>`.
pub fn fixture_outputs(root: &Path, number: u32) -> Vec<String> {
    let path = root.join(format!("tests/fixtures/exercise_{number:02}.safetensors"));
    let names = tensor_names(&path).unwrap_or_default();
    names.into_iter().filter_map(|name| name.strip_prefix("mistake_").map(str::to_string)).collect()
}

/// Whether mistake `id` has one of `outputs` (see [`fixture_outputs`]):
/// `mistake_<id>`, `mistake_<id>_<what>` or `mistake_<id>.<name>`.
pub fn has_fixture_output(outputs: &[String], id: &str) -> bool {
    outputs
        .iter()
        .any(|rest| rest.strip_prefix(id).is_some_and(|after| after.is_empty() || after.starts_with(['_', '.'])))
}

/// The tensor names in a safetensors file's header (8 bytes of length, then JSON).
fn tensor_names(path: &Path) -> Result<Vec<String>> {
    let bytes = std::fs::read(path)?;
    let Some(len) = bytes.get(..8) else { bail!("{} is too short", path.display()) };
    let len = u64::from_le_bytes(len.try_into()?) as usize;
    let Some(header) = bytes.get(8..8 + len) else { bail!("{} has a truncated header", path.display()) };
    let header: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(header)?;
    Ok(header.into_iter().map(|(key, _)| key).filter(|key| key != "__metadata__").collect())
}

/// Groups of plants that can share one build: at most one plant per
/// exercise, and no exercise in a group calls another's code.
pub fn builds<'a>(workbook: &Workbook, plants: &'a [Plant]) -> Vec<Vec<&'a Plant>> {
    let mut builds: Vec<Vec<&Plant>> = Vec::new();
    for plant in plants {
        let fits = |build: &Vec<&Plant>| {
            build.iter().all(|other| {
                other.exercise != plant.exercise
                    && !calls(workbook, other.exercise, plant.exercise)
                    && !calls(workbook, plant.exercise, other.exercise)
            })
        };
        match builds.iter_mut().find(|build| fits(build)) {
            Some(build) => build.push(plant),
            None => builds.push(vec![plant]),
        }
    }
    builds
}

/// Whether exercise `from` calls exercise `to`'s code, directly or not.
fn calls(workbook: &Workbook, from: u32, to: u32) -> bool {
    workbook.chain(from).contains(&to)
}

/// What went wrong with one plant in a run, if anything: a named plant must
/// fail a test that names it and no other of its exercise's mistakes; a
/// neighbour must fail a test that names none of them.
pub fn judge(exercise: &Exercise, plant: &Plant, run: &TestRun) -> Vec<String> {
    let own = match plant.mistake() {
        Some(id) => match exercise.mistakes.iter().find(|m| m.id == id) {
            Some(mistake) => Some(mistake),
            None => return vec![format!("exercise {} lists no mistake `{id}`", exercise.number)],
        },
        None => None,
    };
    let filter = exercise.test_filter();
    let failures: Vec<(&str, &str)> = run
        .under(&filter)
        .filter(|r| r.outcome == Outcome::Failed)
        .map(|r| (r.name.as_str(), r.message.as_deref().unwrap_or("")))
        .collect();
    let mut problems = Vec::new();
    if failures.is_empty() {
        problems.push(format!("planted `{}`: every test of exercise {} passes", plant.label(), exercise.number));
    } else if let Some(own) = own.filter(|own| !failures.iter().any(|(_, message)| message.contains(&own.text))) {
        problems.push(format!(
            "planted `{}`: no failure names it; {} says:\n{}",
            own.id,
            failures[0].0,
            indented(failures[0].1, 6)
        ));
    }
    for other in exercise.mistakes.iter().filter(|m| own.is_none_or(|own| own.id != m.id)) {
        if let Some((name, _)) = failures.iter().find(|(_, message)| message.contains(&other.text)) {
            problems.push(format!("planted `{}`: {name} blames another mistake, `{}`", plant.label(), other.id));
        }
    }
    problems
}

/// The planted copies of one build's solution files, under [`PLANTED_DIR`];
/// dropping it removes them.
pub struct Planted {
    dir: PathBuf,
    /// The exercises whose copy the build compiles in place of the reference.
    pub exercises: Vec<u32>,
}

impl Planted {
    /// Writes each plant into a copy of its exercise's solution file.
    pub fn write(ws: &Workspace, plants: &[&Plant]) -> Result<Self> {
        let dir = ws.root.join(PLANTED_DIR);
        // What an earlier run that was killed left: stale copies are never read, but take room.
        if dir.exists() {
            std::fs::remove_dir_all(&dir).with_context(|| format!("cannot clear {}", dir.display()))?;
        }
        let mut sources: BTreeMap<PathBuf, String> = BTreeMap::new();
        let mut exercises = Vec::new();
        for plant in plants {
            let file = ws.workbook.exercise(plant.exercise)?.solution_file()?;
            let source = match sources.remove(&file) {
                Some(source) => source,
                None => ws.read(&file)?,
            };
            sources.insert(file, apply(plant, &source)?);
            exercises.push(plant.exercise);
        }
        for (file, source) in sources {
            let copy = dir.join(&file);
            std::fs::create_dir_all(copy.parent().expect("a file has a parent"))?;
            std::fs::write(&copy, source).with_context(|| format!("cannot write {}", copy.display()))?;
        }
        exercises.sort_unstable();
        exercises.dedup();
        Ok(Self { dir, exercises })
    }
}

impl Drop for Planted {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use xtask::grading::TestResult;

    fn plant(exercise: u32, mistake: &str, edits: &[(&str, &str)]) -> Plant {
        let edits = edits.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect();
        Plant { exercise, kind: PlantKind::Named(mistake.to_string()), edits }
    }

    /// Exercises 1 and 2 on their own, 3 calling 2's code.
    fn workbook() -> Workbook {
        let exercise = |n: u32, depends: &str| {
            format!(
                "[[exercise]]\nnumber = {n}\ntitle = \"e{n}\"\nphase = 1\nfile = \"exercises/phase1_x/ex0{n}_e.rs\"\n\
                 functions = [\"f{n}\"]\nconcept = \"c\"\ndifficulty = \"d\"\nread = \"r\"\ninsight = \"i\"\n\
                 depends = {depends}\nhint = {{ idea = \"i\", pieces = \"p\", recipe = \"r\" }}\n\
                 chapter = \"phase1/0{n}.md\"\nmistakes = [{{ id = \"typo\", text = \"a typo\" }}, \
                 {{ id = \"slip\", text = \"a slip\" }}]\n"
            )
        };
        let text = format!(
            "format_version = 3\nguide_front = []\n[[phase]]\nnumber = 1\ntitle = \"t\"\nsummary = \"s\"\n\
             overview = {{ title = \"o\", chapter = \"phase1/index.md\" }}\n{}{}{}",
            exercise(1, "[]"),
            exercise(2, "[]"),
            exercise(3, "[2]")
        );
        Workbook::parse(&text).unwrap()
    }

    #[test]
    fn edits_apply_in_order_and_each_must_match_once() {
        let p = plant(1, "typo", &[("a + b", "a - b"), ("- b", "- c")]);
        assert_eq!(apply(&p, "x = a + b;").unwrap(), "x = a - c;");
        let twice = apply(&p, "a + b; a + b").unwrap_err().to_string();
        assert!(twice.contains("occurs 2 times"), "{twice}");
        assert!(apply(&p, "nothing here").is_err());
    }

    #[test]
    fn a_fixture_output_is_the_id_alone_or_followed_by_what_it_is() {
        let outputs = ["decay_all.lm_head.weight", "not_divided_grad_norm", "no_mask"].map(String::from);
        for id in ["decay_all", "not_divided", "no_mask"] {
            assert!(has_fixture_output(&outputs, id), "{id}");
        }
        for id in ["decay_al", "no_mas", "not_cleared"] {
            assert!(!has_fixture_output(&outputs, id), "{id}");
        }
    }

    #[test]
    fn builds_share_only_independent_exercises() {
        let plants = [
            plant(1, "typo", &[]),
            plant(1, "slip", &[]),
            plant(2, "typo", &[]),
            plant(3, "typo", &[]),
            plant(3, "slip", &[]),
        ];
        let builds: Vec<Vec<(u32, &str)>> = builds(&workbook(), &plants)
            .iter()
            .map(|build| build.iter().map(|p| (p.exercise, p.mistake().unwrap_or_default())).collect())
            .collect();
        assert_eq!(builds, [vec![(1, "typo"), (2, "typo")], vec![(1, "slip"), (3, "typo")], vec![(3, "slip")]]);
    }

    #[test]
    fn a_plant_must_fail_a_test_with_its_words_and_blame_nothing_else() {
        let workbook = workbook();
        let exercise = workbook.exercise(1).unwrap();
        let run = |messages: &[&str]| TestRun {
            results: messages
                .iter()
                .enumerate()
                .map(|(i, m)| TestResult {
                    name: format!("exercise_01::t{i}"),
                    outcome: if m.is_empty() { Outcome::Passed } else { Outcome::Failed },
                    message: Some(m.to_string()),
                })
                .collect(),
            finished: true,
            lib_warnings: None,
        };
        let typo = plant(1, "typo", &[]);
        assert!(judge(exercise, &typo, &run(&["", "wrong. Likely cause: a typo."])).is_empty());
        assert!(judge(exercise, &typo, &run(&["", ""]))[0].contains("every test of exercise 1 passes"));
        assert!(judge(exercise, &typo, &run(&["wrong"]))[0].contains("no failure names it"));
        let blamed = judge(exercise, &typo, &run(&["a typo", "Likely cause: a slip"]));
        assert!(blamed.len() == 1 && blamed[0].contains("blames another mistake, `slip`"), "{blamed:?}");
        let neighbour = Plant { exercise: 1, kind: PlantKind::Neighbour("a near miss".into()), edits: vec![] };
        assert!(judge(exercise, &neighbour, &run(&["", "wrong at [2]"])).is_empty());
        assert!(judge(exercise, &neighbour, &run(&[""]))[0].contains("every test of exercise 1 passes"));
        let blamed = judge(exercise, &neighbour, &run(&["wrong. Likely cause: a typo."]));
        assert!(blamed.len() == 1 && blamed[0].contains("blames another mistake, `typo`"), "{blamed:?}");
    }

    #[test]
    fn a_natural_mistake_is_named_unnamed_misleading_or_passes() {
        let workbook = workbook();
        let exercise = workbook.exercise(1).unwrap();
        let run = |message: &str| TestRun {
            results: vec![TestResult {
                name: "exercise_01::t".into(),
                outcome: if message.is_empty() { Outcome::Passed } else { Outcome::Failed },
                message: Some(message.to_string()),
            }],
            finished: true,
            lib_warnings: None,
        };
        let natural = |is: Option<&str>| Plant {
            exercise: 1,
            kind: PlantKind::Natural { what: "a slip of its own".into(), is: is.map(str::to_string) },
            edits: vec![],
        };
        let typo = natural(Some("typo"));
        assert_eq!(classify(exercise, &typo, &run("Likely cause: a typo.")), Verdict::Named);
        assert_eq!(classify(exercise, &typo, &run("wrong at [3]")), Verdict::Unnamed);
        assert_eq!(classify(exercise, &typo, &run("Likely cause: a slip.")), Verdict::Misleading("slip".into()));
        assert_eq!(classify(exercise, &typo, &run("")), Verdict::Passed);
        let other = natural(None);
        assert_eq!(classify(exercise, &other, &run("wrong at [3]")), Verdict::Unnamed);
        assert_eq!(classify(exercise, &other, &run("Likely cause: a typo.")), Verdict::Misleading("typo".into()));
    }
}
