//! Exercise 19: DDP buckets that overlap with backward. The gradients come
//! from an iterator that counts what it has handed out, standing for
//! backward; the process group records every all-reduce: when it was started
//! (how far backward had got), its size, whether it blocked, and when its
//! result was waited for. Expected averages are added up here directly.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use candle_core::{Device, Result, Tensor};
use workbook::distributed::{spawn_with_timeout, CpuProcessGroup, ProcessGroup, WithOverride};
use workbook::phase4_under_the_hood::overlapped_all_reduce;

use crate::all_reduce_log::{started_in, waits, AllReduceLog, Event};
use crate::process_ranks::on_processes;
use crate::support::{cause, explain_error, first_mismatch, mistake, number};

const TIMEOUT: Duration = Duration::from_secs(10);
/// The gradients in the order backward produces them, by element count (f32).
const SIZES: [usize; 7] = [6, 10, 4, 8, 12, 2, 3];
/// 64 bytes: buckets of 6+10 (64 bytes, exactly the cap, which closes a
/// bucket), 4+8+12 (96 bytes), then the last two gradients, 2+3 elements,
/// a bucket that is not full when backward ends.
const CAP: usize = 64;
const BUCKETS: [usize; 3] = [16, 24, 5];
/// How many gradients backward has produced when each bucket is full (the
/// last, when backward ends).
const FULL_AFTER: [u64; 3] = [2, 5, 7];
/// The gradients in the full buckets, the ones before the last bucket's.
const IN_FULL_BUCKETS: usize = FULL_AFTER[FULL_AFTER.len() - 2] as usize;

fn grad(rank: usize, index: usize) -> Vec<f32> {
    (0..SIZES[index]).map(|i| ((rank * 5 + index * 3 + i) % 7) as f32 * 0.5 - 1.0 + rank as f32).collect()
}

/// What one rank got back and what its recorder saw.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct RankRun {
    averaged: Vec<(String, Vec<usize>, Vec<f32>)>,
    events: Vec<Event>,
}

/// The learner's function on `pg`, fed this rank's gradients one by one as backward would.
fn backward_and_sync(pg: Box<dyn ProcessGroup>) -> Result<RankRun> {
    let rank = pg.rank();
    let produced = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&produced);
    let log = AllReduceLog::new(move || counted.load(Ordering::SeqCst) as u64);
    let logged = WithOverride::new(pg, log.clone());
    let backward = (0..SIZES.len()).map(|i| {
        produced.fetch_add(1, Ordering::SeqCst);
        let shape = if SIZES[i].is_multiple_of(2) { vec![2, SIZES[i] / 2] } else { vec![SIZES[i]] };
        (format!("layer{}.weight", SIZES.len() - i), Tensor::from_vec(grad(rank, i), shape, &Device::Cpu).unwrap())
    });
    let averaged = overlapped_all_reduce(&logged, backward, CAP)?
        .into_iter()
        .map(|(name, t)| Ok((name, t.dims().to_vec(), t.flatten_all()?.to_vec1::<f32>()?)))
        .collect::<Result<Vec<_>>>()?;
    Ok(RankRun { averaged, events: log.events() })
}

fn run(world: usize) -> Vec<RankRun> {
    spawn_with_timeout(world, TIMEOUT, |pg: CpuProcessGroup| backward_and_sync(Box::new(pg)))
        .unwrap_or_else(|e| panic!("overlapped_all_reduce on {world} ranks failed: {}", explain_error(&e)))
}

