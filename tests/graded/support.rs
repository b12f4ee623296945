//! Shared helpers: loading fixtures and comparing tensors with messages that
//! say what is probably wrong.

use std::backtrace::Backtrace;
use std::collections::HashMap;
use std::io::Write;
use std::panic::PanicHookInfo;
use std::path::Path;
use std::sync::{Mutex, Once, OnceLock};

use candle_core::backprop::GradStore;
use candle_core::{DType, Device, Tensor};

use crate::process_ranks::RANK_OF;

/// Failures read like `cargo xtask check`, one short block per failing case:
/// - a graded failure prints its message alone; an unfinished stub, where it
///   is and, when it is another exercise's, which one blocks the check;
/// - any other panic (an overflow, an index out of bounds in the code under
///   test) prints where in the workbook's own files it happened and its
///   message on one line, with the rank inside a multi-rank test. With
///   `RUST_BACKTRACE=1` it adds the backtrace, cut to the workbook's frames.
///   Each failing test shows its own: libtest prints a test's output under
///   its name, so what one test printed is not seen with another. Within
///   one test the same panic again (another rank's) prints nothing more.
///
/// candle folds a backtrace into every error when backtraces are on
/// (`RUST_LIB_BACKTRACE=1`, set here unless it is set already): every message
/// drops it again, and says instead where in `exercises/` the error was
/// raised, when it was raised there.
/// Inside a rank, a graded or unfinished panic prints nothing: `spawn` reports
/// it as the test's failure, so it is said once.
#[ctor::ctor(unsafe)]
fn readable_failures() {
    if std::env::var_os("RUST_LIB_BACKTRACE").is_none() {
        // Before main: no other thread reads the environment yet.
        std::env::set_var("RUST_LIB_BACKTRACE", "1");
    }
    std::panic::set_hook(Box::new(|info| {
        let message = without_backtrace(&panic_message(info));
        let graded = info.location().is_some_and(|at| at.file().replace('\\', "/").starts_with("tests/graded/"));
        let unfinished = message.starts_with("not yet implemented");
        let thread = std::thread::current();
        let (rank, test) = whose_thread(thread.name());
        match (graded || unfinished, rank) {
            (false, rank) => report_other_panic(info, &message, rank, test),
            (true, Some(_)) => {}
            (true, None) if unfinished => {
                let at = info.location().map(|at| at.to_string()).unwrap_or_default();
                eprintln!("{}: {message}", workbook_file(&at).unwrap_or(at));
                blocked_note(&message).inspect(|note| eprintln!("{note}"));
            }
            (true, None) => {
                eprintln!("{message}");
                blocked_note(&message).inspect(|note| eprintln!("{note}"));
            }
        }
    }));
}

/// The rank and the test a thread belongs to, from its name: libtest names
/// a test's thread after the test, and `spawn` names a rank's thread
/// `rank-R of TEST` after the thread that started it.
fn whose_thread(name: Option<&str>) -> (Option<&str>, &str) {
    let name = name.unwrap_or_default();
    match name.strip_prefix("rank-") {
        Some(rank) => match rank.split_once(" of ") {
            Some((rank, test)) => (Some(rank), test),
            None => (Some(rank), ""),
        },
        None => (None, name),
    }
}

/// One line for a panic that is not a verdict: where and what, and with
/// `RUST_BACKTRACE=1` the workbook's frames, once per test (see [`readable_failures`]).
fn report_other_panic(info: &PanicHookInfo, message: &str, rank: Option<&str>, test: &str) {
    static PRINTED: Mutex<Vec<(String, String)>> = Mutex::new(Vec::new());
    let wants_backtrace = matches!(std::env::var("RUST_BACKTRACE").as_deref(), Ok("1" | "full"));
    let here = info.location().and_then(|at| workbook_file(&at.to_string()));
    let backtrace = (here.is_none() || wants_backtrace).then(|| Backtrace::force_capture().to_string());
    let frames = backtrace.as_deref().map(workbook_frames).unwrap_or_default();
    let at = here
        .or_else(|| frames.first().map(|(_, at)| at.clone()))
        .or_else(|| info.location().map(|at| at.to_string()))
        .unwrap_or_default();
    let line = format!("{at}: {message}");
    let key = (test.to_string(), line.clone());
    let first_in_test = {
        let mut printed = PRINTED.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let first = !printed.contains(&key);
        if first {
            printed.push(key);
        }
        first
    };
    if !first_in_test {
        return;
    }
    eprintln!("{}{line}", rank.map(|r| format!("rank {r}: ")).unwrap_or_default());
    if wants_backtrace {
        eprintln!("{}", frames_report(&frames));
    }
}

