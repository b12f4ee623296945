//! Exercise 26: your own DDP, graded from outside. Every rank starts from
//! parameters of its own and trains on batches of its own; the gradients
//! are compared with one process running the model on every rank's data
//! from rank 0's parameters, and the process group records every
//! collective: its size, whether it blocked, and how far backward had got
//! when it started and when its result was waited for.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use candle_core::{Device, Result, Tensor};
use rstest::rstest;
use workbook::autograd::Gradients;
use workbook::distributed::{spawn_with_timeout, CpuProcessGroup, ProcessGroup, WithOverride};
use workbook::model::gradients_handed_over;
use workbook::phase4_under_the_hood::DataParallel;
use workbook::{init_params, Gpt, GptConfig, ParamStore};

use crate::all_reduce_log::{calls_in, said, started_in, waits, AllReduceLog, Event};
use crate::process_ranks::on_processes;
use crate::support::{cause, explain_error, first_mismatch, mistake, number};

const TIMEOUT: Duration = Duration::from_secs(20);
/// Micro-batches per step where one count will do: the first accumulates,
/// the second syncs. The gradients and the traffic are checked at 1, 2 and 3.
const MICRO_BATCHES: usize = 2;
/// 4,000 bytes. The 21 gradients, in the order backward finishes them, make
/// buckets of 1,040, 1,040, 1,168, 1,040 and 1,424 f32 elements, full after
/// 3, 7, 12, 16 and 21 gradients. A cap read as 4,000 elements would make
/// two buckets, and no cap at all one: three outputs apart.
const CAP: usize = 4000;
const BUCKETS: [usize; 5] = [1040, 1040, 1168, 1040, 1424];
/// The buckets a cap of 4,000 elements makes: full after 14 gradients, then the rest.
const BUCKETS_OF_CAP_IN_ELEMENTS: [usize; 2] = [4016, 1696];
const FULL_AFTER: [u64; 5] = [3, 7, 12, 16, 21];
const GRADIENTS: u64 = 21;
const ELEMENTS: usize = 5712;

/// Two layers, untied head, no biases: 21 parameters.
fn config() -> GptConfig {
    GptConfig {
        vocab_size: 40,
        hidden_size: 16,
        num_layers: 2,
        num_heads: 2,
        num_kv_heads: None,
        intermediate_size: 24,
        max_seq_len: 8,
        rope_theta: 10_000.0,
        norm_eps: 1e-5,
        bias: false,
        tie_word_embeddings: false,
    }
}

/// Rank `rank`'s own initial parameters: every rank draws different ones.
fn initial(rank: usize) -> ParamStore {
    init_params(&config(), 700 + rank as u64, &Device::Cpu).expect("init_params")
}

/// Rank `rank`'s micro-batch `m`: (2, 8) token ids of its own.
fn batch(rank: usize, m: usize) -> Tensor {
    let ids: Vec<u32> = (0..16).map(|i| ((i * 7 + rank * 11 + m * 5 + i * i * (rank + 2)) % 40) as u32).collect();
    Tensor::from_vec(ids, (2, 8), &Device::Cpu).unwrap()
}

/// One process's loss and gradients on `batch` from `params`.
fn one_process(params: &ParamStore, batch: &Tensor) -> (f64, Gradients) {
    let pass = Gpt::new(&config(), params).unwrap().forward(batch, Some(batch)).unwrap();
    (pass.loss_value().unwrap(), Gradients::from_store(params, &pass.backward().unwrap()).unwrap())
}

/// What one rank's replica gave and what its process group saw.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct RankRun {
    losses: Vec<f64>,
    /// Every gradient after the step, by name: its shape and values.
    gradients: Vec<(String, Vec<usize>, Vec<f32>)>,
    events: Vec<Event>,
}

