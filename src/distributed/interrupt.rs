//! Ctrl-C (SIGINT) and a scheduler's SIGTERM, caught: the process that owns
//! the job (the launcher, or a lone rank) stops it at a point where it can
//! say how it ended and where to resume.

use std::sync::atomic::{AtomicBool, Ordering};

/// The exit code of an interrupted job: the shell's for a SIGINT.
pub const INTERRUPTED: i32 = 128 + 2;

/// Set by the handler.
static SIGNALLED: AtomicBool = AtomicBool::new(false);

#[cfg(unix)]
extern "C" fn on_interrupt(_signal: libc::c_int) {
    SIGNALLED.store(true, Ordering::SeqCst); // async-signal-safe: one atomic store
}

/// What a signal after the first one does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Again {
    /// It is caught too: for a launcher, which stops its ranks at once
    /// (some tools send a signal to a process and to its group, so twice).
    Caught,
    /// It ends the process, as if nothing had caught the first: for a lone
    /// rank, which stops only once the step in flight is done.
    Ends,
}

/// Catches SIGINT and SIGTERM: [`interrupted`] says whether one came; a
/// later one is caught or not as `again` says. A process this one starts
/// has the default again after its exec.
pub fn catch_interrupts(again: Again) {
    #[cfg(unix)]
    // SAFETY: the handler only stores to an atomic, which is
    // async-signal-safe; the action struct is zeroed before its fields are set.
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = on_interrupt as extern "C" fn(libc::c_int) as libc::sighandler_t;
        action.sa_flags = match again {
            Again::Caught => 0,
            Again::Ends => libc::SA_RESETHAND,
        };
        libc::sigemptyset(&mut action.sa_mask);
        libc::sigaction(libc::SIGINT, &action, std::ptr::null_mut());
        libc::sigaction(libc::SIGTERM, &action, std::ptr::null_mut());
    }
}

/// Whether a SIGINT or SIGTERM came since [`catch_interrupts`].
pub fn interrupted() -> bool {
    SIGNALLED.load(Ordering::SeqCst)
}