/// The workbook's frames of a backtrace for a failure, innermost first, out
/// to the first in the tests (the test, or the helper of the tests that
/// called the code under test): what lies beyond is the tests' plumbing.
/// One line each, the place first, with no `at ` to start it, which
/// [`without_backtrace`] would take for a backtrace's and drop (a rank's
/// output passes through it).
fn frames_report(frames: &[(String, String)]) -> String {
    let out_to_the_test = match frames.iter().position(|(_, at)| at.starts_with("tests/")) {
        Some(test) => &frames[..=test],
        None => frames,
    };
    if out_to_the_test.is_empty() {
        return "backtrace: none of its frames is in the workbook's files".into();
    }
    let lines: Vec<String> = out_to_the_test.iter().map(|(function, at)| format!("  {at} in {function}")).collect();
    format!("backtrace, the workbook's frames only:\n{}", lines.join("\n"))
}

/// The folders of the workbook's own source files, relative to its root.
const WORKBOOK_DIRS: [&str; 5] = ["exercises/", "solutions/", "src/", "tests/", "kernels/"];

/// `path`, a source path as a panic or a backtrace prints it (with or
/// without `:line:column`), relative to the workbook's root when it is one
/// of the workbook's own files; `None` for std's and other crates'.
///
/// A panic prints the path rustc was given, relative to the root
/// (`src/../exercises/…`); a backtrace prints it absolute, or from the
/// current directory (`./graded/…`, the tests' package) when it lies below it.
fn workbook_file(path: &str) -> Option<String> {
    let path = path.replace('\\', "/");
    let root = repository_root().to_string_lossy().replace('\\', "/");
    let absolute = match path.strip_prefix("./") {
        Some(below) => format!("{}/{below}", std::env::current_dir().ok()?.to_string_lossy().replace('\\', "/")),
        None if path.starts_with('/') || path.get(1..3) == Some(":/") => path,
        None => format!("{root}/{path}"),
    };
    let relative = lexically_normal(&absolute).strip_prefix(&format!("{}/", lexically_normal(&root)))?.to_string();
    // A C library's frame may also print `./` and a path of its own build (`./nptl/…`).
    let file = relative.split(':').next().unwrap_or_default();
    let ours = WORKBOOK_DIRS.iter().any(|dir| relative.starts_with(dir)) && repository_root().join(file).is_file();
    ours.then_some(relative)
}

/// A `/`-separated path without its `.` parts, each `..` cancelling the part before it.
fn lexically_normal(path: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for part in path.split('/') {
        match part {
            "." => {}
            ".." if parts.last().is_some_and(|last| !last.is_empty() && *last != "..") => drop(parts.pop()),
            _ => parts.push(part),
        }
    }
    parts.join("/")
}

/// The frames of a printed backtrace that lie in the workbook's files, as
/// (function, path:line:column from the root), innermost first. A panic's
/// backtrace holds this hook's frames too, above std's marker
/// `__rust_end_short_backtrace`: they are left out.
fn workbook_frames(backtrace: &str) -> Vec<(String, String)> {
    let lines: Vec<&str> = backtrace.lines().map(str::trim).collect();
    let function = |line: &str| line.split_once(": ").map_or(line, |(_, name)| name).to_string();
    let start = lines.iter().position(|line| line.contains("__rust_end_short_backtrace")).map_or(0, |i| i + 1);
    let hook = ["report_other_panic", "readable_failures"];
    let mut frames = Vec::new();
    for pair in lines[start..].windows(2) {
        let Some(at) = pair[1].strip_prefix("at ") else { continue };
        let Some(at) = workbook_file(at).filter(|_| !pair[0].starts_with("at ")) else { continue };
        let function = short_name(&function(pair[0]));
        if !hook.iter().any(|name| function.contains(name)) {
            frames.push((function, at));
        }
    }
    frames
}

/// A function's name without its generic arguments (`run_rank<(u64, …)>` is
/// `run_rank`); a trait method's (`<A as B>::f`) stays whole.
fn short_name(function: &str) -> String {
    match function.starts_with('<') {
        true => function.to_string(),
        false => function.split('<').next().unwrap_or(function).to_string(),
    }
}

/// `text` (a message that may hold a candle error with its backtrace)
/// without the backtrace, and with the first place in an exercise's body
/// (`exercises/`, or `solutions/` when the reference runs) the error passed
/// through, when there is one.
pub fn without_backtrace(text: &str) -> String {
    let is_backtrace = |line: &str| {
        let line = line.trim_start();
        line.starts_with("at ")
            || line.starts_with("note: Some details are omitted")
            || line.split_once(": ").is_some_and(|(n, _)| n.parse::<usize>().is_ok())
    };
    let message: Vec<&str> = text.lines().filter(|line| !is_backtrace(line) && !line.trim().is_empty()).collect();
    let raised_at = workbook_frames(text)
        .into_iter()
        .map(|(_, at)| at)
        .find(|at| at.starts_with("exercises/") || at.starts_with("solutions/"));
    match raised_at {
        Some(at) if message.len() < text.lines().count() => format!("{}\n  (raised in {at})", message.join("\n")),
        _ => message.join("\n"),
    }
}

/// When a test of one exercise stops in another's `todo!`: which one blocks
/// it and how to go on (the `todo!`'s own hint is for the other exercise).
fn blocked_note(message: &str) -> Option<String> {
    let test = std::thread::current().name()?.to_string();
    let graded: u32 = test.strip_prefix("exercise_")?.get(..2)?.parse().ok()?;
    let blocker: u32 = message.split("not yet implemented: Exercise ").nth(1)?.split(':').next()?.parse().ok()?;
    (blocker != graded).then(|| {
        format!(
            "This check of exercise {graded} calls exercise {blocker}, not done yet: do exercise {blocker} first, or \
             run its reference body with `cargo xtask lean {blocker}`."
        )
    })
}

