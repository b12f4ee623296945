//! The finished workbook really trains: loss falls on the bundled stories,
//! a resumed run continues where the first stopped, and the checkpoint generates text.
//! Needs finished exercises: run with `cargo test -p trainer --features solutions`.

mod common;
use common::scratch;

use std::path::PathBuf;

use trainer::checkpoints;
use trainer::compute::{Backend, DeviceKind};
use trainer::config::workbook_root;
use trainer::config::RunConfig;
use trainer::run::{train, RunOptions, Summary};
use trainer::strategy::{Layout, Strategy};
use workbook::data::{DataConfig, DatasetKind, SAMPLE_PATH};
use workbook::parallel::fsdp::{Precision, ShardingStrategy};
use workbook::parallel::pipeline::PipelineSchedule;
use workbook::parallel::DataAxis;

fn options(out_dir: PathBuf, max_steps: usize, nproc: usize) -> RunOptions {
    let mut config = RunConfig::load("tiny").unwrap();
    config.max_steps = max_steps;
    config.seq_len = 64;
    config.batch_size = 8;
    config.optimizer.warmup_steps = 2;
    let data = DataConfig {
        kind: DatasetKind::TinyStories,
        path: Some(workbook_root().unwrap().join(SAMPLE_PATH)),
        tokenizer: config.tokenizer,
        seq_len: config.seq_len,
        seed: 7,
    };
    RunOptions {
        config,
        data,
        nproc,
        device: DeviceKind::Cpu,
        autocast_bf16: false,
        batch_threads: 1,
        backend: Backend::Tcp,
        seed: 7,
        out_dir,
        checkpoint_every: 10,
        keep_checkpoints: 2,
        resume: None,
        overwrite: false,
        init_from: None,
        layout: Layout {
            activation_checkpointing: false,
            strategy: Strategy::Ddp,
            own_ring: false,
            powersgd_rank: None,
            ddp_overlap: false,
            prefetch: false,
            offload: false,
            bucket_bytes: workbook::parallel::ddp::DEFAULT_BUCKET_BYTES,
        },
        unverified_nccl: false,
        trace: false,
        eval_every: None,
        log_every: 10,
        timeout: workbook::distributed::DEFAULT_TIMEOUT,
    }
}

/// What `cargo train` checks is finished before it starts follows the flags:
/// the strategy's own exercises, and no other's.
#[test]
fn a_run_calls_the_exercises_its_flags_choose() {
    let called = |options: &RunOptions| trainer::needs::exercises_called(options).into_keys().collect::<Vec<_>>();
    let mut ddp = options(PathBuf::from("unused"), 1, 2);
    assert_eq!(called(&ddp), [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]);
    ddp.layout.own_ring = true;
    ddp.layout.powersgd_rank = Some(2);
    ddp.layout.ddp_overlap = true;
    ddp.init_from = Some(PathBuf::from("weights"));
    assert_eq!(called(&ddp), [1, 2, 3, 4, 5, 7, 8, 9, 11, 16, 18, 19]);
    let mut fsdp = options(PathBuf::from("unused"), 1, 2);
    fsdp.layout.strategy = plain_fsdp(Precision::Fp32);
    assert_eq!(called(&fsdp), [1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 13, 14, 15]);
    let mut pipeline = options(PathBuf::from("unused"), 1, 2);
    pipeline.layout.strategy = mesh(2, 1, PipelineSchedule::OneFOneB, false);
    assert_eq!(called(&pipeline), [1, 2, 3, 4, 5, 6, 7, 8, 9, 24, 25]);
    pipeline.layout.strategy = mesh(2, 2, PipelineSchedule::GPipe, false);
    assert_eq!(called(&pipeline), [1, 2, 3, 4, 5, 6, 7, 8, 9, 20, 21, 23, 25]);
    pipeline.layout.strategy = mesh(2, 2, PipelineSchedule::GPipe, true);
    assert_eq!(called(&pipeline), [1, 2, 3, 4, 5, 6, 7, 8, 9, 20, 21, 25, 27]);
    let mut zero1 = options(PathBuf::from("unused"), 1, 2);
    zero1.layout.strategy = Strategy::ZERO1;
    assert_eq!(called(&zero1), [1, 2, 3, 4, 5, 6, 7, 8, 9, 17]);
    zero1.layout.strategy = Strategy::ZERO2;
    assert_eq!(called(&zero1), [1, 2, 3, 4, 5, 6, 7, 8, 9, 17]);
    zero1.layout.strategy = mesh(1, 2, PipelineSchedule::OneFOneB, true);
    assert_eq!(called(&zero1), [1, 2, 3, 4, 5, 6, 7, 8, 9, 20, 25, 27]);
    zero1.layout.strategy = Strategy::YOUR_DDP;
    assert_eq!(called(&zero1), [1, 2, 3, 4, 5, 6, 7, 8, 9, 26]);
    zero1.layout.strategy = Strategy::Mesh {
        stages: 2,
        tp: 1,
        schedule: PipelineSchedule::GPipe,
        sequence_parallel: false,
        data: fsdp_units(ShardingStrategy::FullShard),
    };
    assert_eq!(called(&zero1), [1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 13, 14, 15, 21, 22, 25]);
}

/// FSDP's units as the data axis of a mesh, sharded as `sharding` says, in f32.
fn fsdp_units(sharding: ShardingStrategy) -> DataAxis {
    DataAxis::ShardBlocks { sharding, shard_group: None, precision: Precision::Fp32, reduce_in_f32: false }
}

/// `--strategy fsdp --precision P` alone: whole replicas, FULL_SHARD.
fn plain_fsdp(precision: Precision) -> Strategy {
    let data = DataAxis::ShardBlocks {
        sharding: ShardingStrategy::FullShard,
        shard_group: None,
        precision,
        reduce_in_f32: false,
    };
    Strategy::whole_replicas(data)
}

/// The mesh of `--pp stages --tp tp`, with `--sequence-parallel` when asked.
fn mesh(stages: usize, tp: usize, schedule: PipelineSchedule, sequence_parallel: bool) -> Strategy {
    Strategy::Mesh { stages, tp, schedule, sequence_parallel, data: DataAxis::Replicate }
}