/// One step of the learner's DDP on this rank: `micro_batches` of them, the
/// last synced. The log's phase is 0 in `new` and m + 1 in micro-batch m
/// (see [`phase_of`]); its progress is the gradients backward has handed
/// over since the micro-batch began.
fn step(pg: Box<dyn ProcessGroup>, micro_batches: usize) -> Result<RankRun> {
    let rank = pg.rank();
    let began = Arc::new(AtomicU64::new(0));
    let since = Arc::clone(&began);
    let log = AllReduceLog::new(move || gradients_handed_over() - since.load(Ordering::SeqCst));
    let pg = WithOverride::new(pg, log.clone());
    let mut ddp = DataParallel::new(&config(), initial(rank), Box::new(pg), CAP)?;
    let mut losses = vec![];
    for m in 0..micro_batches {
        began.store(gradients_handed_over(), Ordering::SeqCst);
        log.enter(phase_of(m));
        losses.push(ddp.forward_backward(&batch(rank, m), m + 1 == micro_batches)?);
    }
    let gradients = ddp
        .take_gradients()?
        .iter()
        .map(|(name, g)| Ok((name.to_string(), g.dims().to_vec(), g.flatten_all()?.to_vec1::<f32>()?)))
        .collect::<Result<_>>()?;
    Ok(RankRun { losses, gradients, events: log.events() })
}

fn run(world: usize, micro_batches: usize) -> Vec<RankRun> {
    spawn_with_timeout(world, TIMEOUT, |pg: CpuProcessGroup| step(Box::new(pg), micro_batches))
        .unwrap_or_else(|e| panic!("DataParallel on {world} thread ranks failed: {}", explain_error(&e)))
}

/// The log's phase during micro-batch `m`; phase 0 is `new`.
fn phase_of(m: usize) -> usize {
    m + 1
}

/// The sizes of the all-reduces started during micro-batch `m`.
fn sizes_in(events: &[Event], m: usize) -> Vec<usize> {
    started_in(events, phase_of(m)).iter().map(|&(elements, _, _)| elements).collect()
}

/// The step one process takes on every rank's data: the mean over ranks of
/// each rank's gradient, summed over the micro-batches `ms`.
fn expected(world: usize, ms: &[usize]) -> Gradients {
    let start = initial(0);
    let mut sum = Gradients::default();
    for rank in 0..world {
        for &m in ms {
            sum.accumulate(&one_process(&start, &batch(rank, m)).1).unwrap();
        }
    }
    sum.scale(1.0 / world as f64).unwrap();
    sum
}

/// Micro-batches 0 to `n` − 1.
fn all(n: usize) -> Vec<usize> {
    (0..n).collect()
}

fn close(got: f32, want: f32) -> bool {
    (got - want).abs() <= 1e-5 + 1e-4 * want.abs()
}

/// Whether every gradient of `got` equals `want`'s times `factor`.
fn equals_scaled(got: &[(String, Vec<usize>, Vec<f32>)], want: &Gradients, factor: f32) -> bool {
    first_scaled_mismatch(got, want, factor).is_none()
}

/// The first gradient of `got` that differs from `want`'s times `factor`, and where.
fn first_scaled_mismatch(got: &[(String, Vec<usize>, Vec<f32>)], want: &Gradients, factor: f32) -> Option<String> {
    got.iter().find_map(|(name, _, values)| {
        let w = want.get(name).map(|t| t.flatten_all().unwrap().to_vec1::<f32>().unwrap()).unwrap_or_default();
        let scaled: Vec<f64> = w.iter().map(|&w| f64::from(w * factor)).collect();
        let difference = first_mismatch(values, &scaled, |g, w| close(g as f32, w as f32))?;
        Some(format!("`{name}`: {difference}"))
    })
}

#[test]
fn every_rank_starts_from_rank_0s_parameters() {
    let world = 2;
    for (rank, run) in run(world, MICRO_BATCHES).iter().enumerate() {
        let want = one_process(&initial(0), &batch(rank, 0)).0;
        let got = run.losses[0];
        if (got - want).abs() > 1e-5 * want.abs().max(1.0) {
            let own = one_process(&initial(rank), &batch(rank, 0)).0;
            let kept_own = rank > 0 && (got - own).abs() <= 1e-5 * own.abs().max(1.0);
            panic!(
                "rank {rank}: the first micro-batch's loss is {}, expected {} (the model with rank 0's initial \
                 parameters on this rank's batch){}",
                number(got),
                number(want),
                cause(kept_own.then(|| mistake(26, "no_broadcast")))
            );
        }
    }
}

