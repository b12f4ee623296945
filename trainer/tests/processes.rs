//! Ranks as processes: `train --nproc N` starts itself as N processes through
//! the launcher, two launchers with `--nnodes 2` form one job, a rank that
//! dies ends the job at once with its name, an elastic job restarts from
//! its checkpoint, on the machines it has left, and meshes of processes
//! train as one process does.
//! Needs finished exercises: run with `cargo test -p trainer --features solutions`.

mod common;
use common::scratch;

use std::path::Path;
use std::process::{Command, Output};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use trainer::checkpoints;

/// Process tests start several processes each: one at a time on a small machine.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// `train` on dummy data for `steps` steps into `dir`, with `extra` flags,
/// saving only at the end.
fn train(dir: &Path, steps: usize, extra: &[&str]) -> Command {
    train_saving_every(dir, steps, 1000, extra)
}

/// [`train`], saving a checkpoint every `every` steps.
fn train_saving_every(dir: &Path, steps: usize, every: usize, extra: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_train"));
    command.args(["--model-size", "tiny", "--dataset", "dummy", "--seq-len", "32", "--batch-size", "4"]);
    command.args(["--warmup-steps", "2", "--max-steps", &steps.to_string(), "--checkpoint-every", &every.to_string()]);
    command.arg("--checkpoint-dir").arg(dir).args(extra).env("RAYON_NUM_THREADS", "1");
    command
}

fn succeed(command: &mut Command) -> Output {
    let output = command.output().expect("train starts");
    assert!(output.status.success(), "{command:?} failed:\n{}", String::from_utf8_lossy(&output.stderr));
    output
}

fn final_weights(dir: &Path, step: usize) -> Vec<u8> {
    std::fs::read(checkpoints::step_dir(dir, step).join("model.safetensors")).expect("the final checkpoint")
}

/// A run whose updates diverge (an absurd learning rate) skips each update
/// whose gradient is not finite and goes on, under every strategy: the
/// same skip everywhere, ZeRO-1 included (whose sharded step updates the
/// moments before the norm is known, and puts them back) and ZeRO-2 (whose
/// shard update waits for the norm), on a mesh too,
/// and under the learner's own DDP.
#[test]
fn a_diverging_run_skips_its_updates_and_goes_on_under_every_strategy() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let layouts: [&[&str]; 9] = [
        &["--strategy", "ddp"],
        &["--strategy", "zero1"],
        &["--strategy", "zero2"],
        &["--strategy", "fsdp"],
        &["--tp", "2"],
        &["--pp", "2"],
        &["--strategy", "zero1", "--pp", "2"],
        &["--strategy", "fsdp", "--pp", "2"],
        &["--own-ddp"],
    ];
    for layout in layouts {
        let dir = scratch(&format!("diverging{}", layout.join("")));
        let output = succeed(&mut train(&dir, 4, &[&["--nproc", "2", "--lr", "1e30"][..], layout].concat()));
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(stdout.contains("3 updates skipped for non-finite gradients"), "{layout:?}:\n{stdout}");
        assert!(stdout.contains("the last 3 steps were all skipped"), "{layout:?}:\n{stdout}");
    }
}

/// Ctrl-C (SIGINT to the launcher, or to a lone process) stops the job
/// and says which checkpoint a resume continues from, with the shell's
/// code for SIGINT; the loss curve is drawn as at a run's end.
#[cfg(unix)]
#[test]
fn an_interrupted_job_says_where_it_can_resume() {
    let _serial = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    for nproc in ["1", "2"] {
        let dir = scratch(&format!("interrupted-{nproc}"));
        let mut command = train_saving_every(&dir, 100_000, 2, &["--nproc", nproc]);
        let child = command.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped()).spawn().unwrap();
        let start = Instant::now();
        while checkpoints::steps(&dir).unwrap().is_empty() {
            assert!(start.elapsed() < Duration::from_secs(120), "no checkpoint within two minutes");
            std::thread::sleep(Duration::from_millis(50));
        }
        let signalled = Command::new("kill").args(["-INT", &child.id().to_string()]).status().unwrap();
        assert!(signalled.success());
        let output = child.wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(130), "--nproc {nproc}: {stdout}{stderr}");
        let newest = *checkpoints::steps(&dir).unwrap().last().unwrap();
        let said = format!("the newest checkpoint is {}", checkpoints::step_dir(&dir, newest).display());
        assert!(stdout.contains(&said), "--nproc {nproc}: expected `{said}`:\n{stdout}");
        assert!(dir.join("loss.svg").is_file(), "--nproc {nproc}: no loss.svg");
    }
}

