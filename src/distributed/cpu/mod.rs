//! The CPU backend: every rank is a thread of this process.
//!
//! [`spawn`] starts `world_size` threads and hands each a [`CpuProcessGroup`].
//! The ranks meet in one shared [`Rendezvous`](rendezvous): a mutex-guarded
//! table with a slot per rank, and a condition variable to wait on.
//!
//! ```text
//!   rank 0 ──all_reduce #7──┐
//!   rank 1 ──all_reduce #7──┼──> slots [t0, t1, t2] ──> last to arrive computes
//!   rank 2 ──all_reduce #7──┘        t0 + t1 + t2, and wakes the others
//! ```
//!
//! A generation counter numbers the collectives (#0, #1, ...); a rank that is
//! already at #8 cannot mix its tensor into #7, because #8's slots only open
//! once #7 is complete.
//!
//! A real NCCL job hangs when a rank dies or skips a collective; here, to keep
//! a learner's bug from freezing a test run, the group is aborted instead and
//! every rank's next (or pending) collective fails at once with the reason:
//! the first rank whose closure returned an error or panicked, two ranks that
//! issued different collectives, a rank that finished while others still
//! waited for it, or a wait longer than the timeout (60 s by default; see
//! [`spawn_with_timeout`]).

mod group;
mod rendezvous;
mod spawn;

pub use group::CpuProcessGroup;
pub use spawn::{spawn, spawn_with_timeout, DEFAULT_TIMEOUT};
