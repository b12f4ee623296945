//! Carrying a learner's work over the workbook's own reorganisations.
//!
//! The exercise files never move, but the machinery they import from did:
//! FSDP went from `crate::fsdp` to `crate::parallel::fsdp`, DDP and the
//! gradient buffer left `crate::train`, the FSDP trainer's step counters
//! moved into one struct, and `Trainer`'s schedule is read from its config. A file finished before that no longer compiles.
//! Every `cargo xtask` command first rewrites those paths in the learner's
//! files (only the paths, never the logic) and says what it changed; the
//! phase `mod.rs` files that used to sit in `exercises/` are removed.
//!
//! The shipped stub now borrows its parameters, so that rustc's warnings
//! reach the learner's code; an exercise still untouched in the old stub gets
//! the new one, so it still counts as not started.
//!
//! Some contracts changed: exercise 8 returns the parameter groups instead
//! of the optimizer; exercise 17's shard update became a function of its
//! own (its stub is added to a file that lacks it, so the file compiles); exercise 22 reads a unit's gradient through
//! `flat_grad`; exercises 20, 23 and 27 record their collectives in
//! autograd's graph instead of writing a block's backward by hand. That is
//! logic, which only the learner can rewrite, so the tool says how for as
//! long as the old function is there.

use std::path::Path;

use anyhow::{Context, Result};

use crate::stub;
use crate::workspace::Workspace;

/// Items that left `crate::train`, and the module each now lives in.
const LEFT_TRAIN: [(&str, &str); 6] = [
    ("Ddp", "parallel::ddp"),
    ("broadcast_parameters", "parallel::ddp"),
    ("DEFAULT_BUCKET_BYTES", "parallel::ddp"),
    ("Gradients", "autograd"),
    ("clip_factor", "autograd"),
    ("sum_of_squares", "autograd"),
];

/// `FsdpTrainer`'s counters, now fields of its `counters`.
const FSDP_COUNTERS: [&str; 3] = ["optimizer_steps", "skipped_steps", "step"];

/// Rewrites the learner's files as described above and reports each change.
pub fn carry_over(ws: &Workspace) -> Result<()> {
    for exercise in &ws.workbook.exercises {
        let path = ws.root.join(&exercise.file);
        let Ok(source) = std::fs::read_to_string(&path) else { continue };
        let renewed = renew_old_stubs(&source, &exercise.fn_names(), &exercise.stub_line());
        if renewed != source {
            std::fs::write(&path, &renewed).with_context(|| format!("cannot write {}", path.display()))?;
        }
        let source = renewed;
        let completed = add_new_functions(ws, exercise, &source)?;
        if completed != source {
            std::fs::write(&path, &completed).with_context(|| format!("cannot write {}", path.display()))?;
        }
        let source = completed;
        let replaced = add_replacing_functions(ws, exercise, &source)?;
        if replaced != source {
            std::fs::write(&path, &replaced).with_context(|| format!("cannot write {}", path.display()))?;
        }
        let source = replaced;
        let migrated = migrate_source(&source);
        if migrated != source {
            std::fs::write(&path, &migrated).with_context(|| format!("cannot write {}", path.display()))?;
            println!(
                "{}: updated to the workbook's new layout: paths (FSDP is in crate::parallel::fsdp, DDP in \
                 crate::parallel::ddp, Gradients in crate::autograd) and fields (self.config.schedule, \
                 FsdpTrainer's self.counters); your logic is unchanged",
                exercise.file.display()
            );
        }
    }
    remove_old_phase_modules(ws)?;
    explain_changed_contracts(ws);
    Ok(())
}

/// `source` with the new stub in every function of `names` whose body is
/// still the old one (only the `todo!` line).
fn renew_old_stubs(source: &str, names: &[&str], stub_line: &str) -> String {
    let mut renewed = source.to_string();
    for name in names {
        let Ok(location) = stub::locate(&renewed, name) else { continue };
        if renewed[location.body.clone()] == stub::old_stub_body(&location.indent, stub_line) {
            let new = stub::stub_body(&location, stub_line);
            renewed.replace_range(location.body, &new);
        }
    }
    renewed
}

/// A function an exercise gained, in the `impl` block opened by `into`.
struct AddedFunction {
    number: u32,
    name: &'static str,
    into: &'static str,
}