#[test]
fn two_processes_train_exactly_as_two_thread_ranks() {
    let _serial = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let (processes, threads) = (scratch("as-processes"), scratch("as-threads"));
    let output = succeed(&mut train(&processes, 4, &["--nproc", "2"]));
    succeed(&mut train(&threads, 4, &["--nproc", "2", "--ranks", "threads"]));
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.contains("[rank 0] trained 4 steps"), "rank 0 reports the run, prefixed by its rank:\n{stdout}");
    assert!(!stdout.contains("[rank 1] trained"), "only rank 0 reports:\n{stdout}");
    // Two ranks add a + b = b + a: the ring's all-reduce is exact, so the runs are identical.
    assert!(
        final_weights(&processes, 4) == final_weights(&threads, 4),
        "two processes must train bit for bit as two thread ranks"
    );
}

/// Three rows of `cargo xtask matrix`, ranks as processes: FSDP × TP × PP
/// on 8, ZeRO-1 × TP on 4 and HSDP × PP on 8 each take one process's loss
/// at every one of 10 steps, within the matrix's 1e-5 (the program fails
/// otherwise).
#[test]
fn three_meshes_as_processes_train_as_one_process() {
    let _serial = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let rows = ["FSDP × TP 2 (SP) × PP 2", "ZeRO-1 × TP 2 (SP)", "HSDP (2 × 2) × PP 2"];
    let mut matrix = Command::new(env!("CARGO_BIN_EXE_matrix"));
    matrix.args(["--steps", "10", "--scratch"]).arg(scratch("matrix-rows")).env("RAYON_NUM_THREADS", "1");
    for row in rows {
        matrix.args(["--only", row]);
    }
    let output = succeed(&mut matrix);
    let table = String::from_utf8_lossy(&output.stdout);
    for row in rows {
        let line = table.lines().find(|line| line.starts_with(&format!("| {row} |")));
        assert!(line.is_some_and(|line| line.ends_with("| matches |")), "{row}:\n{table}");
    }
}

/// Two launchers on loopback, one per "node", form one job of two ranks.
/// Their secret comes from a token file that node 0 writes, readable by its
/// owner only, and node 1 (started first) waits for, as on a shared
/// filesystem; the secret itself is never printed.
#[test]
fn two_nodes_on_loopback_train_as_one_job_of_two_ranks() {
    let _serial = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let (nodes, single) = (scratch("two-nodes"), scratch("one-node"));
    let port = workbook::distributed::launch::free_port("127.0.0.1").unwrap().to_string();
    std::fs::create_dir_all(&nodes).unwrap();
    let token_file = nodes.join("job.token");
    // One thread per rank on both sides: a rank alone on its node would
    // otherwise split its batch across the node's cores, and sum in another order.
    let node = |rank: &str| {
        let mut node = train(&nodes, 4, &["--nnodes", "2", "--node-rank", rank, "--nproc", "1", "--threads", "1"]);
        node.args(["--master-port", &port]);
        node.arg("--token-file").arg(&token_file).env_remove("WORKBOOK_JOB_TOKEN");
        node.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped()).spawn().expect("a node starts")
    };
    let (first, second) = (node("1"), node("0"));
    let mut printed = String::new();
    for node in [first, second] {
        let output = node.wait_with_output().expect("the node finishes");
        assert!(output.status.success(), "a node failed:\n{}", String::from_utf8_lossy(&output.stderr));
        printed += &String::from_utf8_lossy(&output.stdout);
        printed += &String::from_utf8_lossy(&output.stderr);
    }
    let token = std::fs::read_to_string(&token_file).expect("node 0 wrote the token file");
    assert!(token.len() >= 32 && !printed.contains(token.trim()), "the token must be long and never printed");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&token_file).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "the token file must be readable by its owner only");
    }
    succeed(&mut train(&single, 4, &["--nproc", "2", "--threads", "1"]));
    assert!(final_weights(&nodes, 4) == final_weights(&single, 4), "--nnodes 2 x --nproc 1 must train as --nproc 2");
}