/// A note before any test runs, and again after libtest's last line, when
/// the tests asked for grade an exercise the learner leans on (`cargo xtask
/// lean`): its reference body is compiled in place of theirs. Said again
/// because libtest's summary ("test result: ok") would otherwise be the last
/// word, read as the learner's code passing. Asked for an exercise whose
/// file does not parse, the run stops with an error before any test. A rank
/// says nothing: its test's process does.
#[ctor::ctor(unsafe)]
fn say_which_bodies_run() {
    if std::env::var_os(RANK_OF).is_some() {
        return;
    }
    let asked: Vec<String> = std::env::args().skip(1).filter(|arg| !arg.starts_with('-')).collect();
    let is_asked = |number: u32| asked.iter().any(|arg| arg.starts_with(&format!("exercise_{number:02}")));
    let leaned =
        workbook::exercise_bodies::REFERENCE.iter().filter(|&&n| cfg!(not(feature = "solutions")) && is_asked(n));
    let leaned = leaned.map(|number| {
        format!(
            "note: exercise {number} is leaned on (exercises/lean.txt): these checks grade its reference body, not \
             your code; `cargo xtask lean --off {number}` grades yours."
        )
    });
    for note in leaned {
        eprintln!("{note}");
        say_again_at_exit(note);
    }
    // Its checks would pass on the reference and read as the learner's code
    // passing: the run fails instead, as a build of the file itself would.
    let unparsable: Vec<String> = workbook::exercise_bodies::UNPARSABLE
        .iter()
        .filter(|(number, _)| is_asked(*number))
        .map(|(number, sentence)| format!("error: {sentence}: exercise {number}'s checks cannot grade your code"))
        .collect();
    if !unparsable.is_empty() {
        unparsable.iter().for_each(|line| eprintln!("{line}"));
        std::process::exit(1);
    }
}

/// The lines [`say_again_at_exit`] keeps.
static SAID_AT_EXIT: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// Prints `line` on stderr once more when the process exits, after all that
/// libtest prints. libtest returns from `main` when every test passes, and
/// calls `std::process::exit` when one fails. The C runtime runs the
/// handlers registered with `atexit` once `main` returns, and on Unix within
/// `exit` too: a green run, the one that could mislead, always ends with
/// them. A test's own output could not do this: libtest shows it only when
/// the test fails, and before its summary.
pub fn say_again_at_exit(line: String) {
    static REGISTERED: Once = Once::new();
    REGISTERED.call_once(|| {
        extern "C" fn say_them() {
            let lines = SAID_AT_EXIT.lock().unwrap_or_else(|e| e.into_inner());
            // Not `eprintln!`: a closed stderr must not panic in a C callback.
            lines.iter().for_each(|line| drop(writeln!(std::io::stderr(), "{line}")));
        }
        // SAFETY: `say_them` is a plain function, there for the program's whole life.
        unsafe { libc::atexit(say_them) };
    });
    SAID_AT_EXIT.lock().unwrap_or_else(|e| e.into_inner()).push(line);
}

fn panic_message(info: &PanicHookInfo) -> String {
    let payload = info.payload();
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_default()
}

/// An absolute and a relative tolerance: `|got - want| <= atol + rtol * |want|`.
#[derive(Clone, Copy, Debug)]
pub struct Tol {
    pub atol: f32,
    pub rtol: f32,
}

/// Float32 arithmetic done in a different order than PyTorch's.
pub const F32: Tol = Tol { atol: 1e-5, rtol: 1e-4 };
/// A bf16 result: 8 bits of mantissa, so about 0.4% per rounding.
pub const BF16: Tol = Tol { atol: 2e-2, rtol: 2e-2 };

/// The workbook's root, where `exercises/`, `tests/` and `datasets/` are
/// (this package is `tests/`).
pub fn repository_root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("the tests package sits in the workbook's root")
}

/// The words of exercise `exercise`'s typical mistake `id`, from
/// `exercises/info.toml`: the one place a mistake is described. Its fixture
/// output, where it has one, is `mistake_<id>` (see [`Fixture::mistakes`]).
pub fn mistake(exercise: u32, id: &str) -> &'static str {
    static MISTAKES: OnceLock<HashMap<(u32, String), String>> = OnceLock::new();
    let all = MISTAKES.get_or_init(|| {
        let path = repository_root().join("exercises/info.toml");
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
        let info: toml::Table = text.parse().unwrap_or_else(|e| panic!("{} is not valid TOML: {e}", path.display()));
        let mut all = HashMap::new();
        for exercise in info["exercise"].as_array().expect("[[exercise]] entries") {
            let number = exercise["number"].as_integer().expect("an exercise number") as u32;
            for m in exercise["mistakes"].as_array().expect("a mistakes list") {
                let field = |key: &str| m[key].as_str().expect("each mistake has an id and a text").to_string();
                all.insert((number, field("id")), field("text"));
            }
        }
        all
    });
    match all.get(&(exercise, id.to_string())) {
        Some(text) => text,
        None => panic!("exercises/info.toml lists no mistake `{id}` for exercise {exercise}"),
    }
}

