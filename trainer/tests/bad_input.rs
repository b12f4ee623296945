//! Bad input gets one clear line that says what to do, before any work, and
//! never a panic. Needs finished exercises: run with
//! `cargo test -p trainer --features solutions`.

mod common;
use common::scratch;

use std::path::Path;
use std::process::Command;

/// `train` on dummy data into `dir`, a short run unless `args` say otherwise.
fn train(dir: &Path, args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_train"));
    command.args(["--seq-len", "32", "--batch-size", "4", "--warmup-steps", "1"]); // the tiny model by default
    command.arg("--checkpoint-dir").arg(dir).args(args).env("RAYON_NUM_THREADS", "1");
    command
}

/// Runs `command`, expects it to fail with `message` in its error, no panic and no step trained.
fn refused(mut command: Command, message: &str) {
    let output = command.output().expect("train starts");
    let (stdout, stderr) = (String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert_eq!(output.status.code(), Some(1), "expected an error exit for `{message}`:\n{stdout}\n{stderr}");
    assert!(stderr.contains(message), "expected `{message}` in the error, got:\n{stderr}");
    assert!(!stderr.contains("panicked"), "a panic instead of an error:\n{stderr}");
    assert!(!stdout.contains("step "), "it trained before refusing:\n{stdout}");
}

#[test]
fn hyperparameters_out_of_range_are_refused_before_any_step() {
    let dir = scratch("ranges");
    let dummy = ["--dataset", "dummy", "--max-steps", "3"];
    let with = |extra: &[&str]| train(&dir, &[&dummy[..], extra].concat());
    refused(train(&dir, &["--dataset", "dummy", "--max-steps", "0"]), "--max-steps must be at least 1");
    refused(with(&["--lr", "NaN"]), "optimizer setting lr = NaN (--lr, or the config's) must be a positive number");
    refused(with(&["--lr", "inf"]), "optimizer setting lr = inf (--lr, or the config's) must be a positive number");
    refused(with(&["--lr=-0.001"]), "optimizer setting lr = -0.001 (--lr, or the config's) must be a positive number");
    // A negative number is a value, not a flag: its parser says what is wrong with it.
    refused(
        with(&["--lr", "-0.001"]),
        "optimizer setting lr = -0.001 (--lr, or the config's) must be a positive number",
    );
    refused_argument(train(&dir, &["--dataset", "dummy", "--max-steps", "-1"]), "invalid value '-1' for '--max-steps");
}

#[test]
fn a_config_file_out_of_range_is_refused() {
    let dir = scratch("config");
    std::fs::create_dir_all(&dir).unwrap();
    let tiny = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs/tiny.toml")).unwrap();
    let mut cases = vec![
        ("norm_eps", "-1e-5", "norm_eps must be a positive number, not -0.00001"),
        ("rope_theta", "0.0", "rope_theta must be a positive number, not 0"),
        ("beta1", "1.5", "optimizer setting beta1 = 1.5 (in the config file) must be in [0, 1)"),
        (
            "max_grad_norm",
            "-1.0",
            "optimizer setting max_grad_norm = -1 (in the config file) must be a positive number",
        ),
        // Unknown keys are refused, by name, with the ones that exist.
        ("bias", "false\nnum_head = 4", "unknown field `num_head`, expected one of"),
    ];
    // Sizes that cannot fit are refused before anything is allocated, not
    // aborted in the allocator (where the OS says how much memory is free).
    if workbook::memory::available_memory().is_some() {
        cases.push(("hidden_size", "1000000", "for parameters, gradients and AdamW state"));
        cases.push(("max_seq_len", "1000000000", "for the rotary tables of max_seq_len 1000000000"));
        // Counted without listing a hundred million layers' tensors first.
        cases.push(("num_layers", "100000000", "for parameters, gradients and AdamW state"));
    }
    for (key, bad, message) in cases {
        let line =
            tiny.lines().find(|l| l.starts_with(&format!("{key} ="))).unwrap_or_else(|| panic!("{key} in tiny.toml"));
        let config = dir.join(format!("{key}.toml"));
        std::fs::write(&config, tiny.replace(line, &format!("{key} = {bad}"))).unwrap();
        refused(train(&dir, &["--model-size", config.to_str().unwrap(), "--dataset", "dummy"]), message);
    }
}

/// Sizes the run multiplies are counted before anything is allocated: a
/// billion micro-batches per step is refused by the flag that asks for it,
/// not found out by the operating system's out-of-memory killer.
#[test]
fn a_step_too_large_for_the_machine_is_refused_by_its_flag() {
    if workbook::memory::available_memory().is_none() {
        return; // the OS does not say how much memory is free
    }
    let dir = scratch("runaway");
    let dummy = ["--dataset", "dummy", "--max-steps", "3"];
    let with = |extra: &[&str]| train(&dir, &[&dummy[..], extra].concat());
    refused(with(&["--grad-accum", "1000000000"]), "choose a smaller --grad-accum than 1000000000");
    refused(
        with(&["--grad-accum", "1000000000", "--nproc", "2"]),
        "micro-batches (--grad-accum), on each of the 2 ranks on this machine",
    );
    let mut wide = Command::new(env!("CARGO_BIN_EXE_train"));
    wide.args(["--dataset", "dummy", "--batch-size", "4000000", "--seq-len", "32", "--checkpoint-dir"]).arg(&dir);
    refused(wide, "choose a smaller --batch-size or --seq-len");
}

/// A config path that is not there is named as a path, not taken for an
/// unknown model size.
#[test]
fn a_missing_config_file_is_named() {
    let dir = scratch("no-config");
    refused(
        train(&dir, &["--model-size", "/nonexistent/run.toml", "--dataset", "dummy"]),
        "there is no config file at /nonexistent/run.toml",
    );
    refused(train(&dir, &["--model-size", "huge", "--dataset", "dummy"]), "unknown model size `huge`");
}

#[test]
fn flags_that_do_not_apply_are_refused() {
    let dir = scratch("flags");
    refused(
        train(&dir, &["--dataset", "dummy", "--sharding", "no_shard"]),
        "--sharding applies to --strategy fsdp only",
    );
    refused(train(&dir, &["--dataset", "dummy", "--precision", "bf16"]), "--precision applies to --strategy fsdp only");
    let fp32_reduce = ["--dataset", "dummy", "--strategy", "fsdp", "--precision", "fp32", "--reduce-in-fp32"];
    refused(train(&dir, &fp32_reduce), "--precision fp32 reduces the gradients in fp32 already");
    let bf16_ddp_mesh = ["--dataset", "dummy", "--tp", "2", "--nproc", "2", "--precision", "bf16"];
    refused(train(&dir, &bf16_ddp_mesh), "--precision applies to --strategy fsdp only");
    refused(
        train(&dir, &["--dataset", "dummy", "--data-path", "stories.txt"]),
        "--data-path is not read with --dataset dummy",
    );
    refused(
        train(&dir, &["--dataset", "dummy", "--pp", "2", "--nproc", "3"]),
        "--pp 2: 3 ranks do not make whole replicas of 2 pipeline stages × 1 tensor-parallel rank (2 ranks each): give --nproc",
    );
    refused(
        train(
            &dir,
            &["--dataset", "dummy", "--pp", "2", "--nproc", "4", "--strategy", "fsdp", "--sharding", "hybrid_shard"],
        ),
        "--sharding hybrid_shard with --pp 2 needs --hybrid-group-size",
    );
    refused(
        train(
            &dir,
            &["--dataset", "dummy", "--pp", "2", "--nproc", "2", "--strategy", "fsdp", "--activation-checkpointing"],
        ),
        "--activation-checkpointing with --strategy fsdp: each FSDP unit is recomputed in backward already",
    );
    refused(
        train(&dir, &["--dataset", "dummy", "--pp", "2", "--nproc", "2", "--sharding", "full_shard"]),
        "--sharding applies to --strategy fsdp only; ddp keeps whole f32 replicas",
    );
    refused(
        train(&dir, &["--dataset", "dummy", "--strategy", "fsdp", "--sharding", "no_shard", "--prefetch"]),
        "--prefetch gathers the next FSDP unit early; --sharding no_shard keeps every unit's parameters whole, so \
         nothing is gathered: drop --prefetch",
    );
    refused(
        train(&dir, &["--dataset", "dummy", "--pp", "2", "--dp", "2", "--nproc", "2"]),
        "--dp 2: the mesh dp 2 × pp 2 × tp 1 needs 4 ranks, but the job has 2",
    );
    refused(
        train(&dir, &["--dataset", "dummy", "--tp", "3", "--nproc", "3"]),
        "--tp 3: the model's 4 heads do not split evenly across 3 ranks: use a --tp that divides 4",
    );
    refused(
        train(&dir, &["--dataset", "dummy", "--tp", "2", "--nproc", "3"]),
        "--tp 2: 3 ranks do not make whole replicas of 1 pipeline stage × 2 tensor-parallel ranks (2 ranks each): give --nproc",
    );
    refused(
        train(&dir, &["--dataset", "dummy", "--ddp-overlap", "--strategy", "fsdp"]),
        "--ddp-overlap applies to --strategy ddp only (it all-reduces DDP's buckets during backward), not to \
         --strategy fsdp",
    );
    refused(
        train(&dir, &["--dataset", "dummy", "--powersgd-rank", "2", "--strategy", "zero1"]),
        "--powersgd-rank applies to --strategy ddp only (it compresses DDP's all-reduces), not to --strategy zero1",
    );
    refused(train(&dir, &["--dataset", "dummy", "--offload"]), "--offload applies to --strategy fsdp only");
    refused(
        train(&dir, &["--dataset", "dummy", "--strategy", "zero1", "--nproc", "2", "--bucket-cap-mb", "1"]),
        "--bucket-cap-mb sizes DDP's all-reduces; --strategy zero1 has none",
    );
    refused(
        train(&dir, &["--dataset", "dummy", "--strategy", "zero2", "--pp", "2", "--nproc", "2"]),
        "--strategy zero2 with --pp 2: ZeRO-2 reduce-scatters each micro-batch's gradient as soon as its backward ends",
    );
    refused(
        train(&dir, &["--dataset", "dummy", "--own-ddp", "--strategy", "zero1"]),
        "--own-ddp applies to --strategy ddp only (your exercise 26 is a DDP), not to --strategy zero1",
    );
    let mut odd_sequences = Command::new(env!("CARGO_BIN_EXE_train"));
    odd_sequences.args(["--seq-len", "33", "--dataset", "dummy", "--tp", "2", "--nproc", "2", "--sequence-parallel"]);
    odd_sequences.arg("--checkpoint-dir").arg(&dir);
    refused(
        odd_sequences,
        "--sequence-parallel cuts each sequence of 33 tokens into 2 chunks, one per tensor-parallel rank: use a \
         --seq-len that 2 divides",
    );
}

/// An elastic job's node range must make sense, and its batch must divide
/// across every world size the job may shrink or grow to.
#[test]
fn an_elastic_job_that_could_not_run_at_some_size_is_refused() {
    let dir = scratch("elastic-flags");
    let output = train(&dir, &["--dataset", "dummy", "--nnodes", "3:2"]).output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "--nnodes 3:2 should be refused");
    assert!(stderr.contains("3:2 asks for more machines at least (3) than at most (2)"), "{stderr}");
    // The batch of 4 fits 1, 2 and 4 machines, not 3.
    let elastic = ["--dataset", "dummy", "--nnodes", "1:4", "--nproc", "1", "--master-port", "29599"];
    refused(
        train(&dir, &elastic),
        "the batch size, 4 (--batch-size, or the config's), does not divide across 3 data-parallel ranks",
    );
}