#[cfg(unix)]
#[test]
fn a_failing_rank_stops_the_job_with_its_exit_code_and_name() {
    let _serial = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let start = Instant::now();
    let output = Command::new(env!("CARGO_BIN_EXE_launch"))
        .args([
            "--nproc-per-node",
            "3",
            "--",
            "sh",
            "-c",
            r#"echo "I am $RANK of $WORLD_SIZE"; [ "$RANK" = 1 ] && sleep 1 && exit 3; sleep 60"#,
        ])
        .output()
        .expect("launch starts");
    let seconds = start.elapsed().as_secs_f64();
    let (stdout, stderr) = (String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert_eq!(output.status.code(), Some(3), "the launcher exits with the failing rank's code:\n{stderr}");
    assert!(stderr.contains("rank 1 exited with code 3"), "the launcher names the failing rank:\n{stderr}");
    assert!(seconds < 20.0, "the others must be stopped at once, not after their 60 s sleep ({seconds:.1} s)");
    for rank in 0..3 {
        assert!(
            stdout.contains(&format!("[rank {rank}] I am {rank} of 3")),
            "each rank's output is prefixed with its rank:\n{stdout}"
        );
    }
}

/// Ranks that print at once still leave whole lines, each under its own
/// prefix: the launcher writes a line at a time.
#[cfg(unix)]
#[test]
fn lines_printed_at_once_by_several_ranks_never_interleave() {
    let _serial = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let output = Command::new(env!("CARGO_BIN_EXE_launch"))
        .args([
            "--nproc-per-node",
            "4",
            "--",
            "sh",
            "-c",
            r#"i=0; while [ $i -lt 300 ]; do echo "line of $RANK"; i=$((i+1)); done"#,
        ])
        .output()
        .expect("launch starts");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let stdout = String::from_utf8_lossy(&output.stdout);
    for line in stdout.lines() {
        let whole = (0..4).any(|rank| line == format!("[rank {rank}] line of {rank}"));
        assert!(whole, "a line mixes ranks or lost its prefix: {line:?}");
    }
    assert_eq!(stdout.lines().count(), 4 * 300, "every line arrives");
}

/// `kill -9` of one rank's process mid-training ends the job within seconds,
/// with the rank named, and the last checkpoint intact.
#[cfg(target_os = "linux")]
#[test]
fn killing_a_rank_ends_the_job_naming_it() {
    let _serial = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = scratch("killed");
    let job = train(&dir, 100_000, &["--nproc", "2", "--log-every", "1"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let rank_1 = wait_for(|| rank_pid(job.id(), 1), Duration::from_secs(60)).expect("rank 1 starts");
    std::thread::sleep(Duration::from_millis(500)); // into training
    let killed = Instant::now();
    Command::new("kill").args(["-9", &rank_1.to_string()]).status().unwrap();
    let output = job.wait_with_output().unwrap();
    let seconds = killed.elapsed().as_secs_f64();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "the job must fail when a rank dies");
    assert!(stderr.contains("rank 1 was killed by signal 9"), "the launcher names the dead rank:\n{stderr}");
    assert!(seconds < 10.0, "the job took {seconds:.1} s to end after rank 1 died");
}

/// The pid of the child of `launcher` whose `RANK` is `rank`.
#[cfg(target_os = "linux")]
fn rank_pid(launcher: u32, rank: usize) -> Option<u32> {
    let want = format!("RANK={rank}");
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|entry| {
        let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
        let stat = std::fs::read_to_string(entry.path().join("stat")).ok()?;
        let parent: u32 = stat.rsplit(')').next()?.split_whitespace().nth(1)?.parse().ok()?;
        let environ = std::fs::read(entry.path().join("environ")).ok()?;
        let is_rank = environ.split(|&b| b == 0).any(|var| var == want.as_bytes());
        (parent == launcher && is_rank).then_some(pid)
    })
}

fn wait_for<T>(mut probe: impl FnMut() -> Option<T>, limit: Duration) -> Option<T> {
    let start = Instant::now();
    while start.elapsed() < limit {
        if let Some(found) = probe() {
            return Some(found);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    None
}

/// A save slower than the collective timeout is not a stuck rank: rank 0
/// says it is busy, and rank 1 waits for it in the save's barrier.
#[test]
fn a_checkpoint_write_slower_than_the_timeout_does_not_end_the_job() {
    let _serial = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = scratch("slow-save");
    let start = Instant::now();
    succeed(train(&dir, 3, &["--nproc", "2", "--timeout", "2"]).env("WORKBOOK_INJECT", "save-delay-ms=5000"));
    assert!(start.elapsed() > Duration::from_secs(5), "the injected slow save did not happen");
    assert_eq!(checkpoints::steps(&dir).unwrap(), [3]);
}

/// `--allreduce ring` runs exercise 16 inside every DDP step; on two ranks
/// (a + b = b + a) it must train to the bit as the backend's ring does.
#[test]
fn your_ring_all_reduce_trains_as_the_backends_does() {
    let _serial = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let (yours, backend) = (scratch("own-ring"), scratch("backend-ring"));
    let output = succeed(&mut train(&yours, 3, &["--nproc", "2", "--allreduce", "ring"]));
    assert!(
        String::from_utf8_lossy(&output.stdout).contains("all-reduce (--allreduce ring)"),
        "the ring is not in use"
    );
    succeed(&mut train(&backend, 3, &["--nproc", "2"]));
    assert!(final_weights(&yours, 3) == final_weights(&backend, 3), "exercise 16's ring trained to other weights");
}

/// `--trace` leaves one Chrome trace of every rank: its steps on the main
/// thread, its collectives on its communication thread.
#[test]
fn a_traced_run_leaves_one_timeline_of_every_rank() {
    let _serial = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = scratch("trace");
    succeed(&mut train(&dir, 3, &["--nproc", "2", "--trace"]));
    let trace: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("trace.json")).expect("trace.json")).unwrap();
    let events = trace["traceEvents"].as_array().unwrap();
    let spans = |rank: u64, category: &str| -> Vec<String> {
        let of = |e: &&serde_json::Value| e["pid"] == rank && e["cat"] == category && e["ph"] == "X";
        events.iter().filter(of).map(|e| e["name"].as_str().unwrap().to_string()).collect()
    };
    for rank in 0..2 {
        assert_eq!(spans(rank, "compute"), ["step 1", "step 2", "step 3"], "rank {rank}'s steps");
        assert!(spans(rank, "comm").iter().any(|name| name.starts_with("all_reduce")), "rank {rank}'s all-reduces");
        assert_eq!(spans(rank, "io").len(), 1, "rank {rank}'s one save");
    }
    assert!(!dir.join("trace-rank1.json").exists(), "the per-rank parts are merged and removed");
}

/// Under FSDP the startup line gives what this rank holds of the model
/// states (sharded parameters, gradients and moments), the figure the ledger
/// counts at the end, not the unsharded model's.
#[test]
fn fsdp_startup_line_gives_the_model_states_this_rank_holds() {
    let _serial = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = scratch("fsdp-startup-memory");
    let output = succeed(&mut train(&dir, 3, &["--nproc", "2", "--strategy", "fsdp"]));
    let stdout = String::from_utf8_lossy(&output.stdout);
    let line = |marker: &str| {
        stdout.lines().find(|l| l.contains(marker)).unwrap_or_else(|| panic!("no {marker:?} in:\n{stdout}"))
    };
    let number = |text: Option<&str>| text.and_then(|t| t.parse::<f64>().ok()).expect("a figure in MiB");
    let marker = " MiB for parameters + gradients + AdamW state";
    let startup = number(line(marker).split(marker).next().and_then(|head| head.split_whitespace().last()));
    let marker = "= model states";
    let ledger = number(line(marker).split(marker).nth(1).and_then(|tail| tail.split_whitespace().next()));
    assert!((startup - ledger).abs() < 0.1, "the startup line says {startup} MiB, the ledger {ledger} MiB:\n{stdout}");
}

/// On a mesh the startup line gives what this rank holds: ZeRO-1 on 2
/// replicas keeps whole f32 parameters and gradients (8 of DDP's 16 bytes
/// per parameter) and half of AdamW's 8; tp 2 holds the root and half of
/// every block. FSDP's units in bf16 hold per element of their shards an
/// f32 master and two f32 moments (12 bytes) and a bf16 gradient, an f32 one
/// with --reduce-in-fp32: 14 bytes against 16, as the report at the end says.
#[test]
fn mesh_startup_line_gives_the_model_states_this_rank_holds() {
    let _serial = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let held = |name: &str, layout: &[&str]| -> (f64, f64) {
        let dir = scratch(name);
        let output = succeed(&mut train(&dir, 3, layout));
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        let marker = " MiB for parameters + gradients + AdamW state on this rank, ";
        let line = stdout.lines().find(|l| l.contains(marker)).unwrap_or_else(|| panic!("no startup line:\n{stdout}"));
        let mine = line.split(marker).next().and_then(|head| head.split_whitespace().last());
        let whole = line.split(marker).nth(1).and_then(|tail| tail.split_whitespace().next());
        let number = |text: Option<&str>| text.and_then(|t| t.parse::<f64>().ok()).expect("a figure in MiB");
        (number(mine), number(whole))
    };
    let (mine, whole) = held("zero1-startup-memory", &["--nproc", "2", "--strategy", "zero1"]);
    assert!((mine / whole - 0.75).abs() < 0.01, "ZeRO-1 on 2: {mine} of {whole} MiB, not 3/4");
    let (mine, whole) = held("tp-startup-memory", &["--nproc", "2", "--tp", "2"]);
    assert!(mine < 0.75 * whole && mine > 0.5 * whole, "tp 2: {mine} of {whole} MiB, not the root and half the blocks");
    // The report at the end gives the figure to 0.01 MiB, the startup line to 0.1.
    let reported = |name: &str, layout: &[&str]| -> f64 {
        let output = succeed(&mut train(&scratch(name), 3, layout));
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        let line =
            stdout.lines().find(|l| l.contains("= model states")).unwrap_or_else(|| panic!("no report:\n{stdout}"));
        line.split_whitespace().last().and_then(|t| t.parse().ok()).expect("a figure in MiB")
    };
    let fsdp_tp = ["--nproc", "4", "--strategy", "fsdp", "--tp", "2", "--precision", "bf16"];
    let bf16_grads = reported("fsdp-tp-bf16-memory", &fsdp_tp);
    let f32_grads = reported("fsdp-tp-bf16-f32-grads-memory", &[&fsdp_tp[..], &["--reduce-in-fp32"]].concat());
    assert!(
        (bf16_grads / f32_grads - 14.0 / 16.0).abs() < 0.01,
        "bf16 FSDP × TP 2: {bf16_grads} MiB with bf16 gradients, {f32_grads} MiB with f32 ones, not 14 : 16"
    );
}

/// `--prefetch` on two processes, whose collectives run on the TCP backend's
/// communication thread: the same collectives in another order (each block's
/// all-gather leaves before the block before it has reduce-scattered its
/// gradient), two blocks gathered at once instead of one, and the weights of
/// the run without it, to the bit; in f32, and in bf16, whose shards are cast
/// from the f32 master for the gather.
#[test]
fn fsdp_prefetching_reorders_the_gathers_and_changes_no_weight() {
    // A block of the tiny config is 0.77 MiB in f32.
    prefetching_reorders_the_gathers_and_changes_no_weight("fp32", 0.77);
}

#[test]
fn fsdp_prefetching_in_bf16_reorders_the_gathers_and_changes_no_weight() {
    prefetching_reorders_the_gathers_and_changes_no_weight("bf16", 0.38);
}

/// The test above in `precision`, where one block is `block_mib` MiB.
fn prefetching_reorders_the_gathers_and_changes_no_weight(precision: &str, block_mib: f64) {
    let _serial = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let run = |name: &str, extra: &[&str]| {
        let dir = scratch(&format!("{name}-{precision}"));
        let flags = [&["--nproc", "2", "--strategy", "fsdp", "--trace", "--precision", precision], extra].concat();
        let output = succeed(&mut train(&dir, 3, &flags));
        let trace: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("trace.json")).expect("trace.json")).unwrap();
        let mut comm: Vec<(f64, String)> = trace["traceEvents"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["pid"] == 0 && e["cat"] == "comm" && e["ph"] == "X")
            // The step's collectives; barriers and busy notes come with the save.
            .filter(|e| {
                ["all_gather", "reduce_scatter", "all_reduce"]
                    .iter()
                    .any(|c| e["name"].as_str().unwrap().starts_with(c))
            })
            .map(|e| (e["ts"].as_f64().unwrap(), e["name"].as_str().unwrap().split(" #").next().unwrap().to_string()))
            .collect();
        comm.sort_by(|a, b| a.0.total_cmp(&b.0));
        let peak = String::from_utf8_lossy(&output.stdout)
            .lines()
            .find_map(|l| l.split("gathered units, peak").nth(1).map(|v| v.trim().parse::<f64>().unwrap()))
            .expect("the ledger's gathered peak");
        (final_weights(&dir, 3), comm.into_iter().map(|(_, name)| name).collect::<Vec<_>>(), peak)
    };
    let (plain_weights, plain_order, plain_peak) = run("no-prefetch", &[]);
    let (weights, order, peak) = run("prefetch", &["--prefetch"]);
    assert!(weights == plain_weights, "prefetching changed the weights");
    let sorted = |names: &[String]| {
        let mut names = names.to_vec();
        names.sort();
        names
    };
    assert_eq!(sorted(&order), sorted(&plain_order), "prefetching must issue the same collectives");
    assert_ne!(order, plain_order, "prefetching left the collectives in the order of the run without it");
    // One block more is whole at once.
    assert!(
        (peak - plain_peak - block_mib).abs() < 0.02,
        "gathered peak {peak} MiB with prefetching, {plain_peak} without"
    );
}