/// An optimizer outside the wrapper steps `params`; the wrapper's next
/// forward must run on the stepped values.
#[test]
fn a_step_taken_on_the_params_reaches_the_next_forward() {
    let world = 2;
    let halved = |params: &ParamStore| -> Result<()> {
        for (_, var) in params.iter() {
            var.set(&(var.as_tensor() * 0.5)?)?;
        }
        Ok(())
    };
    let losses = spawn_with_timeout(world, TIMEOUT, |pg: CpuProcessGroup| {
        let rank = pg.rank();
        let params = initial(rank);
        let mut ddp = DataParallel::new(&config(), params.clone(), Box::new(pg), CAP)?;
        halved(&params)?;
        ddp.forward_backward(&batch(rank, 0), true)
    })
    .unwrap_or_else(|e| panic!("DataParallel on {world} thread ranks failed: {}", explain_error(&e)));
    let stepped = initial(0);
    halved(&stepped).unwrap();
    for (rank, &got) in losses.iter().enumerate() {
        let want = one_process(&stepped, &batch(rank, 0)).0;
        if (got - want).abs() > 1e-5 * want.abs().max(1.0) {
            let unstepped = one_process(&initial(0), &batch(rank, 0)).0;
            let copied = (got - unstepped).abs() <= 1e-5 * unstepped.abs().max(1.0);
            panic!(
                "rank {rank}: with every parameter halved after new, the loss is {}, expected {} (rank 0's initial \
                 parameters halved){}",
                number(got),
                number(want),
                cause(copied.then(|| mistake(26, "params_copied")))
            );
        }
    }
}

/// The micro-batches of 0..`n` whose gradients, summed, `got` holds, when it
/// is a proper part of them: the others were lost.
fn only_some(got: &[(String, Vec<usize>, Vec<f32>)], world: usize, n: usize) -> Option<Vec<usize>> {
    let parts = (1..(1u32 << n) - 1).map(|mask| (0..n).filter(|m| mask & (1 << m) != 0).collect::<Vec<usize>>());
    parts.into_iter().find(|ms| equals_scaled(got, &expected(world, ms), 1.0))
}

#[rstest]
fn the_gradients_are_what_one_process_computes_on_every_ranks_data(
    #[values(2, 3)] world: usize,
    #[values(1, 2, 3)] micro_batches: usize,
) {
    let want = expected(world, &all(micro_batches));
    for (rank, run) in run(world, micro_batches).iter().enumerate() {
        let names: Vec<&str> = run.gradients.iter().map(|(n, _, _)| n.as_str()).collect();
        let want_names: Vec<&str> = want.iter().map(|(n, _)| n).collect();
        assert_eq!(names, want_names, "rank {rank}: take_gradients must give every parameter's gradient, by name");
        for (name, dims, values) in &run.gradients {
            let w = want.get(name).unwrap();
            assert_eq!(dims, w.dims(), "rank {rank}: the gradient of `{name}` has the parameter's shape");
            let w = w.flatten_all().unwrap().to_vec1::<f32>().unwrap();
            let Some(i) = values.iter().zip(&w).position(|(&g, &w)| !close(g, w)) else { continue };
            let held = if micro_batches > 1 { only_some(&run.gradients, world, micro_batches) } else { None };
            let why = if equals_scaled(&run.gradients, &want, world as f32) {
                Some(mistake(26, "not_averaged"))
            } else if held.as_deref() == Some(&[micro_batches - 1]) {
                Some(mistake(26, "accumulation_lost"))
            } else {
                None
            };
            let held = match held {
                Some(ms) if why.is_none() => format!(
                    ". Every gradient is the sum over micro-batches {ms:?} alone: the others' gradients are not in it"
                ),
                _ => String::new(),
            };
            panic!(
                "rank {rank}: after {micro_batches} micro-batch(es) on {world} ranks, `{name}`[{i}] is {}, expected \
                 {} (one process: the mean over ranks of each rank's gradient, summed over the micro-batches){held}{}",
                number(values[i] as f64),
                number(w[i] as f64),
                cause(why)
            );
        }
    }
}