/// A GPU asked of a build without CUDA says how to get one; NCCL needs GPUs.
/// (This suite builds without the `cuda` feature.)
#[test]
fn gpu_flags_say_what_they_need() {
    let dir = scratch("gpu-flags");
    refused(
        train(&dir, &["--dataset", "dummy", "--device", "cuda"]),
        "this build has no CUDA; rebuild with `--features cuda`",
    );
    refused(
        train(&dir, &["--dataset", "dummy", "--backend", "nccl"]),
        "--backend nccl moves tensors between GPUs: add --device cuda",
    );
    refused(
        train(&dir, &["--dataset", "dummy", "--tf32"]),
        "--tf32 changes how GPUs multiply f32 matrices: add --device cuda",
    );
    refused(train(&dir, &["--dataset", "dummy", "--autocast-bf16"]), "--autocast-bf16 is for GPUs");
}

/// Resuming at or past --max-steps has nothing to do, and says so instead of exiting 0.
#[test]
fn resuming_with_nothing_left_to_train_says_so() {
    let dir = scratch("nothing-left");
    let first = train(&dir, &["--dataset", "dummy", "--max-steps", "2"]).output().unwrap();
    assert!(first.status.success(), "{}", String::from_utf8_lossy(&first.stderr));
    refused(
        train(&dir, &["--dataset", "dummy", "--max-steps", "2", "--resume"]),
        "is at step 2 and --max-steps is 2: nothing to train; raise --max-steps to continue",
    );
}