/// `--max-restarts`: when a rank fails, the launcher starts every rank again
/// as the job's next round, while restarts are left; each rank learns its
/// round, and the last failure's code ends the job once none are left.
#[cfg(unix)]
#[test]
fn a_failed_rank_restarts_the_job_while_restarts_are_left() {
    let _serial = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let launch = |restarts: &str, script: &str| {
        Command::new(env!("CARGO_BIN_EXE_launch"))
            .args(["--nproc-per-node", "2", "--max-restarts", restarts, "--", "sh", "-c", script])
            .output()
            .expect("launch starts")
    };
    let once = r#"echo "round $WORKBOOK_ELASTIC_ROUND: $RANK of $WORLD_SIZE"; [ "$WORKBOOK_ELASTIC_ROUND$RANK" = 01 ] && exit 3; exit 0"#;
    let output = launch("1", once);
    let (stdout, stderr) = (String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert!(output.status.success(), "the second round succeeds, and so does the job:\n{stderr}");
    assert!(stderr.contains("rank 1 exited with code 3"), "the launcher names the failed rank:\n{stderr}");
    assert!(stderr.contains("round 1: 1 node, 2 ranks") && stderr.contains("(restart 1 of 1)"), "{stderr}");
    for rank in 0..2 {
        assert!(stdout.contains(&format!("[rank {rank}] round 1: {rank} of 2")), "rank {rank} runs again:\n{stdout}");
    }

    let always = r#"[ "$RANK" = 1 ] && exit 3; sleep 60"#;
    let start = Instant::now();
    let output = launch("2", always);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(3), "the job ends with the last failure's code:\n{stderr}");
    assert!(stderr.contains("round 2:") && !stderr.contains("round 3:"), "three rounds, no more:\n{stderr}");
    assert!(stderr.contains("no restarts left (--max-restarts 2)"), "{stderr}");
    assert!(start.elapsed() < Duration::from_secs(30), "rank 0 must be stopped at each failure, not waited for");
}