/// With an evaluation every 10 steps the last windows are held out: the
/// loss on them falls, metrics.jsonl records it at the steps that measured
/// it (step 0: before the first), and a resume that would hold out another
/// tail is refused.
#[test]
fn held_out_loss_falls_and_a_resume_keeps_the_split() {
    let dir = scratch("held-out");
    let mut run = options(dir.clone(), 20, 1);
    run.eval_every = Some(10);
    let (before, after) = train(&run).unwrap().eval_loss.expect("an evaluation before and after");
    assert!(
        after < before - 1.0,
        "20 steps should cut the held-out loss by more than 1 nat: {before:.3} -> {after:.3}"
    );
    let records = trainer::metrics::read_log(&dir.join("metrics.jsonl")).unwrap();
    let evaluated: Vec<usize> = records.iter().filter(|r| r.eval_loss.is_some()).map(|r| r.step).collect();
    assert_eq!(evaluated, [0, 10, 20], "evaluated before the first step and every 10 steps");
    assert_eq!(records[0].eval_loss, Some(before), "step 0 records the loss before training");
    let mut without = options(dir.clone(), 25, 1);
    without.resume = Some(dir.clone());
    let error = train(&without).unwrap_err().to_string();
    assert!(error.contains("held out for evaluation"), "{error}");
}

#[test]
fn loss_falls_on_the_bundled_stories_and_resume_continues() {
    let dir = scratch("loss-falls");
    let first = train(&options(dir.clone(), 20, 1)).unwrap();
    let (start, end) = (first.first.unwrap().loss, first.last.unwrap().loss);
    assert!(end < start - 1.0, "20 steps should cut the loss by more than 1 nat: {start:.3} -> {end:.3}");
    assert_eq!(checkpoints::steps(&dir).unwrap(), vec![10, 20], "a checkpoint every 10 steps, the newest 2 kept");
    assert!(dir.join("loss.svg").is_file() && dir.join("metrics.jsonl").is_file());

    let mut more = options(dir.clone(), 25, 1);
    more.resume = Some(dir.clone());
    let resumed = train(&more).unwrap();
    assert_eq!(resumed.first.unwrap().step, 21, "the resumed run continues at step 21");
    assert_eq!(resumed.steps, 25);
}

#[test]
fn two_ranks_train_and_a_bad_batch_is_refused() {
    let summary = train(&options(scratch("two-ranks"), 3, 2)).unwrap();
    assert_eq!(summary.steps, 3);
    let mut odd = options(scratch("odd-batch"), 3, 3);
    odd.config.batch_size = 8;
    let err = train(&odd).unwrap_err().to_string();
    assert!(err.contains("does not divide across 3 data-parallel ranks"), "{err}");
}

/// `train` for 6 steps equals `train` for 3, then a new `train` process resuming for 3 more: bit for bit.
#[test]
fn resuming_in_a_new_process_reproduces_an_uninterrupted_run() {
    let run = |dir: &PathBuf, steps: usize, resume: bool| {
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_train"));
        command.args(["--model-size", "tiny", "--dataset", "dummy", "--seq-len", "32", "--batch-size", "4"]);
        command.args(["--warmup-steps", "2", "--max-steps", &steps.to_string(), "--checkpoint-every", "3"]);
        command.arg("--checkpoint-dir").arg(dir);
        if resume {
            command.arg("--resume");
        }
        let output = command.output().unwrap();
        assert!(output.status.success(), "train failed: {}", String::from_utf8_lossy(&output.stderr));
    };
    let (whole, split) = (scratch("whole"), scratch("split"));
    run(&whole, 6, false);
    run(&split, 3, false);
    run(&split, 6, true);
    let read = |dir: &PathBuf| std::fs::read(checkpoints::step_dir(dir, 6).join("model.safetensors")).unwrap();
    assert!(read(&whole) == read(&split), "the resumed run's parameters differ from the uninterrupted run's");
}

#[test]
fn fsdp_trains_on_two_ranks_in_bf16_and_its_checkpoint_resumes_under_ddp() {
    let dir = scratch("fsdp");
    let mut fsdp = options(dir.clone(), 20, 2);
    fsdp.layout.strategy = plain_fsdp(Precision::Bf16);
    let run = train(&fsdp).unwrap();
    let (start, end) = (run.first.unwrap().loss, run.last.unwrap().loss);
    assert!(end < start - 1.0, "20 FSDP steps should cut the loss by more than 1 nat: {start:.3} -> {end:.3}");

    // A sharded run's checkpoint holds whole tensors: one DDP process continues it.
    let mut more = options(dir.clone(), 22, 1);
    more.resume = Some(dir.clone());
    let resumed = train(&more).unwrap();
    assert_eq!(resumed.first.unwrap().step, 21);
}

/// `--precision bf16` and `fp16` on the units of a mesh (FSDP × PP 2, FSDP
/// × TP 2 on 4 ranks): they gather and compute in 16 bits from f32 master
/// shards, fp16 with its loss scaled, as plain FSDP's do. 16 bits keep 8
/// (bf16) or 11 (fp16) bits of mantissa, so no two orders of work agree to
/// f32's 1e-5; what a mesh must match is plain FSDP's distance, in the same
/// precision, from one f32 process after the same 3 steps (L2 over every
/// parameter; measured: bf16 0.167 for plain FSDP on 2 ranks, 0.170 on 4,
/// 0.167 and 0.169 for the two meshes; fp16 0.042, and 0.042 and 0.044):
/// within a quarter of it, and not much below it (a mesh that computed in
/// f32 would be 1e-5 away). The gradient norm is the true one (the loss
/// scale divided out), the same updates are skipped for an overflow, and
/// DDP resumes the f32 checkpoint.
#[test]
fn fsdp_on_a_mesh_trains_in_16_bits_as_plain_fsdp_does() {
    let (f32_dir, _) = run("16-bit-fsdp-f32", 3, 1, Strategy::Ddp, None);
    let truth = checkpoint_params(&f32_dir, 3);
    for precision in [Precision::Bf16, Precision::Fp16] {
        let (plain_dir, plain_run) = run(&format!("{precision}-fsdp-plain"), 3, 2, plain_fsdp(precision), None);
        let plain_error = l2_distance(&checkpoint_params(&plain_dir, 3), &truth);
        for (what, stages, tp) in [("pp2", 2, 1), ("tp2", 1, 2)] {
            let data = DataAxis::ShardBlocks {
                sharding: ShardingStrategy::FullShard,
                shard_group: None,
                precision,
                reduce_in_f32: false,
            };
            let strategy =
                Strategy::Mesh { stages, tp, schedule: PipelineSchedule::OneFOneB, sequence_parallel: false, data };
            let (dir, mesh_run) = run(&format!("{precision}-fsdp-{what}"), 3, 4, strategy, None);
            let error = l2_distance(&checkpoint_params(&dir, 3), &truth);
            assert!(
                (0.5 * plain_error..=1.25 * plain_error).contains(&error),
                "{precision} FSDP × {what} is {error:.4} from one f32 process after 3 steps (L2 over every \
                 parameter), plain {precision} FSDP on 2 ranks {plain_error:.4}"
            );
            // The loss scale divided back out before the norm: the same norm, not 2^16 times it.
            let (norm, plain_norm) = (mesh_run.first.unwrap().grad_norm, plain_run.first.as_ref().unwrap().grad_norm);
            assert!(
                (norm - plain_norm).abs() <= 1e-2 * plain_norm,
                "{precision} FSDP × {what}: the gradient norm at step 1 is {norm}, plain FSDP's {plain_norm}"
            );
            assert_eq!(
                mesh_run.skipped_updates, plain_run.skipped_updates,
                "{precision} FSDP × {what} skipped another number of updates for an overflow than plain FSDP"
            );
            if what == "pp2" && precision == Precision::Bf16 {
                let (resumed, _) = run("bf16-fsdp-pp2-resumed-by-ddp", 5, 1, Strategy::Ddp, Some(dir));
                assert!(checkpoints::step_dir(&resumed, 5).exists(), "DDP resuming bf16 FSDP × PP saved no step 5");
            }
        }
    }
}