/// take_gradients hands the step's gradients over and keeps none: a second
/// step on the same batches, the parameters untouched, gives the same ones.
#[test]
fn the_next_step_starts_from_no_gradients() {
    let world = 2;
    let steps = spawn_with_timeout(world, TIMEOUT, |pg: CpuProcessGroup| {
        let rank = pg.rank();
        let mut ddp = DataParallel::new(&config(), initial(rank), Box::new(pg), CAP)?;
        let mut steps = vec![];
        for _ in 0..2 {
            for m in 0..MICRO_BATCHES {
                ddp.forward_backward(&batch(rank, m), m + 1 == MICRO_BATCHES)?;
            }
            let all: Vec<Tensor> = ddp.take_gradients()?.iter().map(|(_, g)| g.flatten_all()).collect::<Result<_>>()?;
            steps.push(Tensor::cat(&all, 0)?.to_vec1::<f32>()?);
        }
        Ok(steps)
    })
    .unwrap_or_else(|e| panic!("DataParallel on {world} thread ranks failed: {}", explain_error(&e)));
    for (rank, steps) in steps.iter().enumerate() {
        let (first, second) = (&steps[0], &steps[1]);
        let times = |factor: f32| first.iter().map(|&f| f64::from(factor * f)).collect::<Vec<f64>>();
        let same = |s: f64, f: f64| close(s as f32, f as f32);
        let Some(difference) = first_mismatch(second, &times(1.0), same) else { continue };
        let both = first_mismatch(second, &times(2.0), same).is_none();
        panic!(
            "rank {rank}: a second step on the same batches, all gradients in name order: {difference} (what the \
             first step gave){}",
            if both {
                "; every element is twice the first step's: that step's gradients stayed in the wrapper after \
                 take_gradients, which must hand them over and keep none"
            } else {
                ""
            }
        );
    }
}

/// No collective of any kind while accumulating, whatever the step's
/// length; the last micro-batch all-reduces every gradient once.
#[rstest]
fn accumulating_sends_nothing_and_the_last_micro_batch_sends_each_gradient_once(
    #[values(1, 2, 3)] micro_batches: usize,
) {
    for (rank, run) in run(2, micro_batches).iter().enumerate() {
        for m in 0..micro_batches - 1 {
            let sent = calls_in(&run.events, phase_of(m));
            // Gradients sent are all-reduces of every parameter's elements;
            // anything else (a loss averaged for printing, a broadcast) is
            // traffic, but not evidence of a sync.
            let all_reduced = sizes_in(&run.events, m);
            let gradients_sent = all_reduced.len() == sent.len() && all_reduced.iter().sum::<usize>() == ELEMENTS;
            assert!(
                sent.is_empty(),
                "rank {rank}: micro-batch {m} of {micro_batches} (sync = false) called {}; a micro-batch that is not \
                 the step's last sends nothing{}",
                said(&sent),
                cause(gradients_sent.then(|| mistake(26, "synced_every_micro_batch")))
            );
        }
        let last: usize = sizes_in(&run.events, micro_batches - 1).iter().sum();
        assert_eq!(
            last, ELEMENTS,
            "rank {rank}: the last of {micro_batches} micro-batch(es) all-reduced {last} elements; the model has \
             {ELEMENTS} parameters, each gradient sent once"
        );
    }
}