#[test]
fn every_gradient_comes_back_averaged_with_its_name_and_shape() {
    let world = 3;
    for (rank, run) in run(world).iter().enumerate() {
        let names: Vec<&str> = run.averaged.iter().map(|(n, _, _)| n.as_str()).collect();
        let want_names: Vec<String> = (0..SIZES.len()).map(|i| format!("layer{}.weight", SIZES.len() - i)).collect();
        let last_bucket_dropped = names == want_names[..IN_FULL_BUCKETS];
        assert!(
            names == want_names,
            "rank {rank}: the gradients must come back by name, in the order they came: {names:?}, expected \
             {want_names:?}{}",
            cause(last_bucket_dropped.then(|| mistake(19, "last_bucket_dropped")))
        );
        for (i, (name, dims, values)) in run.averaged.iter().enumerate() {
            let want_dims = if SIZES[i].is_multiple_of(2) { vec![2, SIZES[i] / 2] } else { vec![SIZES[i]] };
            assert_eq!(dims, &want_dims, "rank {rank}: `{name}` must keep its shape");
            let sum: Vec<f32> = (0..SIZES[i]).map(|j| (0..world).map(|r| grad(r, i)[j]).sum()).collect();
            let mean: Vec<f32> = sum.iter().map(|s| s / world as f32).collect();
            if let Some(j) = (0..SIZES[i]).find(|&j| (values[j] - mean[j]).abs() > 1e-5) {
                let summed = values.iter().zip(&sum).all(|(v, s)| (v - s).abs() <= 1e-5);
                panic!(
                    "rank {rank}: `{name}`[{j}] is {}, expected the mean over {world} ranks, {}{}",
                    number(values[j] as f64),
                    number(mean[j] as f64),
                    cause(summed.then(|| mistake(19, "not_averaged")))
                );
            }
        }
    }
}

#[test]
fn buckets_follow_the_cap_in_the_order_gradients_arrive() {
    for (rank, run) in run(2).iter().enumerate() {
        let sizes: Vec<usize> = started_in(&run.events, 0).iter().map(|&(elements, _, _)| elements).collect();
        let why = if sizes.len() == SIZES.len() {
            Some(mistake(19, "one_all_reduce_per_gradient"))
        } else if sizes == BUCKETS[..BUCKETS.len() - 1] {
            Some(mistake(19, "last_bucket_dropped"))
        } else {
            (sizes.iter().sum::<usize>() == SIZES.iter().sum::<usize>()).then(|| mistake(19, "bucket_cap_ignored"))
        };
        assert!(
            sizes == BUCKETS,
            "rank {rank}: all-reduces of {sizes:?} elements; gradients of {SIZES:?} f32 elements with a cap of {CAP} \
             bytes make buckets of {BUCKETS:?}{}",
            cause(why)
        );
    }
}

#[test]
fn buckets_travel_while_backward_runs() {
    for (rank, run) in run(2).iter().enumerate() {
        let started = started_in(&run.events, 0);
        if started.iter().any(|&(_, blocking, _)| blocking) {
            panic!("rank {rank} used the blocking all_reduce{}", cause(Some(mistake(19, "blocking_all_reduce"))));
        }
        let early_wait = waits(&run.events).iter().any(|&progress| progress < SIZES.len() as u64);
        assert!(
            !early_wait,
            "rank {rank} waited for a bucket before backward had produced every gradient{}",
            cause(Some(mistake(19, "blocking_all_reduce")))
        );
        let when: Vec<u64> = started.iter().map(|&(_, _, progress)| progress).collect();
        let all_at_end = when.iter().all(|&p| p == SIZES.len() as u64) && when.len() > 1;
        assert!(
            when == FULL_AFTER,
            "rank {rank} started its all-reduces after {when:?} gradients; each bucket starts as soon as it is \
             full, after {FULL_AFTER:?}{}",
            cause(all_at_end.then(|| mistake(19, "launched_after_backward")))
        );
    }
}

/// Each rank a process, the buckets over TCP, where the all-reduces really
/// run while the caller goes on.
#[test]
fn it_runs_across_processes_over_tcp() {
    let world = 2;
    let runs: Vec<RankRun> = on_processes(world, |pg| backward_and_sync(Box::new(pg)));
    for (rank, run) in runs.iter().enumerate() {
        for (i, (name, _, values)) in run.averaged.iter().enumerate() {
            let mean: Vec<f64> = (0..SIZES[i]).map(|j| f64::from(grad(0, i)[j] + grad(1, i)[j]) / 2.0).collect();
            if let Some(difference) = first_mismatch(values, &mean, |g, m| (g - m).abs() <= 1e-5) {
                panic!("rank {rank}'s process: `{name}`: {difference} (the mean over the 2 ranks)");
            }
        }
    }
}