/// The L2 norm of `a − b` over every parameter.
fn l2_distance(
    a: &std::collections::HashMap<String, candle_core::Tensor>,
    b: &std::collections::HashMap<String, candle_core::Tensor>,
) -> f64 {
    let squares = a.iter().map(|(name, t)| (t - &b[name]).and_then(|d| d.sqr()?.sum_all()?.to_scalar::<f32>()));
    squares.map(|s| s.unwrap() as f64).sum::<f64>().sqrt()
}

/// `--ddp-overlap` takes the same steps as DDP that all-reduces after
/// backward: only when the buckets travel changes.
#[test]
fn ddp_overlapped_with_backward_reaches_the_parameters_of_ddp_after_backward() {
    let run = |name: &str, overlap: bool| {
        let dir = scratch(name);
        let mut options = options(dir.clone(), 3, 2);
        options.config.grad_accum_steps = 2;
        options.layout.ddp_overlap = overlap;
        options.layout.bucket_bytes = 256 * 1024; // several buckets, so that they can overlap
        train(&options).unwrap();
        candle_core::safetensors::load(
            checkpoints::step_dir(&dir, 3).join("model.safetensors"),
            &candle_core::Device::Cpu,
        )
        .unwrap()
    };
    let (after, during) = (run("ddp-after", false), run("ddp-during", true));
    assert_eq!(after.len(), during.len());
    for (name, want) in &after {
        let got = &during[name];
        let diff = (got - want).unwrap().abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap();
        let scale = want.abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap();
        assert!(diff <= 1e-5 * scale.max(1.0), "`{name}` differs by {diff:e} after 3 overlapped steps");
    }
}

/// `--pp 2` takes the steps one process takes on either schedule, and so
/// does a pipeline of 2 stages replicated twice (dp 2 × pp 2 on 4 ranks); the
/// checkpoint, written whole by rank 0, resumes on one process.
#[test]
fn a_pipeline_of_two_stages_trains_as_one_process_and_resumes_under_ddp() {
    let run = |name: &str, nproc: usize, strategy: Strategy| {
        let dir = scratch(name);
        let mut options = options(dir.clone(), 3, nproc);
        options.config.grad_accum_steps = 4; // the pipeline's micro-batches
        options.layout.strategy = strategy;
        let summary = train(&options).unwrap();
        let params = candle_core::safetensors::load(
            checkpoints::step_dir(&dir, 3).join("model.safetensors"),
            &candle_core::Device::Cpu,
        )
        .unwrap();
        (dir, summary, params)
    };
    let (_, one, want) = run("one-process", 1, Strategy::Ddp);
    let runs = [(PipelineSchedule::GPipe, 2), (PipelineSchedule::OneFOneB, 2), (PipelineSchedule::GPipe, 4)];
    let dirs = runs.map(|(schedule, nproc)| {
        let what = format!("{schedule} pipeline of 2 stages on {nproc} ranks");
        let (dir, pipelined, got) = run(&format!("pipeline-{schedule}-{nproc}"), nproc, mesh(2, 1, schedule, false));
        let (a, b) = (one.last.as_ref().unwrap().loss, pipelined.last.unwrap().loss);
        assert!((a - b).abs() <= 1e-5 * a.abs(), "the {what}: loss at step 3 is {b}, one process's {a}");
        assert_eq!(got.len(), want.len(), "rank 0 should write every stage's parameters");
        for (name, want) in &want {
            let got = &got[name];
            let diff = (got - want).unwrap().abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap();
            let scale = want.abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap();
            assert!(diff <= 1e-5 * scale.max(1.0), "the {what}: `{name}` differs by {diff:e} after 3 steps");
        }
        dir
    });
    let dir = &dirs[2];

    let mut more = options(dir.clone(), 5, 1);
    more.config.grad_accum_steps = 4;
    more.resume = Some(dir.clone());
    assert_eq!(train(&more).unwrap().first.unwrap().step, 4, "one process continues the replicated pipeline's run");
}

/// `steps` steps of `strategy` on `nproc` ranks in a fresh directory named
/// after `name`, two micro-batches each and a checkpoint every 3 steps,
/// resuming from the checkpoint at step 3 of the run in `resume` when given:
/// the run's directory and summary.
fn run(name: &str, steps: usize, nproc: usize, strategy: Strategy, resume: Option<PathBuf>) -> (PathBuf, Summary) {
    let dir = scratch(name);
    let mut options = options(dir.clone(), steps, nproc);
    options.config.grad_accum_steps = 2; // a pipeline's micro-batches
    options.checkpoint_every = 3;
    options.layout.strategy = strategy;
    options.resume = resume.map(|from| checkpoints::step_dir(&from, 3));
    let summary = train(&options).unwrap();
    (dir, summary)
}

/// One process's 5-step run (DDP on one rank, f32), which the layouts'
/// checkpoints at steps 3 and 5 are compared with: trained once per test
/// binary, by the first test that asks. Its directory is only read and
/// resumed from, which writes into the resuming run's own.
fn one_process() -> (&'static PathBuf, &'static Summary) {
    static RUN: std::sync::OnceLock<(PathBuf, Summary)> = std::sync::OnceLock::new();
    let (dir, summary) = RUN.get_or_init(|| run("one-process-5-steps", 5, 1, Strategy::Ddp, None));
    (dir, summary)
}