/// Runs `command`, expects clap to refuse an argument (exit 2) with `message`, and no panic.
fn refused_argument(mut command: Command, message: &str) {
    let output = command.output().expect("the program starts");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "expected an argument error for `{message}`:\n{stderr}");
    assert!(stderr.contains(message), "expected `{message}` in the error, got:\n{stderr}");
}

/// Waits of 0 s, a port of 0 and a job across machines without a secret
/// cannot work: they are refused before anything starts.
#[test]
fn launcher_settings_that_cannot_work_are_refused() {
    let dir = scratch("launcher");
    refused_argument(train(&dir, &["--dataset", "dummy", "--timeout", "0"]), "0 seconds would fail every wait");
    refused_argument(
        train(&dir, &["--dataset", "dummy", "--master-port", "0"]),
        "0 is not a port the other nodes can reach",
    );
    let mut two_machines = train(&dir, &["--dataset", "dummy", "--nnodes", "2", "--master-port", "29597"]);
    two_machines.env_remove("WORKBOOK_JOB_TOKEN");
    refused(two_machines, "needs a secret that only its nodes know");
    let mut guessable = train(&dir, &["--dataset", "dummy", "--nnodes", "2", "--master-port", "29597"]);
    guessable.env("WORKBOOK_JOB_TOKEN", "a");
    refused(guessable, "holds a token of 1 characters, which could be guessed: use at least 16");
}