#[test]
fn buckets_follow_the_cap_in_the_order_backward_finishes_gradients() {
    for (rank, run) in run(2, MICRO_BATCHES).iter().enumerate() {
        let sizes = sizes_in(&run.events, MICRO_BATCHES - 1);
        if sizes == BUCKETS {
            continue;
        }
        let why = if sizes.len() as u64 == GRADIENTS {
            Some(mistake(26, "one_all_reduce_per_gradient"))
        } else if sizes == BUCKETS_OF_CAP_IN_ELEMENTS {
            Some(mistake(26, "cap_in_elements"))
        } else {
            (sizes == [ELEMENTS]).then(|| mistake(26, "bucket_cap_ignored"))
        };
        panic!(
            "rank {rank}: all-reduces of {sizes:?} elements; the gradients in backward's order with a cap of {CAP} \
             bytes make buckets of {BUCKETS:?}{}",
            cause(why)
        );
    }
}

/// Each rank a process of its own (the count of gradients backward has
/// handed over is one per process), the buckets over TCP, where an
/// all-reduce really runs while backward goes on.
#[test]
fn buckets_travel_while_backward_runs() {
    let world = 2;
    let runs: Vec<RankRun> = on_processes(world, |pg| step(Box::new(pg), MICRO_BATCHES));
    let want = expected(world, &all(MICRO_BATCHES));
    for (rank, run) in runs.iter().enumerate() {
        if let Some(difference) = first_scaled_mismatch(&run.gradients, &want, 1.0) {
            panic!(
                "rank {rank}'s process: after {MICRO_BATCHES} micro-batches, {difference} (one process: the mean \
                 over ranks of each rank's gradient, summed over the micro-batches)"
            );
        }
        let starts: Vec<(bool, u64)> = run
            .events
            .iter()
            .filter_map(|e| match *e {
                Event::Started { blocking, progress, .. } => Some((blocking, progress)),
                Event::Waited { .. } | Event::Called { .. } => None,
            })
            .collect();
        let waits = waits(&run.events);
        // The log reads backward's progress from backward_as_ready: a count
        // that never moved says no gradient came through it, not when any
        // bucket was sent or waited for.
        if !starts.is_empty() && starts.iter().all(|&(_, p)| p == 0) && waits.iter().all(|&w| w == 0) {
            panic!(
                "rank {rank}: no gradient came through ForwardPass::backward_as_ready in the synced micro-batch, so \
                 no all-reduce can have started while backward ran: take backward with backward_as_ready (on a model \
                 built with_blockwise_backward) and start each bucket from its callback the moment it is full"
            );
        }
        let when: Vec<u64> = starts.iter().map(|&(_, handed_over)| handed_over).collect();
        // Backward stands still only for a call made while it runs: after its
        // first gradient and before its last.
        let during_backward = |progress: u64| progress > 0 && progress < GRADIENTS;
        let blocked: Vec<u64> = starts.iter().filter(|&&(blocking, _)| blocking).map(|&(_, p)| p).collect();
        let each_waited_at_once = waits.len() == when.len() && waits == when && waits.iter().any(|&w| w < GRADIENTS);
        if !blocked.is_empty() || waits.iter().any(|&w| w < GRADIENTS) {
            let stood_still = blocked.iter().any(|&p| during_backward(p)) || each_waited_at_once;
            panic!(
                "rank {rank}: {}; backward must go on while a bucket travels, and its result is needed only once \
                 backward has handed over all {GRADIENTS} gradients{}",
                if blocked.is_empty() {
                    format!("results were waited for after {waits:?} gradients")
                } else {
                    format!("the blocking all_reduce was called after {blocked:?} gradients")
                },
                cause(stood_still.then(|| mistake(26, "blocking_all_reduce")))
            );
        }
        let all_at_end = when.len() > 1 && when.iter().all(|&w| w == GRADIENTS);
        assert!(
            when == FULL_AFTER,
            "rank {rank}: the all-reduces started after {when:?} gradients; each bucket starts as soon as it is \
             full, after {FULL_AFTER:?}{}",
            cause(all_at_end.then(|| mistake(26, "launched_after_backward")))
        );
    }
}