/// A rank that crashes mid-run, under `--max-restarts 1`: the job starts
/// again from its newest checkpoint and ends with the weights an
/// uninterrupted run reaches, to the bit.
#[cfg(unix)]
#[test]
fn a_job_restarted_after_a_crash_continues_from_its_checkpoint_to_the_same_weights() {
    let _serial = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let (restarted, whole) = (scratch("restarted"), scratch("uninterrupted"));
    let mut job = train_saving_every(&restarted, 8, 4, &["--nproc", "2", "--max-restarts", "1"]);
    let output = succeed(job.env("WORKBOOK_INJECT", "abort-at-step=6,fault-rank=1"));
    let (stdout, stderr) = (String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert!(stderr.contains("rank 1 was killed by signal 6"), "rank 1 should crash at step 6:\n{stderr}");
    assert!(stdout.contains("resumed from") && stdout.contains("at step 4"), "the restart resumes:\n{stdout}");
    succeed(&mut train(&whole, 8, &["--nproc", "2"]));
    assert!(final_weights(&restarted, 8) == final_weights(&whole, 8), "the restarted job trained to other weights");
}

/// `--nnodes 1:2`: two machines (launchers on loopback) train as one job
/// until machine 1 is lost at step 6; machine 0 goes on alone from the
/// checkpoint of step 4, at world size 1, with the same global batch, and
/// reaches the weights of a job that was never interrupted, up to the order
/// of additions.
#[cfg(target_os = "linux")]
#[test]
fn an_elastic_job_that_loses_a_machine_goes_on_with_the_rest_from_its_checkpoint() {
    let _serial = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let (elastic, whole) = (scratch("elastic"), scratch("elastic-uninterrupted"));
    let port = workbook::distributed::launch::free_port("127.0.0.1").unwrap().to_string();
    let node = |rank: &str, inject: &str| {
        let flags = ["--nnodes", "1:2", "--node-rank", rank, "--nproc", "1", "--master-port", &port];
        let more = ["--max-restarts", "1", "--last-call", "1"];
        train_saving_every(&elastic, 8, 4, &[&flags[..], &more].concat())
            .env("WORKBOOK_JOB_TOKEN", "a secret of this test's own")
            .env("WORKBOOK_INJECT", inject)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("a node starts")
    };
    let (lost, kept) = (node("1", "kill-launcher-at-step=6,fault-rank=1"), node("0", ""));
    let lost = lost.wait_with_output().unwrap();
    assert!(!lost.status.success(), "machine 1's launcher should have been killed");
    let kept = kept.wait_with_output().unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&kept.stdout), String::from_utf8_lossy(&kept.stderr));
    assert!(kept.status.success(), "machine 0 should finish the job alone:\n{stderr}");
    assert!(stderr.contains("round 1: 1 node, 1 rank;"), "machine 0 restarts alone:\n{stderr}");
    assert!(stdout.contains("at step 4"), "and resumes from the checkpoint of step 4:\n{stdout}");

    succeed(&mut train(&whole, 8, &["--nproc", "2"]));
    let load = |dir: &Path| {
        candle_core::safetensors::load(
            checkpoints::step_dir(dir, 8).join("model.safetensors"),
            &candle_core::Device::Cpu,
        )
        .unwrap()
    };
    let (got, want) = (load(&elastic), load(&whole));
    for (name, want) in &want {
        let diff = (&got[name] - want).unwrap().abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap();
        let scale = want.abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap();
        assert!(diff <= 1e-4 * scale.max(1.0), "`{name}` differs by {diff:e} from the uninterrupted job's");
    }
}