/// The tensors of `tests/fixtures/exercise_NN.safetensors`.
pub struct Fixture {
    exercise: u32,
    name: String,
    tensors: HashMap<String, Tensor>,
}

pub fn fixture(exercise: u32) -> Fixture {
    let name = format!("exercise_{exercise:02}.safetensors");
    let path = repository_root().join("tests/fixtures").join(&name);
    let tensors = candle_core::safetensors::load(&path, &Device::Cpu).unwrap_or_else(|e| {
        panic!(
            "cannot read the fixture {}: {e}\nIt ships with the workbook; restore it with `git checkout tests/fixtures`.",
            path.display()
        )
    });
    Fixture { exercise, name, tensors }
}

impl Fixture {
    pub fn get(&self, key: &str) -> Tensor {
        match self.tensors.get(key) {
            Some(t) => t.clone(),
            None => panic!("fixture {} has no tensor `{key}`", self.name),
        }
    }

    /// Each mistake of `ids` with what it outputs here (`mistake_<id>`), for
    /// [`expect_close`] to recognise.
    pub fn mistakes(&self, ids: &[&str]) -> Vec<(&'static str, Tensor)> {
        ids.iter().map(|id| (mistake(self.exercise, id), self.get(&format!("mistake_{id}")))).collect()
    }

    /// As [`Fixture::mistakes`], for the output named `what` (`mistake_<id>_<what>`).
    pub fn mistakes_of(&self, what: &str, ids: &[&str]) -> Vec<(&'static str, Tensor)> {
        ids.iter().map(|id| (mistake(self.exercise, id), self.get(&format!("mistake_{id}_{what}")))).collect()
    }

    /// The model of a fixture whose `config` tensor holds [V, C, L, H, I, T, ...]
    /// (RoPE base 10000, RMSNorm eps 1e-5, no biases, as in generate.py).
    pub fn model_config(&self) -> workbook::GptConfig {
        let c: Vec<usize> = self.get("config").to_vec1::<f32>().unwrap().iter().map(|&x| x as usize).collect();
        workbook::GptConfig {
            vocab_size: c[0],
            hidden_size: c[1],
            num_layers: c[2],
            num_heads: c[3],
            num_kv_heads: None,
            intermediate_size: c[4],
            max_seq_len: c[5],
            rope_theta: 10_000.0,
            norm_eps: 1e-5,
            bias: false,
            tie_word_embeddings: false,
        }
    }

    /// A one-element tensor as a number.
    pub fn scalar(&self, key: &str) -> f64 {
        scalar(&self.get(key))
    }
}

pub fn scalar(t: &Tensor) -> f64 {
    let values = values(t);
    assert_eq!(values.len(), 1, "expected a single number, got a tensor of shape {:?}", t.dims());
    values[0] as f64
}

/// Unwraps the result of the learner's code, turning an error into a readable failure.
pub fn ok<T>(result: candle_core::Result<T>, call: &str) -> T {
    result.unwrap_or_else(|e| panic!("{call} returned an error:\n  {}", explain_error(&e)))
}

/// A candle error as a learner can act on it: without the backtrace candle
/// attaches under `RUST_BACKTRACE=1`, and with the rule the common ones
/// break (the rule of the op that failed, never a guess at the cause).
pub fn explain_error(e: &candle_core::Error) -> String {
    let text = e.to_string();
    let message = without_backtrace(&text);
    let rule = narrow_out_of_range(&text).or_else(|| rule_broken(&text).map(str::to_string));
    let meaning = rule.map(|rule| format!("\n  That is: {rule}.")).unwrap_or_default();
    format!("{}{meaning}", message.replace('\n', "\n  "))
}

/// The rule behind a common candle error, for the op the error names.
fn rule_broken(text: &str) -> Option<&'static str> {
    // The element-wise ops that need equal shapes; candle names the op in its error.
    let same_shape = ["add", "sub", "mul", "div", "maximum", "minimum"];
    if same_shape.iter().any(|op| text.contains(&format!("shape mismatch in {op},"))) {
        return Some(match operand_shapes(text).is_some_and(|(lhs, rhs)| broadcastable(&lhs, &rhs)) {
            true => {
                "candle never broadcasts implicitly: combine tensors of different shapes with \
                 broadcast_mul / broadcast_add / broadcast_sub / broadcast_div"
            }
            false => {
                "the two shapes differ, and would not broadcast either: lined up from their last dimension, \
                 each pair of sizes must be equal or one of them 1"
            }
        });
    }
    let rules = [
        (
            "shape mismatch in matmul",
            "matmul multiplies (..., m, k) by (..., k, n): the left side's last dimension must equal the \
             right side's second-to-last, and the leading dimensions must be equal",
        ),
        (
            "shape mismatch in broadcast_",
            "broadcasting lines the two shapes up from their last dimension, and each pair of sizes must be \
             equal or one of them 1 (sum_keepdim and mean_keepdim keep a reduced dimension, as size 1)",
        ),
        (
            "Shape mismatch, got buffer of size",
            "a shape must hold exactly as many elements as the data it describes (a reshape keeps the count)",
        ),
        ("dtype mismatch in", "candle never converts dtypes implicitly: bring both sides to one dtype with to_dtype"),
        ("narrow invalid args", "narrow(dim, start, len) takes a start and a length, not a start and an end"),
        ("only supports contiguous tensors", "call .contiguous() on the tensor first (a transpose is a strided view)"),
        ("unexpected rank", "a dims2/dims3/dims4 call got a tensor with another number of dimensions"),
    ];
    rules.iter().find(|(pattern, _)| text.contains(pattern)).map(|(_, rule)| *rule)
}