/// The parameters of the checkpoint at `step` in `dir`.
fn checkpoint_params(dir: &std::path::Path, step: usize) -> std::collections::HashMap<String, candle_core::Tensor> {
    let file = checkpoints::step_dir(dir, step).join("model.safetensors");
    candle_core::safetensors::load(file, &candle_core::Device::Cpu).unwrap()
}

/// Fails naming the first parameter of `got` further than 1e-5 (relative) from `want`'s.
fn expect_same_params(
    got: &std::collections::HashMap<String, candle_core::Tensor>,
    want: &std::collections::HashMap<String, candle_core::Tensor>,
    what: &str,
) {
    assert_eq!(got.len(), want.len(), "{what}: the checkpoint should hold every parameter, whole");
    for (name, want) in want {
        let got = &got[name];
        let diff = (got - want).unwrap().abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap();
        let scale = want.abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap();
        assert!(diff <= 1e-5 * scale.max(1.0), "{what}: `{name}` differs by {diff:e}");
    }
}

/// `--tp 2` on 2 ranks and on 4 (dp 2 × tp 2) takes the steps one process
/// takes; its checkpoint holds whole tensors, moments included: one process
/// resuming it, and a tensor-parallel run resuming one process's, both
/// reach one uninterrupted process's parameters.
#[test]
fn tensor_parallel_runs_train_as_one_process_and_their_checkpoints_move_between_layouts() {
    let tp2 = mesh(1, 2, PipelineSchedule::GPipe, false);
    let (one_dir, one) = one_process();
    for nproc in [2, 4] {
        let (dir, summary) = run(&format!("tp-on-{nproc}"), 3, nproc, tp2, None);
        let (a, b) = (one.first.as_ref().unwrap().loss, summary.first.unwrap().loss);
        assert!((a - b).abs() <= 1e-5 * a.abs(), "tp 2 on {nproc} ranks: loss at step 1 is {b}, one process's {a}");
        expect_same_params(
            &checkpoint_params(&dir, 3),
            &checkpoint_params(one_dir, 3),
            &format!("tp 2 on {nproc} ranks, step 3"),
        );
        if nproc == 4 {
            let (resumed, _) = run("tp-resumed-by-one", 5, 1, Strategy::Ddp, Some(dir));
            expect_same_params(
                &checkpoint_params(&resumed, 5),
                &checkpoint_params(one_dir, 5),
                "one process resuming tp 2",
            );
        }
    }
    let (resumed, _) = run("one-resumed-by-tp", 5, 2, tp2, Some(one_dir.clone()));
    expect_same_params(&checkpoint_params(&resumed, 5), &checkpoint_params(one_dir, 5), "tp 2 resuming one process");
}

/// A pipeline of tensor-parallel stages, pp 2 × tp 2 on 4 ranks (GPipe) and
/// dp 2 × pp 2 × tp 2 on 8 (1F1B), takes the steps one process takes; its
/// checkpoint holds whole tensors, moments included: one process resuming
/// the 8-rank run's, and pp 2 × tp 2 resuming one process's, both reach one
/// uninterrupted process's parameters.
#[test]
fn a_pipeline_of_tensor_parallel_stages_trains_as_one_process_and_its_checkpoints_move_between_meshes() {
    let two_stages = |schedule, tp| mesh(2, tp, schedule, false);
    let (one_dir, one) = one_process();
    let runs = [(PipelineSchedule::GPipe, 4, "pp 2 × tp 2"), (PipelineSchedule::OneFOneB, 8, "dp 2 × pp 2 × tp 2")];
    let dirs = runs.map(|(schedule, nproc, what)| {
        let (dir, summary) = run(&format!("3d-on-{nproc}"), 3, nproc, two_stages(schedule, 2), None);
        let (a, b) = (one.first.as_ref().unwrap().loss, summary.first.unwrap().loss);
        assert!((a - b).abs() <= 1e-5 * a.abs(), "{what}: loss at step 1 is {b}, one process's {a}");
        expect_same_params(&checkpoint_params(&dir, 3), &checkpoint_params(one_dir, 3), &format!("{what}, step 3"));
        dir
    });
    let (resumed, _) = run("3d-resumed-by-one", 5, 1, Strategy::Ddp, Some(dirs[1].clone()));
    expect_same_params(
        &checkpoint_params(&resumed, 5),
        &checkpoint_params(one_dir, 5),
        "one process resuming dp 2 × pp 2 × tp 2",
    );
    let (resumed, _) = run("one-resumed-by-3d", 5, 4, two_stages(PipelineSchedule::GPipe, 2), Some(one_dir.clone()));
    expect_same_params(
        &checkpoint_params(&resumed, 5),
        &checkpoint_params(one_dir, 5),
        "pp 2 × tp 2 resuming one process",
    );
}

/// `--tp 2 --sequence-parallel` on 2 ranks and on 4 (dp 2 × tp 2), and
/// within the stages of a pipeline (pp 2 × tp 2), takes the steps one
/// process takes, and its checkpoint resumes on one process.
#[test]
fn sequence_parallel_runs_train_as_one_process() {
    let sp2 = mesh(1, 2, PipelineSchedule::GPipe, true);
    let (one_dir, _) = one_process();
    let (dir, _) = run("sp-in-stages", 3, 4, mesh(2, 2, PipelineSchedule::OneFOneB, true), None);
    let what = "pp 2 × tp 2 with sequence parallelism in each stage, step 3";
    expect_same_params(&checkpoint_params(&dir, 3), &checkpoint_params(one_dir, 3), what);
    for nproc in [2, 4] {
        let (dir, _) = run(&format!("sp-on-{nproc}"), 3, nproc, sp2, None);
        let what = format!("tp 2 with sequence parallelism on {nproc} ranks, step 3");
        expect_same_params(&checkpoint_params(&dir, 3), &checkpoint_params(one_dir, 3), &what);
        if nproc == 4 {
            let (resumed, _) = run("sp-resumed-by-one", 5, 1, Strategy::Ddp, Some(dir));
            let what = "one process resuming tp 2 with sequence parallelism";
            expect_same_params(&checkpoint_params(&resumed, 5), &checkpoint_params(one_dir, 5), what);
        }
    }
}

