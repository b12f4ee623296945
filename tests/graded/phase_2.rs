//! Phase 2's whole-phase check, run once exercises 8-11 pass: DDP with every
//! rank a process of its own, as on a cluster (the process backend over TCP,
//! see `process_ranks.rs`), trains bit for bit as DDP on thread ranks and
//! reaches what one process reaches. Each rank's process runs your exercises.

use candle_core::Device;

use crate::fsdp_runs::{as_values, ddp_rank, ddp_run, max_relative_difference, single_process, train_config};
use crate::process_ranks::on_processes;

const STEPS: usize = 3;
/// Clipping that bites on this model (its gradient norm is above 1).
const CLIP: f64 = 0.5;

#[test]
fn ddp_on_two_processes_trains_as_on_two_thread_ranks_and_as_one_process() {
    let per_rank =
        on_processes(2, |pg| Ok(as_values(&ddp_rank(Box::new(pg), train_config(CLIP), STEPS, &Device::Cpu)?)));
    // Two ranks add a + b = b + a: the ring's average is the threads' to the bit.
    let threads = as_values(&ddp_run(2, train_config(CLIP), STEPS));
    for (rank, params) in per_rank.iter().enumerate() {
        if let Some(name) = params.keys().find(|name| params[*name] != threads[*name]) {
            panic!("rank {rank}'s process and the thread ranks disagree on `{name}` after {STEPS} steps");
        }
    }
    let ddp = ddp_run(2, train_config(CLIP), STEPS);
    let (worst, name) = max_relative_difference(&ddp, &single_process(STEPS, CLIP));
    assert!(worst <= 1e-5, "DDP on 2 ranks vs one process: `{name}` differs by {worst:.2e} relative (allowed 1e-5)");
}