/// Exercise 17's shard update became a function of its own, which ZeRO-2 calls.
const ADDED_FUNCTIONS: [AddedFunction; 1] =
    [AddedFunction { number: 17, name: "update_shard", into: "impl ShardedAdamW {\n" }];

/// `source` with the shipped stub of each function its exercise gained and
/// it lacks, so that the file compiles; the learner's code stays as it is.
fn add_new_functions(ws: &Workspace, exercise: &crate::metadata::Exercise, source: &str) -> Result<String> {
    let mut source = source.to_string();
    for added in ADDED_FUNCTIONS.iter().filter(|a| a.number == exercise.number) {
        let reference = ws.read(&exercise.solution_file()?)?;
        if let Some(completed) = with_stub_of(&source, added, &reference, &exercise.stub_line())? {
            source = completed;
            println!(
                "{}: exercise {} gained `{}`; its stub was added to your file, your code is unchanged",
                exercise.file.display(),
                added.number,
                added.name
            );
        }
    }
    Ok(source)
}

/// `source` with `added`'s stub (the signature `reference` gives it) at the
/// top of its `impl` block; `None` when it has the function already, or no
/// such block.
fn with_stub_of(source: &str, added: &AddedFunction, reference: &str, stub_line: &str) -> Result<Option<String>> {
    let Some(at) = source.find(added.into) else { return Ok(None) };
    if stub::locate(source, added.name).is_ok() {
        return Ok(None);
    }
    let location = stub::locate(reference, added.name)?;
    let fn_at = reference[..location.body.start].rfind(&format!("fn {}(", added.name)).unwrap_or(0);
    let line_start = reference[..fn_at].rfind('\n').map_or(0, |i| i + 1);
    let stub = format!(
        "{indent}/// Exercise {number}'s new function: see the docs at the top of this file.\n{signature}{body}}}\n\n",
        indent = location.indent,
        number = added.number,
        signature = &reference[line_start..location.body.start],
        body = stub::stub_body(&location, stub_line),
    );
    let mut completed = source.to_string();
    completed.insert_str(at + added.into.len(), &stub);
    Ok(Some(completed))
}

/// An exercise whose functions were replaced by free functions of another
/// contract: a file still holding the old ones (`old` in its code) and none
/// of the new gets the new functions' stubs, with the imports they need, in
/// a module of their own at its end (`module`, re-exported), so that it
/// compiles; the learner's code stays as it is, and `explanation` says what
/// to move for as long as the new functions are stubs.
struct ReplacedContract {
    number: u32,
    old: &'static str,
    module: &'static str,
    explanation: &'static str,
}

/// Exercise 15 was `impl FsdpTrainer { save_checkpoint, load_checkpoint }`;
/// it became the gather and the cut that every FSDP run's checkpoint uses.
const REPLACED_CONTRACTS: [ReplacedContract; 1] =
    [ReplacedContract { number: 15, old: "impl FsdpTrainer", module: "exercise_15_now", explanation: OLD_EXERCISE_15 }];

/// `source` with the new functions' stubs of its exercise's replaced
/// contract added (see [`ReplacedContract`]), when it needs them.
fn add_replacing_functions(ws: &Workspace, exercise: &crate::metadata::Exercise, source: &str) -> Result<String> {
    let Some(replaced) = REPLACED_CONTRACTS.iter().find(|r| r.number == exercise.number) else {
        return Ok(source.to_string());
    };
    let names = exercise.fn_names();
    if !needs_replacing_stubs(source, replaced, &names) {
        return Ok(source.to_string());
    }
    let reference = ws.read(&exercise.solution_file()?)?;
    let completed = with_replacing_stubs(source, replaced, &reference, &names, &exercise.stub_line())?;
    println!(
        "{}: exercise {} is now {}; their stubs were added at the end of your file (module `{}`), your code is \
         unchanged",
        exercise.file.display(),
        exercise.number,
        names.iter().map(|n| format!("`{n}`")).collect::<Vec<_>>().join(" and "),
        replaced.module
    );
    Ok(completed)
}