/// `--strategy zero1` on 2 ranks takes the steps DDP on 2 takes, clipping
/// included (every step here is clipped); its checkpoint holds whole
/// tensors under AdamW's names, so one process resumes it and ZeRO-1
/// resumes one process's, both reaching the uninterrupted run.
#[test]
fn zero1_trains_as_ddp_and_its_checkpoints_move_both_ways() {
    let (ddp_dir, ddp) = run("zero1-ddp", 5, 2, Strategy::Ddp, None);
    let (dir, zero1) = run("zero1-on-2", 3, 2, Strategy::ZERO1, None);
    let (a, b) = (ddp.first.as_ref().unwrap().grad_norm, zero1.first.as_ref().unwrap().grad_norm);
    assert!(a > 1.0, "the test's first step should be clipped (grad norm {a})");
    assert!((a - b).abs() <= 1e-5 * a, "ZeRO-1's gradient norm at step 1 is {b}, DDP's {a}");
    expect_same_params(&checkpoint_params(&dir, 3), &checkpoint_params(&ddp_dir, 3), "ZeRO-1 on 2 ranks, step 3");
    let (resumed, _) = run("zero1-resumed-by-ddp", 5, 2, Strategy::Ddp, Some(dir));
    expect_same_params(&checkpoint_params(&resumed, 5), &checkpoint_params(&ddp_dir, 5), "DDP resuming ZeRO-1");
    let (resumed, _) = run("ddp-resumed-by-zero1", 5, 2, Strategy::ZERO1, Some(ddp_dir.clone()));
    expect_same_params(&checkpoint_params(&resumed, 5), &checkpoint_params(&ddp_dir, 5), "ZeRO-1 resuming DDP");
}

/// `--strategy zero1` as the data-parallel axis of a mesh: dp 2 × tp 2,
/// dp 2 × pp 2 (1F1B) and dp 2 × pp 2 × tp 2 with sequence parallelism each
/// take the steps one process takes, clipping included (exercise 17's
/// reduce-scatter adds the squares over the tp and pp groups too); the
/// 8-rank run's checkpoint, moments gathered from the replicas, resumes on
/// one process.
#[test]
fn zero1_on_a_mesh_trains_as_one_process_and_its_checkpoint_resumes_on_one() {
    let zero1 = |stages, tp, schedule, sequence_parallel| Strategy::Mesh {
        stages,
        tp,
        schedule,
        sequence_parallel,
        data: DataAxis::ShardOptimizer,
    };
    let (one_dir, one) = one_process();
    let rows = [
        ("dp 2 × tp 2", 4, zero1(1, 2, PipelineSchedule::GPipe, false)),
        ("dp 2 × pp 2", 4, zero1(2, 1, PipelineSchedule::OneFOneB, false)),
        ("dp 2 × pp 2 × tp 2 with sequence parallelism", 8, zero1(2, 2, PipelineSchedule::GPipe, true)),
    ];
    for (what, nproc, strategy) in rows {
        let (dir, summary) = run(&format!("zero1-mesh-{nproc}-{what}").replace(' ', ""), 3, nproc, strategy, None);
        let (a, b) = (one.first.as_ref().unwrap().grad_norm, summary.first.unwrap().grad_norm);
        assert!((a - b).abs() <= 1e-5 * a, "ZeRO-1 on {what}: the gradient norm at step 1 is {b}, one process's {a}");
        expect_same_params(&checkpoint_params(&dir, 3), &checkpoint_params(one_dir, 3), &format!("ZeRO-1 on {what}"));
        if nproc == 8 {
            let (resumed, _) = run("zero1-mesh-resumed-by-one", 5, 1, Strategy::Ddp, Some(dir));
            let resumed_what = format!("one process resuming ZeRO-1 on {what}");
            expect_same_params(&checkpoint_params(&resumed, 5), &checkpoint_params(one_dir, 5), &resumed_what);
        }
    }
}

/// `--strategy zero2`: each of a step's two micro-batches reduce-scattered
/// as soon as its backward ends, alone on 2 ranks and as the data-parallel
/// axis of dp 2 × tp 2, takes the steps one process takes, clipping
/// included (the norm of the summed shards); ZeRO-1 resumes the 2-rank
/// run's checkpoint (the moments gathered whole) and reaches one process.
#[test]
fn zero2_trains_as_one_process_and_zero1_resumes_it() {
    let zero2_tp2 = Strategy::Mesh {
        stages: 1,
        tp: 2,
        schedule: PipelineSchedule::GPipe,
        sequence_parallel: false,
        data: DataAxis::ShardGradients,
    };
    let (one_dir, one) = one_process();
    for (what, nproc, strategy) in [("2 ranks", 2, Strategy::ZERO2), ("dp 2 × tp 2", 4, zero2_tp2)] {
        let (dir, summary) = run(&format!("zero2-on-{nproc}"), 3, nproc, strategy, None);
        let (a, b) = (one.first.as_ref().unwrap().grad_norm, summary.first.unwrap().grad_norm);
        assert!((a - b).abs() <= 1e-5 * a, "ZeRO-2 on {what}: the gradient norm at step 1 is {b}, one process's {a}");
        expect_same_params(&checkpoint_params(&dir, 3), &checkpoint_params(one_dir, 3), &format!("ZeRO-2 on {what}"));
        if nproc == 2 {
            let (resumed, _) = run("zero2-resumed-by-zero1", 5, 2, Strategy::ZERO1, Some(dir));
            let resumed_what = "ZeRO-1 resuming ZeRO-2 on 2 ranks";
            expect_same_params(&checkpoint_params(&resumed, 5), &checkpoint_params(one_dir, 5), resumed_what);
        }
    }
}