/// `--nnodes 1:2`: a job that started on machine 0 alone takes machine 1 in
/// when its launcher starts: the ranks start again as two, from the newest
/// checkpoint, and no restart is spent on it.
#[test]
fn a_machine_that_starts_later_joins_the_elastic_job_at_its_next_round() {
    let _serial = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = scratch("elastic-grows");
    let port = workbook::distributed::launch::free_port("127.0.0.1").unwrap().to_string();
    let node = |rank: &str| {
        let flags =
            ["--nnodes", "1:2", "--node-rank", rank, "--nproc", "1", "--master-port", &port, "--last-call", "1"];
        train_saving_every(&dir, 300, 20, &flags)
            .env("WORKBOOK_JOB_TOKEN", "a secret of this test's own")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("a node starts")
    };
    let first = node("0");
    let saved = wait_for(|| checkpoints::steps(&dir).ok().filter(|s| !s.is_empty()), Duration::from_secs(60));
    assert!(saved.is_some(), "machine 0 alone should have saved a checkpoint");
    let second = node("1");
    let (first, second) = (first.wait_with_output().unwrap(), second.wait_with_output().unwrap());
    let stderr = |o: &Output| String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(first.status.success() && second.status.success(), "{}\n{}", stderr(&first), stderr(&second));
    assert!(stderr(&first).contains("a node is waiting to join"), "{}", stderr(&first));
    assert!(stderr(&second).contains("2 nodes, 2 ranks; this node runs rank 1"), "{}", stderr(&second));
    assert!(String::from_utf8_lossy(&first.stdout).contains("resumed from"), "the two continue from the checkpoint");
    assert_eq!(checkpoints::steps(&dir).unwrap().last(), Some(&300));
}

