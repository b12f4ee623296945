//! What the NCCL backend has never run with two GPUs or more, refused where
//! it is called unless the program opts in: a path that never ran may hang
//! or corrupt in ways no CPU test can show. The trainer opts in with
//! `--unverified-nccl`.

use std::sync::atomic::{AtomicBool, Ordering};

use candle_core::{bail, Result};

static ALLOWED: AtomicBool = AtomicBool::new(false);

/// Lets this process run the never-run NCCL paths (`true`), or not (`false`, the default).
pub fn allow_unverified_nccl(allow: bool) {
    ALLOWED.store(allow, Ordering::SeqCst);
}

/// Fails with a message naming `what`, unless the process opted in.
pub fn refuse_unverified(what: &str) -> Result<()> {
    if ALLOWED.load(Ordering::SeqCst) {
        return Ok(());
    }
    bail!(
        "over NCCL, {what} has never run with two GPUs or more: pass --unverified-nccl to run it anyway (a rank \
         that waits longer than --timeout ends the job with a message), or use --backend tcp"
    )
}