/// What a `narrow` that ran past its dimension asked for, in its own
/// numbers: candle's `narrow invalid args ...: [shape], dim: d, start: s, len:l`.
fn narrow_out_of_range(text: &str) -> Option<String> {
    let rest = text.split("narrow invalid args").nth(1)?;
    let shape = rest.split_once('[')?.1.split_once(']')?.0;
    let dims: Vec<usize> =
        shape.split(", ").filter(|d| !d.is_empty()).map(|d| d.parse().ok()).collect::<Option<_>>()?;
    let field = |name: &str| -> Option<usize> {
        let after = rest.split(name).nth(1)?.trim_start();
        after.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()
    };
    let (dim, start, len) = (field(", dim:")?, field(", start:")?, field(", len:")?);
    let size = *dims.get(dim)?;
    Some(format!(
        "narrow({dim}, {start}, {len}) asks for elements [{start}, {}) of dimension {dim}, which holds {size} (shape \
         {dims:?}): narrow takes a start and a length, and start + len must not pass the dimension's size",
        start + len
    ))
}

/// The `lhs: [..], rhs: [..]` shapes of a candle shape error.
fn operand_shapes(text: &str) -> Option<(Vec<usize>, Vec<usize>)> {
    let dims = |after: &str| -> Option<Vec<usize>> {
        let list = text.split(after).nth(1)?.strip_prefix('[')?.split(']').next()?;
        list.split(", ").filter(|d| !d.is_empty()).map(|d| d.parse().ok()).collect()
    };
    Some((dims("lhs: ")?, dims("rhs: ")?))
}

/// Whether two shapes broadcast: from the last dimension, each pair equal or one of them 1.
fn broadcastable(lhs: &[usize], rhs: &[usize]) -> bool {
    lhs.iter().rev().zip(rhs.iter().rev()).all(|(&l, &r)| l == r || l == 1 || r == 1)
}

pub fn values(t: &Tensor) -> Vec<f32> {
    t.to_dtype(DType::F32).and_then(|t| t.flatten_all()).and_then(|t| t.to_vec1::<f32>()).expect("tensor to f32 values")
}

/// For a failure message: where `got` first differs from `want` by `near`
/// ("element i is g, expected w"), or how their lengths differ; `None`
/// when they agree everywhere.
pub fn first_mismatch(got: &[f32], want: &[f64], near: impl Fn(f64, f64) -> bool) -> Option<String> {
    if got.len() != want.len() {
        return Some(format!("it has {} elements, expected {}", got.len(), want.len()));
    }
    let i = got.iter().zip(want).position(|(&g, &w)| !near(g as f64, w))?;
    Some(format!("element {i} is {}, expected {}", number(got[i] as f64), number(want[i])))
}

/// The first place where `got` and `want` differ beyond `tol`.
struct Difference {
    index: usize,
    got: f32,
    want: f32,
}

fn first_difference(got: &[f32], want: &[f32], tol: Tol) -> Option<Difference> {
    let differs = |(g, w): (f32, f32)| g.is_nan() != w.is_nan() || (g - w).abs() > tol.atol + tol.rtol * w.abs();
    let index = got.iter().zip(want).position(|(&g, &w)| differs((g, w)))?;
    Some(Difference { index, got: got[index], want: want[index] })
}

/// A value as people write it: six significant digits, exponent only when
/// the value is very small or very large.
pub fn number(v: f64) -> String {
    if v == 0.0 || !v.is_finite() {
        return format!("{v}");
    }
    if (1e-3..1e6).contains(&v.abs()) {
        let decimals = (5 - v.abs().log10().floor() as i32).max(0) as usize;
        let fixed = format!("{v:.decimals$}");
        let fixed = if fixed.contains('.') { fixed.trim_end_matches('0').trim_end_matches('.') } else { &fixed };
        fixed.to_string()
    } else {
        format!("{v:.5e}")
    }
}

fn multi_index(mut flat: usize, dims: &[usize]) -> Vec<usize> {
    let mut index = vec![0; dims.len()];
    for (slot, &d) in index.iter_mut().zip(dims).rev() {
        *slot = flat % d;
        flat /= d;
    }
    index
}

