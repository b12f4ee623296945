//! Faults on purpose, for the tests that show a run survives them. Nothing
//! happens unless `WORKBOOK_INJECT` names them, comma-separated:
//!
//! | fault                   | what it does                                                          |
//! |-------------------------|-----------------------------------------------------------------------|
//! | `save-delay-ms=N`       | each checkpoint write first sleeps N ms: a slow disk                   |
//! | `disk-full-on-save=K`   | this process's K-th checkpoint write (from 1) fails with "No space left on device" once its model file is written: a full disk |
//! | `abort-at-step=N`       | rank `fault-rank` aborts as step N begins, in an elastic job's first round only: a crash |
//! | `kill-launcher-at-step=N` | rank `fault-rank` kills its launcher (and with it every rank of its machine) as step N begins, in the first round only: a lost machine |
//! | `fault-rank=R`          | the rank the two above strike (default 1)                             |

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

use candle_core::{bail, Result};

use crate::distributed::DistEnv;

const VARIABLE: &str = "WORKBOOK_INJECT";

#[derive(Debug, Default)]
struct Faults {
    save_delay: Option<Duration>,
    disk_full_on_save: Option<u64>,
    abort_at_step: Option<u64>,
    kill_launcher_at_step: Option<u64>,
    fault_rank: Option<u64>,
}

fn faults() -> Result<&'static Faults> {
    static FAULTS: OnceLock<std::result::Result<Faults, String>> = OnceLock::new();
    match FAULTS.get_or_init(|| parse(&std::env::var(VARIABLE).unwrap_or_default())) {
        Ok(faults) => Ok(faults),
        Err(e) => bail!("{VARIABLE}: {e}"),
    }
}

fn parse(text: &str) -> std::result::Result<Faults, String> {
    let mut faults = Faults::default();
    for item in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (name, value) = item.split_once('=').ok_or(format!("`{item}` is not name=value"))?;
        let number: u64 = value.parse().map_err(|_| format!("`{value}` in `{item}` is not a whole number"))?;
        match name {
            "save-delay-ms" => faults.save_delay = Some(Duration::from_millis(number)),
            "disk-full-on-save" => faults.disk_full_on_save = Some(number),
            "abort-at-step" => faults.abort_at_step = Some(number),
            "kill-launcher-at-step" => faults.kill_launcher_at_step = Some(number),
            "fault-rank" => faults.fault_rank = Some(number),
            _ => {
                return Err(format!(
                    "unknown fault `{name}`: save-delay-ms, disk-full-on-save, abort-at-step, kill-launcher-at-step \
                     or fault-rank"
                ))
            }
        }
    }
    Ok(faults)
}

/// A checkpoint write begins: sleeps if a slow disk is injected. Returns the
/// write's number in this process, from 1.
pub(crate) fn checkpoint_write_begins() -> Result<u64> {
    static WRITES: AtomicU64 = AtomicU64::new(0);
    let number = WRITES.fetch_add(1, Ordering::Relaxed) + 1;
    if let Some(delay) = faults()?.save_delay {
        std::thread::sleep(delay);
    }
    Ok(number)
}

/// Fails as a full disk would, if write `number` is the one injected to.
pub(crate) fn disk_full_check(number: u64) -> io::Result<()> {
    match faults().ok().and_then(|f| f.disk_full_on_save) {
        Some(k) if k == number => Err(io::Error::from(io::ErrorKind::StorageFull)),
        _ => Ok(()),
    }
}

/// Rank `rank` begins step `step` (from 1): it crashes, or takes its machine
/// down, if injected to, in the first round of its job (a restarted job
/// passes the step again and must get through it).
pub fn step_begins(rank: usize, step: usize) -> Result<()> {
    let faults = faults()?;
    let striking = faults.abort_at_step.or(faults.kill_launcher_at_step).is_some();
    if !striking || faults.fault_rank.unwrap_or(1) != rank as u64 {
        return Ok(());
    }
    if DistEnv::from_env()?.and_then(|env| env.elastic_round).is_some_and(|round| round > 0) {
        return Ok(());
    }
    let now = Some(step as u64);
    if faults.kill_launcher_at_step == now {
        kill_launcher();
    }
    if faults.abort_at_step == now || faults.kill_launcher_at_step == now {
        eprintln!("injected fault: rank {rank} aborts at step {step}");
        std::process::abort();
    }
    Ok(())
}

/// Kills this process's parent, the launcher, as a power cut would.
fn kill_launcher() {
    #[cfg(unix)]
    {
        let launcher = std::os::unix::process::parent_id().to_string();
        let _ = std::process::Command::new("kill").args(["-9", &launcher]).status();
    }
}