/// Whether `source` holds the old contract and none of the new functions.
fn needs_replacing_stubs(source: &str, replaced: &ReplacedContract, names: &[&str]) -> bool {
    code_of(source).contains(replaced.old) && names.iter().all(|name| stub::locate(source, name).is_err())
}

/// `source` followed by `module`, holding the reference's imports and its
/// functions `names` as stubs.
fn with_replacing_stubs(
    source: &str,
    replaced: &ReplacedContract,
    reference: &str,
    names: &[&str],
    stub_line: &str,
) -> Result<String> {
    let code: Vec<&str> = reference.lines().filter(|line| !line.starts_with("//!")).collect();
    let stubs = stub::reset(code.join("\n").trim(), names, stub_line)?;
    let indented: Vec<String> =
        stubs.lines().map(|line| if line.is_empty() { String::new() } else { format!("    {line}") }).collect();
    Ok(format!(
        "{}\n\n// Exercise {number}'s new functions (see `cargo xtask next`): your code above is the old\n\
         // contract, which nothing calls any more.\npub use {module}::{{{exported}}};\n\nmod {module} {{\n{body}\n}}\n",
        source.trim_end(),
        number = replaced.number,
        module = replaced.module,
        exported = names.join(", "),
        body = indented.join("\n"),
    ))
}

/// `source` without its comment lines: the docs may have come over in a
/// pull already, the code tells.
fn code_of(source: &str) -> String {
    source.lines().filter(|l| !l.trim_start().starts_with("//")).collect()
}

/// A contract that changed: exercise `number`'s file still holding the old
/// function (`old`) and not yet the new one (`new`) gets `explanation`.
struct ChangedContract {
    number: u32,
    old: &'static str,
    new: &'static str,
    explanation: &'static str,
}

const CHANGED_CONTRACTS: [ChangedContract; 5] = [
    ChangedContract { number: 8, old: "fn build_optimizer(", new: "fn param_groups(", explanation: OLD_EXERCISE_8 },
    ChangedContract {
        number: 20,
        old: "pub fn forward(&self, pg: &dyn ProcessGroup",
        new: "fn copy_to_tensor_parallel(",
        explanation: OLD_EXERCISE_20,
    },
    ChangedContract { number: 22, old: "unit.whole()", new: "flat_grad(", explanation: OLD_EXERCISE_22 },
    ChangedContract {
        number: 23,
        old: "fn tensor_parallel_step(",
        new: "fn tensor_parallel_block(",
        explanation: OLD_EXERCISE_23,
    },
    ChangedContract {
        number: 27,
        old: "fn sequence_parallel_step(",
        new: "fn sequence_parallel_block(",
        explanation: OLD_EXERCISE_27,
    },
];

fn explain_changed_contracts(ws: &Workspace) {
    for added in &ADDED_FUNCTIONS {
        let Ok(exercise) = ws.workbook.exercise(added.number) else { continue };
        let Ok(source) = ws.read(&exercise.file) else { continue };
        if only_the_added_is_a_stub(&source, added, &exercise.fn_names(), &exercise.stub_line()) {
            println!("{}", added_explanation(added.number).replace("{file}", &exercise.file.display().to_string()));
        }
    }
    for replaced in &REPLACED_CONTRACTS {
        let Ok(exercise) = ws.workbook.exercise(replaced.number) else { continue };
        let Ok(source) = ws.read(&exercise.file) else { continue };
        if code_of(&source).contains(replaced.old)
            && stub::is_stub(&source, &exercise.fn_names(), &exercise.stub_line()).unwrap_or(false)
        {
            println!("{}", replaced.explanation.replace("{file}", &exercise.file.display().to_string()));
        }
    }
    for change in &CHANGED_CONTRACTS {
        let Ok(exercise) = ws.workbook.exercise(change.number) else { continue };
        let Ok(source) = ws.read(&exercise.file) else { continue };
        let code = code_of(&source);
        if code.contains(change.old) && !code.contains(change.new) {
            println!("{}", change.explanation.replace("{file}", &exercise.file.display().to_string()));
        }
    }
}

/// Whether `added` is still its stub while the exercise's other functions are written.
fn only_the_added_is_a_stub(source: &str, added: &AddedFunction, names: &[&str], stub_line: &str) -> bool {
    let others: Vec<&str> = names.iter().copied().filter(|name| *name != added.name).collect();
    stub::is_stub(source, &[added.name], stub_line).unwrap_or(false)
        && !stub::is_stub(source, &others, stub_line).unwrap_or(true)
}