pub fn all_close(got: &Tensor, want: &Tensor, tol: Tol) -> bool {
    got.dims() == want.dims() && first_difference(&values(got), &values(want), tol).is_none()
}

/// Where `got` and `want` differ beyond `tol`, if they do. `other` names
/// `want` when it is not the PyTorch reference (another output of the
/// learner's own code, which the test compares against).
fn mismatch(got: &Tensor, want: &Tensor, tol: Tol, what: &str, other: Option<&str>) -> Option<String> {
    if got.dims() != want.dims() {
        return Some(format!("{what}: wrong shape {:?}, expected {:?}", got.dims(), want.dims()));
    }
    let (g, w) = (values(got), values(want));
    if let Some(i) = g.iter().position(|v| v.is_nan()) {
        return Some(format!(
            "{what}: NaN at {:?}. A NaN usually comes from 0/0 or from a softmax row in which every entry is -inf.",
            multi_index(i, got.dims())
        ));
    }
    let first = first_difference(&g, &w, tol)?;
    let at = multi_index(first.index, got.dims());
    let (got_value, want_value) = (number(first.got as f64), number(first.want as f64));
    let tolerance = format!("tolerance {} + {}·|expected|", number(tol.atol as f64), number(tol.rtol as f64));
    Some(match other {
        None => format!(
            "{what}: does not match the PyTorch reference.\n  First difference at {at:?}: got {got_value}, \
             expected {want_value} ({tolerance})"
        ),
        Some(other) => format!(
            "{what}: differs from {other}.\n  First difference at {at:?}: got {got_value}, where {other} has \
             {want_value} ({tolerance})"
        ),
    })
}

/// Asserts that `got` equals the reference `want` within `tol`.
///
/// `what` names the value ("rotate_half(x)"). `mistakes` pairs a description
/// of a typical mistake with the output that mistake produces (from the
/// fixture); a mismatch that equals one of them is reported as that mistake,
/// any other only by where it first differs: a guess would mislead.
pub fn expect_close(got: &Tensor, want: &Tensor, tol: Tol, what: &str, mistakes: &[(&str, Tensor)]) {
    let Some(mut message) = mismatch(got, want, tol, what, None) else { return };
    if let Some((mistake, _)) = mistakes.iter().find(|(_, output)| all_close(got, output, tol)) {
        message.push_str(&format!("\n  Your output is exactly what this mistake produces: {mistake}."));
    }
    panic!("{message}");
}

/// Asserts that `got` equals `want` within `tol`; on failure, names the cause
/// the caller established from the output, if any (see [`cause`]).
pub fn expect_close_because(got: &Tensor, want: &Tensor, tol: Tol, what: &str, established: Option<&str>) {
    if let Some(message) = mismatch(got, want, tol, what, None) {
        panic!("{message}{}", cause(established));
    }
}

/// Asserts that `got` equals `other`, another output of the learner's own
/// code (`other_name` says which), within `tol`; on failure, names the
/// cause the caller established, if any (see [`cause`]).
pub fn expect_same(got: &Tensor, other: &Tensor, other_name: &str, tol: Tol, what: &str, established: Option<&str>) {
    if let Some(message) = mismatch(got, other, tol, what, Some(other_name)) {
        panic!("{message}{}", cause(established));
    }
}

/// `field: got x, expected y` for each field whose values differ, joined by `; `.
pub fn field_differences<T: PartialEq + std::fmt::Debug>(fields: &[(&str, T, T)]) -> String {
    let differing: Vec<String> = fields
        .iter()
        .filter(|(_, got, want)| got != want)
        .map(|(field, got, want)| format!("{field}: got {got:?}, expected {want:?}"))
        .collect();
    differing.join("; ")
}

/// The line that names a failure's cause, when the test has established it
/// (the output equals a mistake's, or a checked precondition singles it out);
/// nothing otherwise, so that a failure never blames the wrong thing.
pub fn cause(established: Option<&str>) -> String {
    established.map(|cause| format!("\n  Likely cause: {cause}.")).unwrap_or_default()
}

/// `what = got, expected want`, numbers written for people, with the cause
/// where one is established (see [`cause`]).
pub fn value_failure(what: &str, got: f64, want: f64, established: Option<&str>) -> String {
    format!("{what} = {}, expected {}.{}", number(got), number(want), cause(established))
}

/// Asserts that `got` has dtype `want`, explaining why it matters.
pub fn expect_dtype(got: &Tensor, want: DType, what: &str, why: &str) {
    assert!(got.dtype() == want, "{what}: dtype {:?}, expected {want:?}. {why}", got.dtype());
}

/// The gradient of `tensor` in `grads`, or a failure explaining that it vanished.
pub fn grad(grads: &GradStore, tensor: &Tensor, name: &str, if_missing: &str) -> Tensor {
    match grads.get(tensor) {
        Some(g) => g.clone(),
        None => panic!("no gradient reached {name}: the backward pass does not go through it. {if_missing}"),
    }
}