/// `--strategy fsdp --pp 2`: each stage's blocks FSDP units across the
/// replicas (exercise 22), on dp 2 × pp 2 with either schedule, takes the
/// steps one process takes, clipping included (the units' shards add their
/// squares over the replicas); one process resumes its checkpoint (the
/// units' shards and moments gathered whole), and it resumes one process's.
/// So do SHARD_GRAD_OP and NO_SHARD, whose units keep their parameters
/// whole: they send less than FULL_SHARD, which gathers each unit twice a
/// micro-batch.
#[test]
fn fsdp_on_a_pipeline_trains_as_one_process_and_its_checkpoints_move_both_ways() {
    let fsdp = |schedule, sharding| Strategy::Mesh {
        stages: 2,
        tp: 1,
        schedule,
        sequence_parallel: false,
        data: fsdp_units(sharding),
    };
    let (one_dir, one) = one_process();
    let mut sent = std::collections::HashMap::new();
    let layouts = [
        (PipelineSchedule::GPipe, ShardingStrategy::FullShard),
        (PipelineSchedule::OneFOneB, ShardingStrategy::FullShard),
        (PipelineSchedule::OneFOneB, ShardingStrategy::ShardGradOp),
        (PipelineSchedule::OneFOneB, ShardingStrategy::NoShard),
    ];
    for (schedule, sharding) in layouts {
        let (dir, summary) = run(&format!("fsdp-pp-{schedule}-{sharding}"), 3, 4, fsdp(schedule, sharding), None);
        let what = format!("FSDP ({sharding}) on dp 2 × pp 2 ({schedule})");
        let (a, b) = (one.first.as_ref().unwrap().grad_norm, summary.first.unwrap().grad_norm);
        assert!((a - b).abs() <= 1e-5 * a, "{what}: the gradient norm at step 1 is {b}, one process's {a}");
        expect_same_params(&checkpoint_params(&dir, 3), &checkpoint_params(one_dir, 3), &what);
        if (schedule, sharding) == (PipelineSchedule::OneFOneB, ShardingStrategy::ShardGradOp) {
            let (resumed, _) = run("fsdp-pp-resumed-by-one", 5, 1, Strategy::Ddp, Some(dir));
            let resumed_what = format!("one process resuming {what}");
            expect_same_params(&checkpoint_params(&resumed, 5), &checkpoint_params(one_dir, 5), &resumed_what);
        }
        if schedule == PipelineSchedule::OneFOneB {
            sent.insert(sharding, summary.sent_bytes_per_step);
        }
    }
    for kept_whole in [ShardingStrategy::ShardGradOp, ShardingStrategy::NoShard] {
        let (full, whole) = (sent[&ShardingStrategy::FullShard], sent[&kept_whole]);
        assert!(
            whole < 0.8 * full,
            "FSDP ({kept_whole}) on dp 2 × pp 2 sent {whole:.0} bytes a step, FULL_SHARD {full:.0}: parameters kept \
             whole are not gathered for each micro-batch"
        );
    }
    let (resumed, _) = run(
        "one-resumed-by-fsdp-pp",
        5,
        4,
        fsdp(PipelineSchedule::GPipe, ShardingStrategy::FullShard),
        Some(one_dir.clone()),
    );
    expect_same_params(
        &checkpoint_params(&resumed, 5),
        &checkpoint_params(one_dir, 5),
        "FSDP × PP resuming one process",
    );
}

/// `--strategy fsdp --sharding hybrid_shard --pp 2` on 8 ranks: each
/// stage's 4 replicas in 2 shard groups of 2 that are replicas of each other
/// (dp 4 × pp 2), takes the steps one process takes, and one process
/// resumes its checkpoint.
#[test]
fn hybrid_sharding_on_a_pipeline_trains_as_one_process() {
    let hsdp = Strategy::Mesh {
        stages: 2,
        tp: 1,
        schedule: PipelineSchedule::OneFOneB,
        sequence_parallel: false,
        data: DataAxis::ShardBlocks {
            sharding: ShardingStrategy::HybridShard,
            shard_group: Some(2),
            precision: Precision::Fp32,
            reduce_in_f32: false,
        },
    };
    let (one_dir, one) = one_process();
    let (dir, summary) = run("hsdp-pp", 3, 8, hsdp, None);
    let what = "HSDP (2 groups of 2) on dp 4 × pp 2";
    let (a, b) = (one.first.as_ref().unwrap().grad_norm, summary.first.unwrap().grad_norm);
    assert!((a - b).abs() <= 1e-5 * a, "{what}: the gradient norm at step 1 is {b}, one process's {a}");
    expect_same_params(&checkpoint_params(&dir, 3), &checkpoint_params(one_dir, 3), what);
    let (resumed, _) = run("hsdp-pp-resumed-by-one", 5, 1, Strategy::Ddp, Some(dir));
    let resumed_what = format!("one process resuming {what}");
    expect_same_params(&checkpoint_params(&resumed, 5), &checkpoint_params(one_dir, 5), &resumed_what);
}

/// `--strategy fsdp --tp 2`: each block's tensor-parallel shards an FSDP
/// unit across the replicas (FSDP × TP, with and without sequence
/// parallelism, and with a 1F1B pipeline: FSDP × TP × PP on 8 ranks), takes
/// the steps one process takes, clipping included (a unit's cut elements
/// add their squares over tp as well, its norms' once; under NO_SHARD each
/// replica's whole gradient counts once); one process resumes the 8-rank
/// run's checkpoint, and FSDP × TP resumes one process's.
#[test]
fn fsdp_with_tensor_parallelism_trains_as_one_process_and_its_checkpoints_move_both_ways() {
    let fsdp = |stages, sequence_parallel, sharding| Strategy::Mesh {
        stages,
        tp: 2,
        schedule: PipelineSchedule::OneFOneB,
        sequence_parallel,
        data: fsdp_units(sharding),
    };
    let (one_dir, one) = one_process();
    let layouts = [
        ("dp 2 × tp 2", 4, fsdp(1, false, ShardingStrategy::FullShard)),
        ("dp 2 × tp 2, NO_SHARD", 4, fsdp(1, false, ShardingStrategy::NoShard)),
        ("dp 2 × tp 2 with sequence parallelism, SHARD_GRAD_OP", 4, fsdp(1, true, ShardingStrategy::ShardGradOp)),
        ("dp 2 × pp 2 × tp 2 (1F1B)", 8, fsdp(2, false, ShardingStrategy::FullShard)),
    ];
    for (layout, nproc, strategy) in layouts {
        let (dir, summary) = run(&format!("fsdp-{nproc}-{}", layout.len()), 3, nproc, strategy, None);
        let what = format!("FSDP on {layout}");
        let (a, b) = (one.first.as_ref().unwrap().grad_norm, summary.first.unwrap().grad_norm);
        assert!((a - b).abs() <= 1e-5 * a, "{what}: the gradient norm at step 1 is {b}, one process's {a}");
        expect_same_params(&checkpoint_params(&dir, 3), &checkpoint_params(one_dir, 3), &what);
        if nproc == 8 {
            let (resumed, _) = run("fsdp-tp-pp-resumed-by-one", 5, 1, Strategy::Ddp, Some(dir));
            let resumed_what = format!("one process resuming {what}");
            expect_same_params(&checkpoint_params(&resumed, 5), &checkpoint_params(one_dir, 5), &resumed_what);
        }
    }
    let (resumed, _) =
        run("one-resumed-by-fsdp-tp", 5, 4, fsdp(1, false, ShardingStrategy::FullShard), Some(one_dir.clone()));
    let what = "FSDP × TP resuming one process";
    expect_same_params(&checkpoint_params(&resumed, 5), &checkpoint_params(one_dir, 5), what);
}