fn added_explanation(number: u32) -> &'static str {
    match number {
        17 => NEW_IN_EXERCISE_17,
        _ => unreachable!("every added function is explained"),
    }
}

const NEW_IN_EXERCISE_17: &str = "\
{file}: exercise 17 has two functions: `update_shard`, AdamW's step of the one
shard a rank owns (the moments of its S elements, kept from step to step), and
`step`, the data-parallel step around it. ZeRO-2 (--strategy zero2) reduces each
micro-batch's gradient itself and then calls `update_shard` alone. Your `step`
is written and `update_shard` is still its stub: move your shard update (the
moments, the step count, the decay and `self.config.update`) into
`update_shard`, and call it from `step`.
Or start the exercise again from its new stub: cargo xtask reset 17
";

const OLD_EXERCISE_8: &str = "\
{file}: exercise 8 now returns the parameter groups, not the optimizer, so that
AdamW and FSDP's sharded optimizer both take them (as torch.optim.AdamW takes a
list of groups). To carry your work over:
  - rename `build_optimizer` to `param_groups` and give it the signature
      pub fn param_groups(params: &ParamStore, weight_decay: f64) -> Vec<ParamGroup>
  - use `weight_decay` where you used `config.weight_decay`;
  - return the two groups you built instead of `AdamW::new(groups, config.adamw)`
    (the trainer calls AdamW::new now), and import `crate::train::ParamGroup`.
Or start the exercise again from its new stub: cargo xtask reset 8
";

const OLD_EXERCISE_15: &str = "\
{file}: exercise 15 is now two functions that every FSDP run's checkpoint
calls, plain --strategy fsdp and FSDP on a device mesh (--pp, --tp) alike:
      pub fn gather_full_state<'a>(units: impl IntoIterator<Item = &'a ShardedUnit>,
          group: &dyn ProcessGroup, with_moments: bool,
          keep: &mut dyn FnMut(WholeParam) -> Result<()>) -> Result<()>
      pub fn shard_full_state(unit: &ShardedUnit, params: &HashMap<String, Tensor>,
          moments: Option<[&HashMap<String, Tensor>; 2]>) -> Result<LocalState>
in place of `impl FsdpTrainer { save_checkpoint, load_checkpoint }`. The trainer
now creates the writer, writes on rank 0, finishes and meets the barrier, and
reads the file and restores the counters. To carry your work over:
  - your save's loop over the units (gather what is sharded, unflatten) goes
    into `gather_full_state`, over `units` and `group`: hand each parameter to
    `keep` as a `WholeParam { name, value, moments }` (moments
    `Some([exp_avg, exp_avg_sq])` when `with_moments`) instead of writing it;
  - your load's cut of one unit (flatten, narrow to the local range, zero
    moments before the first step) goes into `shard_full_state`, returning
    the `LocalState` instead of setting it; the moments arrive by parameter
    name, without the `exp_avg.` prefixes;
  - write both in the `exercise_15_now` module at the end of the file, where
    their stubs are (or move them to the top level and delete the module and
    its `pub use`), then delete your `impl FsdpTrainer` block.
Or start again from the shipped file, discarding yours:
  git checkout origin/main -- {file}
";

const OLD_EXERCISE_20: &str = "\
{file}: exercise 20 now records its collectives in autograd's graph, as
Megatron's f and g operators, so that a split layer is an ordinary module whose
backward candle computes. Your `shard` carries over as it is; `forward` now
takes a `&SharedGroup` and is built from three new functions,
`copy_to_tensor_parallel` (f), `reduce_from_tensor_parallel` (g) and
`TensorParallelMlp::partial` (your forward without its all-reduce). Start from
the new stub and keep your `shard`: cargo xtask reset 20
";

const OLD_EXERCISE_22: &str = "\
{file}: exercise 22's unit now gives each parameter its own variable while it is
gathered (one view per parameter of the flat buffer cost the unit's size per
parameter in backward), so `unit.whole()` is no longer one tensor whose
gradient you read. Where you took `grads.get(...)` of it, take
`unit.flat_grad(&grads)?`: the gradient of the unit's whole flat parameters,
laid out as before, or `None` when the backward reached none of them.
Or start the exercise again from its new stub: cargo xtask reset 22
";