/// The scalar whose gradient is the vector-Jacobian product with `grad_out`:
/// what PyTorch's `out.backward(grad_out)` computes.
pub fn surrogate(out: &Tensor, grad_out: &Tensor) -> Tensor {
    out.mul(grad_out).and_then(|t| t.sum_all()).expect("surrogate loss")
}

/// A fixture tensor as a trainable variable, so that gradients can be taken with respect to it.
pub fn var(t: &Tensor) -> candle_core::Var {
    candle_core::Var::from_tensor(t).expect("variable from fixture tensor")
}

/// ‖t‖, the L2 norm of all its elements, summed in f64.
pub fn l2_norm(t: &Tensor) -> f64 {
    t.to_dtype(DType::F64)
        .and_then(|t| t.sqr())
        .and_then(|t| t.sum_all())
        .and_then(|t| t.to_scalar::<f64>())
        .expect("norm")
        .sqrt()
}

/// Asserts that the update `after - before` of a parameter matches the
/// reference update `want_after - before` to within `rel` relative L2 error.
///
/// After optimizer steps an element-wise tolerance is the wrong tool: Adam
/// divides by sqrt(v), so an element whose gradient nearly cancels turns the
/// last bits of float rounding into a visible share of its step. The L2 error
/// of the whole update stays tiny unless the step itself is wrong.
pub fn expect_update_close(before: &Tensor, after: &Tensor, want_after: &Tensor, rel: f64, what: &str) {
    let ours = (after - before).expect("update");
    let reference = (want_after - before).expect("reference update");
    let error = l2_norm(&(&ours - &reference).expect("difference")) / l2_norm(&reference).max(1e-30);
    assert!(
        error <= rel,
        "{what}: the update differs from the reference by {:.3}% (relative L2; allowed {:.3}%); its size is {:.3e}, the reference's {:.3e}",
        100.0 * error,
        100.0 * rel,
        l2_norm(&ours),
        l2_norm(&reference)
    );
}

/// A fresh, empty directory for one test's files.
pub fn scratch_dir(test: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("workbook-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch directory");
    dir
}

/// Whether two tensors are equal bit for bit.
pub fn bit_equal(a: &Tensor, b: &Tensor) -> bool {
    a.dims() == b.dims()
        && a.dtype() == b.dtype()
        && values(a).iter().zip(values(b)).all(|(x, y)| x.to_bits() == y.to_bits())
}

/// Every rank's result, or a failure listing each `rank` (or stage) whose
/// `what` returned an error, with the error.
pub fn every_rank<'a, T: Clone + 'a>(
    results: impl IntoIterator<Item = &'a Result<T, String>>,
    what: &str,
    rank: &str,
) -> Vec<T> {
    let results: Vec<&Result<T, String>> = results.into_iter().collect();
    let failed: Vec<String> = results
        .iter()
        .enumerate()
        .filter_map(|(r, result)| result.as_ref().err().map(|e| format!("  {rank} {r}: {e}")))
        .collect();
    assert!(
        failed.is_empty(),
        "{what} failed on {} {rank}(s) of {}:\n{}",
        failed.len(),
        results.len(),
        failed.join("\n")
    );
    results.into_iter().map(|result| result.clone().unwrap()).collect()
}