/// `--powersgd-rank 2` on a mesh: DDP × PP 2 compresses each stage's
/// matrices as plain DDP compresses the whole model's (each matrix's first
/// Q seeded by its name), so it takes plain DDP's PowerSGD steps on 2 ranks;
/// DDP × TP 2 compresses each rank's shards of the blocks, and sends less
/// than without it.
#[test]
fn powersgd_compresses_the_replicas_gradients_on_a_mesh() {
    let run_with = |name: &str, nproc, strategy, powersgd_rank| {
        let dir = scratch(name);
        let mut options = options(dir.clone(), 3, nproc);
        (options.config.grad_accum_steps, options.checkpoint_every) = (2, 3);
        (options.layout.strategy, options.layout.powersgd_rank) = (strategy, powersgd_rank);
        let summary = train(&options).unwrap();
        (dir, summary)
    };
    let (ddp_dir, ddp) = run_with("powersgd-ddp", 2, Strategy::Ddp, Some(2));
    let (pp_dir, pp) = run_with("powersgd-pp", 4, mesh(2, 1, PipelineSchedule::OneFOneB, false), Some(2));
    let what = "DDP × PP 2 with PowerSGD at rank 2";
    let (a, b) = (ddp.first.as_ref().unwrap().grad_norm, pp.first.unwrap().grad_norm);
    assert!((a - b).abs() <= 1e-5 * a, "{what}: the gradient norm at step 1 is {b}, plain DDP's with PowerSGD {a}");
    expect_same_params(&checkpoint_params(&pp_dir, 3), &checkpoint_params(&ddp_dir, 3), what);
    let tp = mesh(1, 2, PipelineSchedule::OneFOneB, false);
    let (_, whole) = run_with("powersgd-tp-whole", 4, tp, None);
    let (_, compressed) = run_with("powersgd-tp", 4, tp, Some(2));
    let (whole, compressed) = (whole.sent_bytes_per_step, compressed.sent_bytes_per_step);
    assert!(
        compressed < whole,
        "DDP × TP 2 sent {compressed:.0} bytes a step with PowerSGD at rank 2, {whole:.0} without: the replicas' \
         gradients should be compressed"
    );
}

/// `--own-ddp` on 2 ranks, the learner's DataParallel (exercise 26) running
/// each micro-batch and averaging the gradients, also over exercise 16's
/// ring, takes the steps DDP takes; DDP resumes its checkpoint.
#[test]
fn your_own_ddp_trains_as_ddp_and_its_checkpoint_resumes_under_ddp() {
    let (ddp_dir, ddp) = run("own-ddp-baseline", 5, 2, Strategy::Ddp, None);
    for own_ring in [false, true] {
        let name = format!("own-ddp{}", if own_ring { "-ring" } else { "" });
        let dir = scratch(&name);
        let mut options = options(dir.clone(), 3, 2);
        (options.config.grad_accum_steps, options.checkpoint_every) = (2, 3);
        (options.layout.strategy, options.layout.own_ring) = (Strategy::YOUR_DDP, own_ring);
        let own = train(&options).unwrap();
        let (a, b) = (ddp.first.as_ref().unwrap().grad_norm, own.first.unwrap().grad_norm);
        assert!((a - b).abs() <= 1e-5 * a, "{name}: the gradient norm at step 1 is {b}, DDP's {a}");
        expect_same_params(&checkpoint_params(&dir, 3), &checkpoint_params(&ddp_dir, 3), &format!("{name}, step 3"));
        if own_ring {
            let (resumed, _) = run("own-ddp-resumed-by-ddp", 5, 2, Strategy::Ddp, Some(dir));
            expect_same_params(&checkpoint_params(&resumed, 5), &checkpoint_params(&ddp_dir, 5), "DDP resuming it");
        }
    }
}

/// `--activation-checkpointing` in the mesh trainer's stages (blocks
/// recomputed in backward, split ones with their forward collectives)
/// changes no step: a pipeline of 2 stages, tp 2 and ZeRO-1 on 2 ranks each
/// reach one process's parameters.
#[test]
fn activation_checkpointing_in_mesh_stages_trains_as_one_process() {
    let (one_dir, _) = one_process();
    let strategies = [
        ("pp 2", mesh(2, 1, PipelineSchedule::OneFOneB, false)),
        ("tp 2", mesh(1, 2, PipelineSchedule::GPipe, false)),
        ("ZeRO-1", Strategy::ZERO1),
    ];
    for (what, strategy) in strategies {
        let dir = scratch(&format!("checkpointed-{what}").replace(' ', ""));
        let mut options = options(dir.clone(), 3, 2);
        (options.config.grad_accum_steps, options.layout.strategy, options.layout.activation_checkpointing) =
            (2, strategy, true);
        train(&options).unwrap();
        let what = format!("{what} with activation checkpointing, step 3");
        expect_same_params(&checkpoint_params(&dir, 3), &checkpoint_params(one_dir, 3), &what);
    }
}

/// `--offload` keeps FSDP's moments and f32 master shards in a file: in f32
/// (where each all-gather reads its shard back), in bf16 (where it casts
/// from it) and in the units of a pipeline's stages (FSDP × PP on 4 ranks),
/// its checkpoints, and a resumed run's, are the very bytes of a run
/// without it, and the file leaves no name behind.
#[test]
fn fsdp_offload_changes_no_bit_and_leaves_no_file() {
    let pipeline = Strategy::Mesh {
        stages: 2,
        tp: 1,
        schedule: PipelineSchedule::OneFOneB,
        sequence_parallel: false,
        data: fsdp_units(ShardingStrategy::FullShard),
    };
    for (what, strategy, nproc) in
        [("fp32", plain_fsdp(Precision::Fp32), 2), ("bf16", plain_fsdp(Precision::Bf16), 2), ("pp2", pipeline, 4)]
    {
        offload_changes_no_bit_and_leaves_no_file(what, strategy, nproc);
    }
}

fn offload_changes_no_bit_and_leaves_no_file(what: &str, strategy: Strategy, nproc: usize) {
    let (plain, _) = run(&format!("offload-plain-{what}"), 5, nproc, strategy, None);
    let offloaded = |name: &str, steps: usize, resume: Option<PathBuf>| {
        let dir = scratch(&format!("{name}-{what}"));
        let mut options = options(dir.clone(), steps, nproc);
        options.config.grad_accum_steps = 2;
        options.checkpoint_every = 3;
        options.layout.strategy = strategy;
        options.layout.offload = true;
        options.resume = resume.map(|from| checkpoints::step_dir(&from, 3));
        train(&options).unwrap();
        let left: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert!(
            left.iter().all(|name| !name.to_string_lossy().starts_with(".offload")),
            "an offload file's name is left in {}: {left:?}",
            dir.display()
        );
        dir
    };
    let first = offloaded("offload-first", 3, None);
    let resumed = offloaded("offload-resumed", 5, Some(first.clone()));
    for (dir, step) in [(&first, 3), (&resumed, 5)] {
        for file in ["model.safetensors", "optimizer.safetensors"] {
            let read = |dir: &PathBuf| std::fs::read(checkpoints::step_dir(dir, step).join(file)).unwrap();
            assert!(read(dir) == read(&plain), "{what}: step {step}'s {file} differs with --offload");
        }
    }
}