const OLD_EXERCISE_23: &str = "\
{file}: exercise 23 now writes only the block's forward, `tensor_parallel_block`,
from exercise 20's f and g; candle's backward does the rest, so the trainer runs
each block once per micro-batch instead of twice. Your hand-written backward
has no place in it. Start from the new stub: cargo xtask reset 23
";

const OLD_EXERCISE_27: &str = "\
{file}: exercise 27 now writes the two sequence collectives as autograd operators
(`all_gather_tokens`, `reduce_scatter_tokens`) and the block's forward,
`sequence_parallel_block`; candle's backward does the rest. Your hand-written
backward has no place in it. Start from the new stub: cargo xtask reset 27
";

/// The phase folders' `mod.rs` from before `src/exercises.rs` wired the files in.
fn remove_old_phase_modules(ws: &Workspace) -> Result<()> {
    let folders: std::collections::BTreeSet<&Path> =
        ws.workbook.exercises.iter().filter_map(|e| e.file.parent()).collect();
    for folder in folders {
        let old = ws.root.join(folder).join("mod.rs");
        let Ok(text) = std::fs::read_to_string(&old) else { continue };
        if text.contains("#[cfg_attr(feature = \"solutions\", path")
            || text.contains("#[cfg_attr(\n    feature = \"solutions\"")
        {
            std::fs::remove_file(&old).with_context(|| format!("cannot remove {}", old.display()))?;
            println!("{}: removed; src/exercises.rs now wires the exercise files in", folder.join("mod.rs").display());
        }
    }
    Ok(())
}

/// One file's source with the old paths replaced.
pub fn migrate_source(source: &str) -> String {
    let mut out = source.replace("crate::fsdp", "crate::parallel::fsdp");
    for (item, module) in LEFT_TRAIN {
        out = replace_word(&out, &format!("crate::train::{item}"), &format!("crate::{module}::{item}"));
    }
    out = split_train_imports(&out);
    if out.contains("impl Trainer") {
        // The trainer's schedule is kept once, in its config.
        out = replace_word(&out, "self.schedule", "self.config.schedule");
    }
    if out.contains("impl FsdpTrainer") {
        for counter in FSDP_COUNTERS {
            out = replace_word(&out, &format!("self.{counter}"), &format!("self.counters.{counter}"));
        }
    }
    out
}

/// `use crate::train::{A, Ddp, B};` becomes `use crate::parallel::ddp::Ddp;`
/// and `use crate::train::{A, B};`.
fn split_train_imports(source: &str) -> String {
    const PREFIX: &str = "use crate::train::{";
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(start) = rest.find(PREFIX) {
        let Some(close) = rest[start..].find("};") else { break };
        let list = &rest[start + PREFIX.len()..start + close];
        if list.contains(['{', ':']) {
            // A nested list: leave it for the compiler to point at.
            out.push_str(&rest[..start + close + 2]);
            rest = &rest[start + close + 2..];
            continue;
        }
        let items: Vec<&str> = list.split(',').map(str::trim).filter(|i| !i.is_empty()).collect();
        let moved = |item: &str| LEFT_TRAIN.iter().find(|(name, _)| *name == item).map(|(_, module)| *module);
        let mut lines = vec![];
        for (item, module) in items.iter().filter_map(|i| moved(i).map(|m| (*i, m))) {
            lines.push(format!("use crate::{module}::{item};"));
        }
        let kept: Vec<&str> = items.iter().copied().filter(|i| moved(i).is_none()).collect();
        match kept.as_slice() {
            [] => {}
            [one] => lines.push(format!("use crate::train::{one};")),
            many => lines.push(format!("use crate::train::{{{}}};", many.join(", "))),
        }
        let indent = &rest[..start][rest[..start].rfind('\n').map_or(0, |n| n + 1)..];
        out.push_str(&rest[..start]);
        out.push_str(&lines.join(&format!("\n{indent}")));
        rest = &rest[start + close + 2..];
    }
    out.push_str(rest);
    out
}