/// A rank that fails after the job's last save makes the launcher restart a
/// job that is done: the restarted rank says so and succeeds.
#[test]
fn a_restart_after_the_last_save_has_nothing_to_train() {
    let dir = scratch("restart-when-done");
    succeed(&mut train(&dir, 3, &[]));
    let port = workbook::distributed::launch::free_port("127.0.0.1").unwrap().to_string();
    let rank = [("RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1"), ("WORKBOOK_ELASTIC_ROUND", "1")];
    let output = succeed(train(&dir, 3, &[]).envs(rank).env("MASTER_PORT", &port));
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.contains("the job reached step 3 before this restart: nothing is left to train"), "{stdout}");
}

/// `--nnodes MIN:MAX` without `--max-restarts`: as under torchrun, the first
/// failure (a lost machine is one for the others' ranks) ends the job, and
/// the launcher says what lets the job go on instead.
#[test]
fn an_elastic_range_without_restarts_ends_at_a_failure_and_says_why() {
    let _serial = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = scratch("elastic-no-restarts");
    let port = workbook::distributed::launch::free_port("127.0.0.1").unwrap().to_string();
    let flags = ["--nnodes", "1:2", "--nproc", "1", "--master-port", &port, "--last-call", "1"];
    let output = train(&dir, 6, &flags)
        .env("WORKBOOK_JOB_TOKEN", "a secret of this test's own")
        .env("WORKBOOK_INJECT", "abort-at-step=3,fault-rank=0")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "the crash should end the job:\n{stderr}");
    assert!(stderr.contains("--max-restarts is 0") && stderr.contains("give --max-restarts K"), "{stderr}");
}