/// Where `got` first differs from `want` by more than 1e-4 of `want`'s
/// largest magnitude (f32 arithmetic in another order), or holds a NaN: for
/// gradients, whose small elements carry the rounding of the large ones.
pub fn first_scaled_difference(got: &[f32], want: &[f32]) -> Option<String> {
    let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
    let want: Vec<f64> = want.iter().map(|&w| f64::from(w)).collect();
    // In f32, as the gradients were computed.
    first_mismatch(got, &want, |g, w| ((g - w) as f32).abs() <= 1e-4 * scale + 1e-7)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn root() -> String {
        repository_root().to_string_lossy().replace('\\', "/")
    }

    #[test]
    fn a_workbook_file_is_found_however_the_path_is_printed() {
        let exercise = "exercises/phase4_under_the_hood/ex16_ring_all_reduce.rs:59:42";
        assert_eq!(
            workbook_file("src/../exercises/phase4_under_the_hood/ex16_ring_all_reduce.rs:59:42").unwrap(),
            exercise
        );
        let absolute = format!("{}/src/../{exercise}", root());
        assert_eq!(workbook_file(&absolute).unwrap(), exercise);
        let here = std::env::current_dir().unwrap().to_string_lossy().replace('\\', "/");
        let below_here = format!(
            "./{}",
            format!("{}/tests/graded/exercise_16.rs:158:9", root()).strip_prefix(&format!("{here}/")).unwrap()
        );
        assert_eq!(workbook_file(&below_here).unwrap(), "tests/graded/exercise_16.rs:158:9");
        for outside in [
            "/rustc/59807616e1fa2540724bfbac14d7976d7e4a3860/library/core/src/bool.rs:66:24",
            "/home/me/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/candle-core-0.11.1/src/tensor.rs:10:5",
            "./nptl/pthread_create.c:442:8",
        ] {
            assert_eq!(workbook_file(outside), None, "{outside}");
        }
    }

    /// A rank's panic as `Backtrace` prints it (shortened): the hook, std's
    /// panic machinery, then the exercise, the test and the launcher.
    fn rank_panic_backtrace() -> String {
        let root = root();
        format!(
            "   0: graded::support::report_other_panic::{{{{closure}}}}
             at ./graded/support.rs:64:65
   1: core::bool::<impl bool>::then
             at /rustc/5980/library/core/src/bool.rs:66:24
   2: report_other_panic
             at ./graded/support.rs:64:57
   7: std::panicking::panic_with_hook
   9: std::sys::backtrace::__rust_end_short_backtrace::<std::panicking::panic_handler::{{closure#0}}, !>
  11: core::panicking::panic_fmt
  13: workbook::exercises::ex16_ring_all_reduce::ring_all_reduce
             at {root}/src/../exercises/phase4_under_the_hood/ex16_ring_all_reduce.rs:59:42
  14: graded::exercise_16::each_rank_sends_2_n_minus_1_chunks_of_a_nth_of_the_tensor::{{{{closure}}}}
             at {root}/tests/graded/exercise_16.rs:158:9
  19: catch_unwind<core::result::Result<(u64, u64, u64), candle_core::error::Error>>
  21: run_rank<(u64, u64, u64), graded::exercise_16::{{closure_env#0}}>
             at {root}/src/distributed/cpu/spawn.rs:94:18
  34: start_thread
             at ./nptl/pthread_create.c:442:8"
        )
    }

    #[test]
    fn a_panics_frames_are_the_workbooks_below_the_panic() {
        let frames = workbook_frames(&rank_panic_backtrace());
        let want = [
            (
                "workbook::exercises::ex16_ring_all_reduce::ring_all_reduce",
                "exercises/phase4_under_the_hood/ex16_ring_all_reduce.rs:59:42",
            ),
            (
                "graded::exercise_16::each_rank_sends_2_n_minus_1_chunks_of_a_nth_of_the_tensor::{{closure}}",
                "tests/graded/exercise_16.rs:158:9",
            ),
            ("run_rank", "src/distributed/cpu/spawn.rs:94:18"),
        ];
        let want: Vec<(String, String)> = want.iter().map(|(f, at)| (f.to_string(), at.to_string())).collect();
        assert_eq!(frames, want);
        let report = frames_report(&frames);
        assert_eq!(
            report,
            "backtrace, the workbook's frames only:\n  exercises/phase4_under_the_hood/ex16_ring_all_reduce.rs:59:42 \
             in workbook::exercises::ex16_ring_all_reduce::ring_all_reduce\n  tests/graded/exercise_16.rs:158:9 in \
             graded::exercise_16::each_rank_sends_2_n_minus_1_chunks_of_a_nth_of_the_tensor::{{closure}}"
        );
        assert_eq!(without_backtrace(&report), report, "a rank's output keeps its frames");
    }

    #[test]
    fn a_candle_error_says_where_in_an_exercise_it_was_raised() {
        let error = format!("narrow invalid args start + len > dim_len\n{}", rank_panic_backtrace());
        assert_eq!(
            without_backtrace(&error),
            "narrow invalid args start + len > dim_len\n  (raised in exercises/phase4_under_the_hood/ex16_ring_all_reduce.rs:59:42)"
        );
    }

    /// Set in the copy of this binary that the test below starts: the line
    /// that copy says again at exit.
    const SAY_AT_EXIT: &str = "WORKBOOK_TEST_SAY_AT_EXIT";

    #[test]
    fn a_line_said_again_at_exit_follows_libtests_summary() {
        if let Some(line) = std::env::var_os(SAY_AT_EXIT) {
            say_again_at_exit(line.to_string_lossy().into_owned());
            return;
        }
        let test = std::thread::current().name().expect("libtest names each test's thread").to_string();
        // One pipe for both streams keeps the order in which they were written.
        let (mut output, both) = std::io::pipe().expect("a pipe");
        let mut copy = std::process::Command::new(std::env::current_exe().expect("the test binary"))
            .args([test.as_str(), "--exact", "--test-threads", "1"])
            .env(SAY_AT_EXIT, "note: said again")
            .stdout(both.try_clone().expect("the pipe's second writer"))
            .stderr(both)
            .spawn()
            .expect("the test binary starts");
        let mut text = String::new();
        std::io::Read::read_to_string(&mut output, &mut text).expect("its output");
        assert!(copy.wait().expect("it ends").success(), "{text}");
        let lines: Vec<&str> = text.lines().filter(|line| !line.trim().is_empty()).collect();
        let summary = lines.iter().position(|line| line.starts_with("test result: ok")).expect(&text);
        assert_eq!(lines[summary + 1..], ["note: said again"], "{text}");
    }

    #[test]
    fn a_ranks_thread_names_its_rank_and_its_test() {
        assert_eq!(whose_thread(Some("rank-2 of exercise_16::it_sums")), (Some("2"), "exercise_16::it_sums"));
        assert_eq!(whose_thread(Some("rank-0")), (Some("0"), ""));
        assert_eq!(whose_thread(Some("exercise_16::it_sums")), (None, "exercise_16::it_sums"));
    }
}