/// Replaces `from` where it is not followed by an identifier character.
fn replace_word(source: &str, from: &str, to: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(at) = rest.find(from) {
        let after = &rest[at + from.len()..];
        let whole = !after.starts_with(|c: char| c.is_alphanumeric() || c == '_');
        out.push_str(&rest[..at]);
        out.push_str(if whole { to } else { from });
        rest = after;
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workspace::files_under;

    #[test]
    fn moves_the_imports_of_a_finished_exercise_10() {
        let before =
            "use candle_core::{bail, Result, Tensor};\n\nuse crate::train::{Gradients, StepStats, Trainer};\n\n\
                      impl Trainer {\n    fn f(&self) { let g = crate::train::Gradients::default(); self.schedule.lr(self.step); }\n}\n";
        let after = migrate_source(before);
        assert_eq!(
            after,
            "use candle_core::{bail, Result, Tensor};\n\nuse crate::autograd::Gradients;\nuse crate::train::{StepStats, Trainer};\n\n\
             impl Trainer {\n    fn f(&self) { let g = crate::autograd::Gradients::default(); self.config.schedule.lr(self.step); }\n}\n"
        );
        assert_eq!(migrate_source(&after), after, "migrating twice changes nothing");
    }

    #[test]
    fn moves_fsdp_paths_and_counters_only_in_fsdp_trainer_files() {
        let before = "use crate::fsdp::{FsdpTrainer, LocalState};\nuse crate::train::Ddp;\n\
                      impl FsdpTrainer {\n    fn f(&self) -> bool { self.optimizer_steps > 0 && self.step > 1 && self.steps_x }\n}\n";
        assert_eq!(
            migrate_source(before),
            "use crate::parallel::fsdp::{FsdpTrainer, LocalState};\nuse crate::parallel::ddp::Ddp;\n\
             impl FsdpTrainer {\n    fn f(&self) -> bool { self.counters.optimizer_steps > 0 && self.counters.step > 1 && self.steps_x }\n}\n"
        );
    }

    #[test]
    fn an_untouched_old_stub_gets_the_new_one_and_written_code_is_kept() {
        let line = "todo!(\"Exercise 1: x\")";
        let old = format!("fn f(x: u8) -> u8 {{\n    {line}\n}}\nfn g(y: u8) -> u8 {{\n    y\n}}\n");
        let renewed = renew_old_stubs(&old, &["f", "g"], line);
        assert_eq!(
            renewed,
            format!("fn f(x: u8) -> u8 {{\n    let _ = &x;\n    {line}\n}}\nfn g(y: u8) -> u8 {{\n    y\n}}\n")
        );
        assert_eq!(renew_old_stubs(&renewed, &["f", "g"], line), renewed, "renewing twice changes nothing");
    }

    #[test]
    fn each_changed_contract_is_told_apart_by_the_shipped_stub() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        let workbook = crate::metadata::Workbook::load(root).unwrap();
        for change in &CHANGED_CONTRACTS {
            let stub = std::fs::read_to_string(root.join(&workbook.exercise(change.number).unwrap().file)).unwrap();
            let code: String = stub.lines().filter(|l| !l.trim_start().starts_with("//")).collect();
            assert!(
                !code.contains(change.old) && (code.contains(change.new) || stub.contains(change.new)),
                "exercise {}'s stub must hold `{}` and not `{}`",
                change.number,
                change.new,
                change.old
            );
            assert!(change.explanation.contains(&format!("cargo xtask reset {}", change.number)));
        }
    }

    /// A learner who finished exercise 17 before `update_shard` existed: the
    /// stub is added, their `step` is kept, and the explanation is due.
    #[test]
    fn a_finished_exercise_17_gains_the_stub_of_update_shard() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        let workbook = crate::metadata::Workbook::load(root).unwrap();
        let exercise = workbook.exercise(17).unwrap();
        let reference = std::fs::read_to_string(root.join(exercise.solution_file().unwrap())).unwrap();
        let old_step = "    pub fn step(&mut self, lr: f64) -> Result<Tensor> {\n        self.mine(lr)\n    }\n";
        let finished = format!("use x;\n\nimpl ShardedAdamW {{\n{old_step}}}\n");
        let added = &ADDED_FUNCTIONS[0];
        let (names, line) = (exercise.fn_names(), exercise.stub_line());
        let completed = with_stub_of(&finished, added, &reference, &line).unwrap().expect("the stub is added");
        assert!(completed.contains(old_step), "the learner's step is kept:\n{completed}");
        assert!(completed.contains("pub fn update_shard(&mut self, param_shard: &Tensor"), "{completed}");
        assert!(only_the_added_is_a_stub(&completed, added, &names, &line), "{completed}");
        assert!(syn::parse_file(&completed).is_ok(), "it parses:\n{completed}");
        assert_eq!(with_stub_of(&completed, added, &reference, &line).unwrap(), None, "added once");
        let shipped = std::fs::read_to_string(root.join(&exercise.file)).unwrap();
        assert!(!only_the_added_is_a_stub(&shipped, added, &names, &line), "a fresh stub is not told to move code");
        assert!(NEW_IN_EXERCISE_17.contains("cargo xtask reset 17"));
    }

    /// The last release with exercise 15's old contract.
    const OLD_CONTRACT_15: &str = "babf53e7ad5e3f2d5600560d5c5d6359eee13296";

    /// A learner who finished exercise 15 as `impl FsdpTrainer { save_checkpoint,
    /// load_checkpoint }` (the old reference stands in for their work): the
    /// new functions' stubs are added after their code, which stays, the file
    /// parses, the exercise counts as not started, and the note is due.
    #[test]
    fn a_finished_old_exercise_15_gains_the_new_functions_as_stubs() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        let workbook = crate::metadata::Workbook::load(root).unwrap();
        let exercise = workbook.exercise(15).unwrap();
        let old_file = |path: &str| {
            let shown = std::process::Command::new("git")
                .args(["show", &format!("{OLD_CONTRACT_15}:{path}")])
                .current_dir(root)
                .output()
                .expect("git runs");
            assert!(shown.status.success(), "this test needs the repository's history back to {OLD_CONTRACT_15}");
            String::from_utf8(shown.stdout).unwrap()
        };
        let finished = old_file("solutions/phase3_fsdp/ex15_fsdp_checkpoint.rs");
        let replaced = &REPLACED_CONTRACTS[0];
        let (names, line) = (exercise.fn_names(), exercise.stub_line());
        assert!(needs_replacing_stubs(&finished, replaced, &names));
        let reference = std::fs::read_to_string(root.join(exercise.solution_file().unwrap())).unwrap();
        let completed = with_replacing_stubs(&finished, replaced, &reference, &names, &line).unwrap();
        assert!(completed.starts_with(finished.trim_end()), "the learner's code is kept:\n{completed}");
        assert!(syn::parse_file(&completed).is_ok(), "it parses:\n{completed}");
        assert!(stub::is_stub(&completed, &names, &line).unwrap(), "the new functions are stubs:\n{completed}");
        assert!(!needs_replacing_stubs(&completed, replaced, &names), "added once");
        // The old stub, untouched, needs them as much: it would not compile either.
        assert!(needs_replacing_stubs(&old_file(exercise.file.to_str().unwrap()), replaced, &names));
        let shipped = std::fs::read_to_string(root.join(&exercise.file)).unwrap();
        assert!(!needs_replacing_stubs(&shipped, replaced, &names), "today's stub is left alone");
        // The note quotes today's signatures.
        let squeezed = |text: &str| text.split_whitespace().collect::<String>().replace(",)", ")");
        for name in &names {
            let location = stub::locate(&shipped, name).unwrap();
            let fn_at = shipped[..location.body.start].rfind(&format!("pub fn {name}")).unwrap();
            let signature = squeezed(&shipped[fn_at..location.body.start - 1]);
            assert!(squeezed(OLD_EXERCISE_15).contains(&signature), "the note quotes `{signature}`");
        }
    }

    #[test]
    fn the_old_exercise_8_is_explained() {
        assert!(
            OLD_EXERCISE_8.contains("pub fn param_groups(params: &ParamStore, weight_decay: f64) -> Vec<ParamGroup>")
        );
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        let stub = std::fs::read_to_string(root.join("exercises/phase2_training/ex08_optimizer_groups.rs")).unwrap();
        assert!(
            stub.contains("pub fn param_groups(params: &ParamStore, weight_decay: f64) -> Vec<ParamGroup>"),
            "the note quotes the stub's signature"
        );
    }

    /// The release a learner may have cloned before the exercises' docs were
    /// last rewritten (the functions' signatures are today's).
    const DOCS_BASE: &str = "e276eb246327356a8f171cff4932be9181017df2";

    /// `source` with each function in `names` given its body from `from`.
    fn with_bodies_of(source: &str, from: &str, names: &[&str]) -> String {
        names.iter().fold(source.to_string(), |source, name| {
            let (here, there) = (stub::locate(&source, name).unwrap(), stub::locate(from, name).unwrap());
            format!("{}{}{}", &source[..here.body.start], &from[there.body], &source[here.body.end..])
        })
    }

    /// What `git pull` does to one file: today's changes merged over the
    /// learner's, both from `base`. `None` when they conflict.
    fn merge(scratch: &Path, learners: &str, base: &str, today: &str) -> Option<String> {
        for (name, text) in [("learners", learners), ("base", base), ("today", today)] {
            std::fs::write(scratch.join(name), text).unwrap();
        }
        let merged = std::process::Command::new("git")
            .args(["merge-file", "-p", "learners", "base", "today"])
            .current_dir(scratch)
            .output()
            .expect("git runs");
        merged.status.success().then(|| String::from_utf8(merged.stdout).unwrap())
    }

    /// A learner who cloned at `DOCS_BASE` and finished every exercise (the
    /// reference bodies stand in for their work) commits and pulls: every
    /// file whose contract did not change since merges without a conflict,
    /// with today's docs and their bodies.
    #[test]
    fn a_pull_brings_the_new_docs_over_finished_exercises() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        let workbook = crate::metadata::Workbook::load(root).unwrap();
        let scratch = std::env::temp_dir().join(format!("workbook-pull-{}", std::process::id()));
        std::fs::create_dir_all(&scratch).unwrap();
        let git_show = |what: &str| {
            let shown = std::process::Command::new("git").args(["show", what]).current_dir(root).output();
            let shown = shown.expect("git runs");
            shown.status.success().then(|| String::from_utf8(shown.stdout).unwrap())
        };
        assert!(git_show(DOCS_BASE).is_some(), "this test needs the repository's history back to {DOCS_BASE}");
        for exercise in &workbook.exercises {
            let file = exercise.file.to_str().unwrap();
            // An exercise added since arrives whole: nothing of the learner's to merge.
            let Some(base) = git_show(&format!("{DOCS_BASE}:{file}")) else { continue };
            // A contract changed since conflicts by design: the tool explains it.
            if CHANGED_CONTRACTS.iter().any(|c| c.number == exercise.number && base.contains(c.old))
                || REPLACED_CONTRACTS.iter().any(|r| r.number == exercise.number && base.contains(r.old))
            {
                continue;
            }
            // So does a function added since: the tool adds its stub.
            let added_since = |a: &AddedFunction| a.number == exercise.number && stub::locate(&base, a.name).is_err();
            if ADDED_FUNCTIONS.iter().any(added_since) {
                continue;
            }
            let names = exercise.fn_names();
            let reference = std::fs::read_to_string(root.join(exercise.solution_file().unwrap())).unwrap();
            let finished = with_bodies_of(&base, &reference, &names);
            let today = std::fs::read_to_string(root.join(file)).unwrap();
            let merged = merge(&scratch, &finished, &base, &today)
                .unwrap_or_else(|| panic!("{file}: today's docs conflict with a finished exercise"));
            assert_eq!(stub::reset(&merged, &names, &exercise.stub_line()).unwrap(), today, "{file}: today's docs");
            assert_eq!(with_bodies_of(&merged, &finished, &names), merged, "{file}: the learner's bodies");
        }
        std::fs::remove_dir_all(&scratch).ok();
    }

    #[test]
    fn leaves_current_files_alone() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        for folder in ["exercises", "solutions"] {
            for file in files_under(root, Path::new(folder)).iter().filter(|f| f.extension().is_some_and(|e| e == "rs"))
            {
                let source = std::fs::read_to_string(root.join(file)).unwrap();
                assert_eq!(migrate_source(&source), source, "{}", file.display());
            }
        }
    }
}