/// Counts that 0 would make meaningless are refused by clap, not quietly
/// read as 1.
#[test]
fn counts_of_zero_are_refused() {
    let dir = scratch("zeros");
    for flag in ["--checkpoint-every", "--keep-checkpoints", "--log-every"] {
        refused_argument(train(&dir, &["--dataset", "dummy", flag, "0"]), "give a whole number of 1 or more");
    }
}

/// A batch needs that many different windows.
#[test]
fn a_batch_larger_than_the_data_is_refused() {
    let dir = scratch("small-data");
    std::fs::create_dir_all(&dir).unwrap();
    let text = dir.join("short.txt");
    std::fs::write(&text, "Once upon a time there was a tiny story. ".repeat(2)).unwrap(); // 82 bytes
    let mut command = train(&dir, &["--dataset", "tinystories", "--max-steps", "2"]);
    command.arg("--data-path").arg(&text);
    refused(command, "the data makes 2 windows of 32 tokens, fewer than one batch of 4");
}

/// Temperatures that would sample uniformly, invert the distribution or
/// mean nothing are refused by name.
#[test]
fn a_temperature_that_is_not_one_is_refused() {
    for bad in ["inf", "NaN", "-0.5"] {
        let mut infer = Command::new(env!("CARGO_BIN_EXE_infer"));
        infer.arg(format!("--temperature={bad}"));
        refused_argument(infer, &format!("`{bad}` is not a temperature"));
    }
}
