//! Why two flags do not go together. clap refuses a pair its `conflicts_with`
//! names, but says only that they conflict; a learner trying layouts needs
//! the reason, and what to use instead.

use clap::error::{ContextKind, ContextValue, ErrorKind};

/// Each refused pair (either order) and why.
const REASONS: &[(&str, &str, &str)] = &[
    (
        "--resume",
        "--init-from",
        "--resume continues a run (weights, optimizer, step); --init-from starts a new one from weights",
    ),
    ("--resume", "--overwrite", "--overwrite deletes the checkpoints --resume would continue from"),
    ("--own-ddp", "--powersgd-rank", OWN_DDP_AVERAGES),
    (
        "--ddp-overlap",
        "--powersgd-rank",
        "PowerSGD compresses the gradients after backward; --ddp-overlap sends them during it",
    ),
    ("--pp", "--ddp-overlap", OVERLAP_PLAIN_DDP),
    ("--tp", "--ddp-overlap", OVERLAP_PLAIN_DDP),
    ("--own-ddp", "--ddp-overlap", OVERLAP_PLAIN_DDP),
    ("--own-ddp", "--pp", OWN_DDP_WHOLE),
    ("--own-ddp", "--tp", OWN_DDP_WHOLE),
    (
        "--own-ddp",
        "--activation-checkpointing",
        "your DataParallel (exercise 26) runs each micro-batch's forward and backward itself, without checkpointing",
    ),
];

const OWN_DDP_AVERAGES: &str =
    "your DataParallel (exercise 26) averages the gradients itself; PowerSGD compresses the runtime's DDP all-reduce";
const OVERLAP_PLAIN_DDP: &str =
    "--ddp-overlap overlaps a plain DDP run's all-reduce with backward (exercise 19); this layout averages after it";
const OWN_DDP_WHOLE: &str =
    "your DataParallel (exercise 26) replicates the whole model: it is the data axis of a plain \
     run, not of a mesh";

/// Prints `error` as clap would, with the reason when two flags conflict,
/// and exits with clap's code.
pub fn exit_saying_why(error: clap::Error) -> ! {
    let reason = match error.kind() {
        ErrorKind::ArgumentConflict => {
            reason(&flag_of(&error, ContextKind::InvalidArg), &flag_of(&error, ContextKind::PriorArg))
        }
        _ => None,
    };
    let Some(reason) = reason else { error.exit() };
    let rendered = error.render().to_string();
    let (first, rest) = rendered.split_once('\n').unwrap_or((&rendered, ""));
    eprintln!("{first}\n  why: {reason}\n{rest}");
    std::process::exit(error.exit_code())
}

/// The flag a conflict names in `kind`, as typed: "--tp" of "--tp <T>".
fn flag_of(error: &clap::Error, kind: ContextKind) -> String {
    let value = match error.get(kind) {
        Some(ContextValue::String(s)) => s.clone(),
        Some(ContextValue::Strings(v)) => v.first().cloned().unwrap_or_default(),
        _ => String::new(),
    };
    value.split_whitespace().next().unwrap_or_default().to_string()
}

/// Why flags `a` and `b` (as typed, "--tp") do not go together, when known.
pub fn reason(a: &str, b: &str) -> Option<&'static str> {
    REASONS.iter().find(|(x, y, _)| (*x == a && *y == b) || (*x == b && *y == a)).map(|(_, _, why)| *why)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pair_is_found_in_either_order_and_an_unknown_one_is_not() {
        assert_eq!(reason("--own-ddp", "--powersgd-rank"), Some(OWN_DDP_AVERAGES));
        assert_eq!(reason("--powersgd-rank", "--own-ddp"), Some(OWN_DDP_AVERAGES));
        assert_eq!(reason("--tp", "--seed"), None);
    }
}