/// `--prefetch` on the units of a mesh: each unit's all-gather starts one
/// unit early, in forward and in backward, while the pipeline's schedule
/// and (with `--tp`) the split blocks' collectives run; FSDP × PP 2 and FSDP
/// × TP 2 × PP 2 write the very checkpoint bytes of runs without it.
#[test]
fn prefetching_on_a_mesh_changes_no_bit() {
    for (what, stages, tp, nproc) in [("pp2", 2, 1, 4), ("tp2-pp2", 2, 2, 8)] {
        let data = fsdp_units(ShardingStrategy::FullShard);
        let strategy =
            Strategy::Mesh { stages, tp, schedule: PipelineSchedule::OneFOneB, sequence_parallel: false, data };
        let (plain, _) = run(&format!("prefetch-plain-{what}"), 3, nproc, strategy, None);
        let dir = scratch(&format!("prefetch-{what}"));
        let mut options = options(dir.clone(), 3, nproc);
        (options.config.grad_accum_steps, options.checkpoint_every) = (2, 3);
        (options.layout.strategy, options.layout.prefetch) = (strategy, true);
        train(&options).unwrap();
        for file in ["model.safetensors", "optimizer.safetensors"] {
            let read = |dir: &PathBuf| std::fs::read(checkpoints::step_dir(dir, 3).join(file)).unwrap();
            assert!(read(&dir) == read(&plain), "FSDP × {what}: step 3's {file} differs with --prefetch");
        }
    }
}

/// FSDP's master weights are copies outside autograd. A shard that still
/// recorded the variables it was cut from would make every step's update
/// record the one before: the whole history stays in memory (at GPT-2
/// 124M's shape, 1.3 GB more per rank at every step until the job is killed).
#[test]
fn fsdp_master_weights_keep_no_autograd_history() {
    use candle_core::{DType, Device, Tensor};
    use workbook::distributed::{DeviceMesh, SingleProcess};
    use workbook::parallel::{MeshPlan, MeshTrainer};
    use workbook::train::Train;

    let config = RunConfig::load("tiny").unwrap();
    let params = workbook::init_params(&config.model, 0, &Device::Cpu).unwrap();
    let train_config = config.train_config(false);
    let mesh = DeviceMesh::data_parallel(Box::new(SingleProcess::new()));
    let plan = MeshPlan::replicas(fsdp_units(ShardingStrategy::FullShard));
    let mut trainer = MeshTrainer::new(&config.model, &params, train_config, mesh, plan).unwrap();
    drop(params);
    let tokens = Tensor::zeros((2, 16), DType::U32, &Device::Cpu).unwrap();
    for _ in 0..2 {
        trainer.train_step(std::slice::from_ref(&tokens)).unwrap();
    }
    let held = trainer.units().expect("FSDP units");
    for unit in held.units.iter() {
        let state = unit.local_state().unwrap();
        assert!(
            !state.params.track_op() && !unit.shard().unwrap().track_op(),
            "unit `{}`'s master weights still record the operations that made them",
            unit.name
        );
    }
}

/// The model run on a batch split across threads (parts of 2 and 3 rows)
/// gives the loss, logits and gradients of the whole batch, with and
/// without activation checkpointing: the parts' losses are weighted by their rows.
#[test]
fn a_forward_split_across_threads_gives_the_whole_batchs_loss_and_gradients() {
    use candle_core::{Device, Tensor};
    use workbook::parallel::threads::ThreadedGpt;
    use workbook::{init_params, Gpt};

    let max_diff =
        |a: &Tensor, b: &Tensor| (a - b).unwrap().abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap();
    let config = RunConfig::load("tiny").unwrap().model;
    let params = init_params(&config, 3, &Device::Cpu).unwrap();
    let tokens: Vec<u32> = (0..5 * 12u32).map(|i| (i * 37 + i * i) % config.vocab_size as u32).collect();
    let idx = Tensor::from_vec(tokens, (5, 12), &Device::Cpu).unwrap();
    for checkpointing in [false, true] {
        let gpt = Gpt::new(&config, &params).unwrap().with_activation_checkpointing(checkpointing);
        let whole = gpt.forward(&idx, Some(&idx)).unwrap();
        let split = ThreadedGpt::new(gpt).split_across(2).unwrap().forward(&idx, Some(&idx)).unwrap();
        let (want, got) = (whole.loss_value().unwrap(), split.loss_value().unwrap());
        assert!((got - want).abs() <= 1e-5, "checkpointing {checkpointing}: loss {got}, the whole batch's {want}");
        assert!(max_diff(&split.logits, &whole.logits) <= 1e-5, "checkpointing {checkpointing}: the logits differ");
        let (want, got) = (whole.backward().unwrap(), split.backward().unwrap());
        for (name, param) in params.iter() {
            let (want, got) = (want.get(param).unwrap(), got.get(param).unwrap());
            let scale = want.abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap();
            let diff = max_diff(got, want);
            assert!(diff <= 1e-4 * scale, "checkpointing {checkpointing}: `{name}`'s gradient differs by {diff:e}");
        }
    }
}

/// A run whose micro-batches are split across 3 threads (8 rows: parts of
/// 2, 3 and 3) takes the steps of a run that keeps them whole.
#[test]
fn a_run_with_its_batches_split_across_threads_takes_the_whole_batchs_steps() {
    let (whole_dir, whole) = run("batch-whole", 3, 1, Strategy::Ddp, None);
    let dir = scratch("batch-split");
    let mut options = options(dir.clone(), 3, 1);
    options.config.grad_accum_steps = 2;
    options.checkpoint_every = 3;
    options.batch_threads = 3;
    let split = train(&options).unwrap();
    let (got, want) = (split.last.unwrap().loss, whole.last.unwrap().loss);
    assert!((got - want).abs() <= 1e-5, "the split run's last loss is {got}, the whole run's {want}");
    expect_same_params(&checkpoint_params(&dir, 3), &checkpoint_params(&whole_dir, 3), "batches split across threads");
}
