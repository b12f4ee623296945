//! Ungraded checks of the distributed runtime (`workbook::distributed`): the
//! collectives' results, their counting, and failures that end in an error
//! instead of a hang. They use only candle and the runtime, so they pass
//! whatever state the exercises are in.

use std::sync::Mutex;
use std::thread;
use std::time::{Duration, Instant};

use candle_core::{DType, Device, Error, Tensor, Var};
use rstest::rstest;
use workbook::distributed::{
    spawn, spawn_with_timeout, Collective, CpuProcessGroup, ProcessGroup, ReduceOp, SingleProcess,
};

use crate::support::values;

/// A timeout no healthy test comes near, and short enough that a hang fails fast.
const TIMEOUT: Duration = Duration::from_secs(2);

/// Runs `f` on `world` CPU ranks and returns their results in rank order.
fn on_ranks<T: Send>(world: usize, f: impl Fn(CpuProcessGroup) -> candle_core::Result<T> + Sync) -> Vec<T> {
    spawn_with_timeout(world, TIMEOUT, f).unwrap_or_else(|e| panic!("spawn({world}) failed: {e}"))
}

/// Rank `rank`'s tensor: values that differ per rank and are not round, so the
/// order of a sum shows in its bits.
fn input(rank: usize, dims: &[usize], dtype: DType) -> Tensor {
    let n: usize = dims.iter().product();
    let values: Vec<f32> =
        (0..n).map(|i| ((rank * 31 + i * 7) % 17) as f32 * 0.37 - 2.9 + rank as f32 * 0.013).collect();
    Tensor::from_vec(values, dims, &Device::Cpu).unwrap().to_dtype(dtype).unwrap()
}

/// The sum of every rank's `input`, on one thread: f32, in rank order.
fn reference_sum(world: usize, dims: &[usize]) -> Tensor {
    let mut total = input(0, dims, DType::F32);
    for rank in 1..world {
        total = (total + input(rank, dims, DType::F32)).unwrap();
    }
    total
}

fn bits(t: &Tensor) -> Vec<u32> {
    values(t).into_iter().map(f32::to_bits).collect()
}

fn failure(message: &str) -> Error {
    Error::Msg(message.to_string())
}

/// Every rank's send_recv to its successor, from its predecessor, in one step of a ring.
pub fn ring_step(pg: &dyn ProcessGroup) -> candle_core::Result<Vec<f32>> {
    let (rank, n) = (pg.rank(), pg.world_size());
    let mine = Tensor::new(&[rank as f32, 10.0 * rank as f32], &Device::Cpu)?;
    Ok(values(&pg.send_recv(&mine, (rank + 1) % n, &mine.zeros_like()?, (rank + n - 1) % n)?))
}

/// What [`ring_step`] gives rank `rank` of `world`: its predecessor's tensor.
pub fn ring_step_expected(rank: usize, world: usize) -> Vec<f32> {
    let from = ((rank + world - 1) % world) as f32;
    vec![from, 10.0 * from]
}

#[rstest]
fn send_recv_passes_each_ranks_tensor_one_step_round_a_ring(#[values(2, 3)] world: usize) {
    for (rank, got) in on_ranks(world, |pg| ring_step(&pg)).iter().enumerate() {
        assert_eq!(got, &ring_step_expected(rank, world), "rank {rank}");
    }
}

#[rstest]
fn all_reduce_sum_equals_the_single_thread_sum_bit_for_bit(#[values(1, 2, 4)] world: usize) {
    let dims = [3, 5];
    let results = on_ranks(world, |pg| pg.all_reduce(&input(pg.rank(), &dims, DType::F32), ReduceOp::Sum));
    let want = reference_sum(world, &dims);
    for (rank, got) in results.iter().enumerate() {
        assert_eq!(got.dims(), &dims, "rank {rank}: all_reduce must keep the shape");
        assert_eq!(bits(got), bits(&want), "rank {rank}: not the f32 sum in rank order");
    }
}

#[rstest]
fn all_reduce_avg_is_the_mean(#[values(1, 2, 4)] world: usize) {
    let dims = [4, 2];
    let results = on_ranks(world, |pg| pg.all_reduce(&input(pg.rank(), &dims, DType::F32), ReduceOp::Avg));
    let want = values(&reference_sum(world, &dims)).into_iter().map(|v| v / world as f32);
    let got = values(&results[0]);
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!((g - w).abs() <= 1e-6 * (1.0 + w.abs()), "element {i}: mean {w}, got {g}");
    }
}

#[rstest]
fn broadcast_gives_every_rank_the_roots_tensor(#[values(2, 4)] world: usize) {
    let root = world - 1;
    let results = on_ranks(world, |pg| pg.broadcast(&input(pg.rank(), &[2, 3], DType::F32), root));
    let want = input(root, &[2, 3], DType::F32);
    for (rank, got) in results.iter().enumerate() {
        assert_eq!(got.dims(), &[2, 3]);
        assert_eq!(bits(got), bits(&want), "rank {rank} did not receive root {root}'s tensor");
    }
}

#[rstest]
fn all_gather_concatenates_along_dim_0_in_rank_order(#[values(1, 2, 4)] world: usize) {
    let results = on_ranks(world, |pg| {
        let mine = Tensor::full(pg.rank() as f32, (2, 3), &Device::Cpu)?;
        pg.all_gather(&mine)
    });
    // Rows 2r and 2r+1 come from rank r.
    let want: Vec<f32> = (0..2 * world).flat_map(|row| [(row / 2) as f32; 3]).collect();
    for (rank, got) in results.iter().enumerate() {
        assert_eq!(got.dims(), &[2 * world, 3], "rank {rank}: dim 0 must grow by the world size");
        assert_eq!(values(got), want, "rank {rank}: the blocks are not in rank order");
    }
}

#[rstest]
fn reduce_scatter_gives_rank_r_the_rth_chunk_of_the_sum(#[values(1, 2, 4)] world: usize) {
    let dims = [2 * world, 3];
    let results = on_ranks(world, |pg| pg.reduce_scatter(&input(pg.rank(), &dims, DType::F32), ReduceOp::Sum));
    let total = reference_sum(world, &dims);
    for (rank, got) in results.iter().enumerate() {
        let want = total.narrow(0, 2 * rank, 2).unwrap();
        assert_eq!(got.dims(), &[2, 3], "rank {rank}: a chunk is 1/world_size of dim 0");
        assert_eq!(bits(got), bits(&want), "rank {rank} got the wrong chunk of the sum");
    }
}

#[test]
fn reduce_scatter_of_a_dim_0_that_does_not_divide_is_a_clear_error() {
    let errors = on_ranks(4, |pg| {
        let err = pg.reduce_scatter(&input(pg.rank(), &[10, 2], DType::F32), ReduceOp::Sum).unwrap_err();
        Ok(err.to_string())
    });
    for err in errors {
        assert!(
            err.contains("reduce_scatter: dim 0 of size 10 does not divide across 4 ranks; pad it to a multiple of the world size"),
            "{err}"
        );
    }
}

#[rstest]
fn half_precision_stays_half_precision(#[values(DType::BF16, DType::F16)] dtype: DType) {
    let results = on_ranks(2, |pg| {
        // Small integers: exact in every dtype, so the values can be checked too.
        let mine = Tensor::new(&[1f32, 2., 3., 4.], &Device::Cpu)?.affine(1.0, pg.rank() as f64)?.to_dtype(dtype)?;
        Ok([
            pg.all_reduce(&mine, ReduceOp::Sum)?,
            pg.broadcast(&mine, 1)?,
            pg.all_gather(&mine)?,
            pg.reduce_scatter(&mine, ReduceOp::Avg)?,
        ])
    });
    let want: [Vec<f32>; 4] =
        [vec![3., 5., 7., 9.], vec![2., 3., 4., 5.], vec![1., 2., 3., 4., 2., 3., 4., 5.], vec![1.5, 2.5]];
    for (name, (got, want)) in
        ["all_reduce", "broadcast", "all_gather", "reduce_scatter"].iter().zip(results[0].iter().zip(want))
    {
        assert_eq!(got.dtype(), dtype, "{name} must return the input's dtype");
        assert_eq!(values(got), want, "{name}");
    }
}

#[rstest]
fn every_rank_gets_bit_identical_results(#[values(DType::F32, DType::BF16)] dtype: DType) {
    let results = on_ranks(4, |pg| {
        let mine = input(pg.rank(), &[8, 5], dtype);
        Ok((pg.all_reduce(&mine, ReduceOp::Avg)?, pg.all_gather(&mine)?))
    });
    for (rank, (reduced, gathered)) in results.iter().enumerate().skip(1) {
        assert_eq!(bits(reduced), bits(&results[0].0), "all_reduce differs between rank 0 and rank {rank}");
        assert_eq!(bits(gathered), bits(&results[0].1), "all_gather differs between rank 0 and rank {rank}");
    }
}

#[test]
fn consecutive_collectives_never_mix() {
    let world = 4;
    let results = on_ranks(world, |pg| {
        let mut sums = Vec::new();
        for round in 0..50 {
            let mine = Tensor::new(&[(pg.rank() + 10 * round) as f32], &Device::Cpu)?;
            sums.push(values(&pg.all_reduce(&mine, ReduceOp::Sum)?)[0]);
        }
        Ok(sums)
    });
    let want: Vec<f32> = (0..50).map(|round| (6 + 40 * round) as f32).collect();
    for sums in results {
        assert_eq!(sums, want, "a rank's tensor was counted in another round's all_reduce");
    }
}

#[test]
fn stats_count_calls_and_payload_bytes() {
    let results = on_ranks(2, |pg| {
        let grad = Tensor::zeros((3, 4), DType::F32, &Device::Cpu)?; // 48 bytes
        let start = pg.stats();
        pg.all_reduce(&grad, ReduceOp::Avg)?;
        pg.all_reduce(&grad, ReduceOp::Sum)?;
        pg.broadcast(&Tensor::zeros(5, DType::BF16, &Device::Cpu)?, 0)?; // 10 bytes
        pg.all_gather(&Tensor::zeros(2, DType::F32, &Device::Cpu)?)?; // output: 2 ranks × 8 bytes
        pg.reduce_scatter(&Tensor::zeros(4, DType::F32, &Device::Cpu)?, ReduceOp::Sum)?; // input: 16 bytes
        pg.barrier()?;
        let before_step = pg.stats();
        pg.all_reduce(&grad, ReduceOp::Avg)?;
        Ok((start, before_step, pg.stats()))
    });
    for (start, before_step, end) in results {
        assert_eq!(start.total_bytes(), 0);
        assert_eq!(before_step.get(Collective::AllReduce), (2, 96));
        assert_eq!(before_step.get(Collective::Broadcast), (1, 10));
        assert_eq!(before_step.get(Collective::AllGather), (1, 16));
        assert_eq!(before_step.get(Collective::ReduceScatter), (1, 16));
        assert_eq!(before_step.get(Collective::Barrier), (1, 0));
        let step = end.since(&before_step);
        assert_eq!(step.get(Collective::AllReduce), (1, 48), "one all_reduce in the step");
        let others = Collective::ALL.iter().filter(|&&k| k != Collective::AllReduce);
        assert!(others.map(|&k| step.calls(k)).all(|calls| calls == 0), "{step}");
    }
}

#[test]
fn single_process_collectives_return_an_untracked_copy_of_the_input() {
    let pg = SingleProcess::new();
    assert_eq!((pg.rank(), pg.world_size()), (0, 1));
    let x = Var::from_tensor(&input(0, &[4, 3], DType::BF16)).unwrap();
    let results = [
        pg.all_reduce(&x, ReduceOp::Sum).unwrap(),
        pg.all_reduce(&x, ReduceOp::Avg).unwrap(),
        pg.broadcast(&x, 0).unwrap(),
        pg.all_gather(&x).unwrap(),
        pg.reduce_scatter(&x, ReduceOp::Sum).unwrap(),
    ];
    pg.barrier().unwrap();
    for got in &results {
        assert_eq!((got.dims(), got.dtype()), (x.dims(), DType::BF16));
        assert_eq!(bits(got), bits(&x), "a collective over one rank is the identity");
        assert!(!got.track_op(), "a collective's result must not be part of the autograd graph");
    }
    let stats = pg.stats();
    assert_eq!(stats.get(Collective::AllReduce), (2, 48));
    assert_eq!(stats.get(Collective::Barrier), (1, 0));
}

#[test]
fn mismatched_collectives_are_an_error_on_every_rank() {
    let errors = on_ranks(2, |pg| {
        let t = Tensor::zeros(3, DType::F32, &Device::Cpu)?;
        let result = if pg.rank() == 0 { pg.all_reduce(&t, ReduceOp::Sum) } else { pg.broadcast(&t, 0) };
        Ok(result.unwrap_err().to_string())
    });
    for err in errors {
        assert!(
            err.contains("rank 0 called all_reduce while rank 1 called broadcast: every rank must issue the same collectives in the same order"),
            "{err}"
        );
    }
}

/// Three ranks each receive from the next before sending: none can ever
/// send, which is found at once, not after the timeout.
#[test]
fn ranks_that_wait_for_each_other_in_recv_are_an_error_at_once() {
    let started = std::time::Instant::now();
    let errors = on_ranks(3, |pg| {
        let t = Tensor::zeros(2, DType::F32, &Device::Cpu)?;
        let next = (pg.rank() + 1) % 3;
        let err = pg.recv(&t, next).unwrap_err().to_string();
        Ok(err)
    });
    for err in &errors {
        assert!(err.contains("the ranks wait for each other in a cycle"), "{err}");
        for rank in 0..3 {
            assert!(err.contains(&format!("rank {rank} waits in recv(src {})", (rank + 1) % 3)), "{err}");
        }
    }
    assert!(started.elapsed() < std::time::Duration::from_secs(5), "found after {:?}", started.elapsed());
}

#[test]
fn mismatched_shapes_are_an_error_on_every_rank() {
    let errors = on_ranks(2, |pg| {
        let t = Tensor::zeros(2 + pg.rank(), DType::F32, &Device::Cpu)?;
        Ok(pg.all_gather(&t).unwrap_err().to_string())
    });
    for err in errors {
        assert!(err.contains("rank 0 passed a [2] f32 tensor while rank 1 passed a [3] f32 one"), "{err}");
    }
}

#[rstest]
fn a_rank_that_returns_an_error_stops_the_others_at_once(#[values(2, 4)] world: usize) {
    let seen_by_others = Mutex::new(Vec::new());
    let start = Instant::now();
    let err = spawn_with_timeout(world, TIMEOUT, |pg| {
        if pg.rank() == 1 {
            return Err(failure("data loader broke"));
        }
        let t = Tensor::ones(4, DType::F32, &Device::Cpu)?;
        for _ in 0..3 {
            if let Err(e) = pg.all_reduce(&t, ReduceOp::Sum) {
                seen_by_others.lock().unwrap().push(e.to_string());
                return Err(e);
            }
        }
        Ok(())
    })
    .unwrap_err()
    .to_string();
    let elapsed = start.elapsed();
    assert!(err.starts_with("rank 1 failed: data loader broke"), "spawn must report the root cause: {err}");
    // Released by the abort, not by the timeout.
    assert!(elapsed < TIMEOUT, "the other ranks waited {elapsed:?} for a rank that had failed");
    let seen = seen_by_others.into_inner().unwrap();
    assert_eq!(seen.len(), world - 1);
    assert!(seen.iter().all(|e| e.contains("rank 1 failed: data loader broke")), "{seen:?}");
}

#[test]
fn a_rank_that_panics_stops_the_others_at_once() {
    let start = Instant::now();
    let err = spawn_with_timeout(4, TIMEOUT, |pg| {
        if pg.rank() == 3 {
            panic!("boom at step 7");
        }
        pg.barrier()?;
        pg.barrier()
    })
    .unwrap_err()
    .to_string();
    let elapsed = start.elapsed();
    assert!(err.starts_with("rank 3 failed: panicked: boom at step 7"), "{err}");
    assert!(elapsed < TIMEOUT, "the other ranks waited {elapsed:?} for a rank that had panicked");
}

#[test]
fn a_rank_that_never_arrives_times_out_with_its_name() {
    let timeout = Duration::from_millis(200);
    let start = Instant::now();
    let err = spawn_with_timeout(3, timeout, |pg| {
        if pg.rank() == 2 {
            thread::sleep(2 * timeout); // stuck: misses the all_reduce
            return Ok(());
        }
        pg.all_reduce(&Tensor::ones(2, DType::F32, &Device::Cpu)?, ReduceOp::Sum).map(drop)
    })
    .unwrap_err()
    .to_string();
    assert!(err.contains("all_reduce #0 timed out after 200ms"), "{err}");
    assert!(err.contains("rank 2 did not arrive"), "{err}");
    assert!(start.elapsed() < TIMEOUT, "took {:?}", start.elapsed());
}

/// Rank 0 says it is busy before rank 1 starts waiting for it (a barrier of
/// the test's own, outside the group, orders the two), so that only the busy
/// period, and no thread that starts late on a loaded machine, is what holds
/// rank 1 past the timeout. Rank 1 looks again at every timeout from the
/// start of its wait: each save ends halfway between two looks, so a stall
/// of up to half a timeout on either side of its end changes nothing.
#[test]
fn a_rank_busy_with_a_save_is_waited_for_past_the_timeout() {
    let timeout = Duration::from_secs(3);
    let said_busy = std::sync::Barrier::new(2);
    let results = spawn_with_timeout(2, timeout, |pg| {
        let t = Tensor::ones(2, DType::F32, &Device::Cpu)?;
        let save_while_the_other_waits = |what: &str| {
            pg.set_busy(Some(what));
            said_busy.wait();
            thread::sleep(timeout * 5 / 2);
            pg.set_busy(None);
        };
        match pg.rank() {
            0 => save_while_the_other_waits("writing checkpoint step_000100"),
            _ => drop(said_busy.wait()),
        }
        pg.all_reduce(&t, ReduceOp::Sum)?; // rank 1 waits here for the busy rank 0
        match pg.rank() {
            0 => {
                save_while_the_other_waits("writing checkpoint step_000200");
                pg.send(&t, 1)?;
            }
            _ => {
                said_busy.wait();
                drop(pg.recv(&t, 0)?); // and here
            }
        }
        Ok(())
    });
    assert!(results.is_ok(), "a busy rank was called stuck: {:?}", results.err().map(|e| e.to_string()));
}

#[test]
fn a_rank_that_finishes_early_releases_the_others_at_once() {
    let start = Instant::now();
    let err = spawn_with_timeout(2, TIMEOUT, |pg| if pg.rank() == 0 { pg.barrier() } else { Ok(()) })
        .unwrap_err()
        .to_string();
    assert!(err.contains("rank 1 finished without calling barrier #0"), "{err}");
    assert!(start.elapsed() < TIMEOUT, "rank 0 waited {:?} for a rank that had finished", start.elapsed());
}

/// Rank 0 waits for rank 2, which is failing; rank 1 finishes meanwhile,
/// which is all rank 0 sees. The failure reported is rank 2's own.
#[test]
fn a_failing_rank_is_named_even_when_another_finished_first() {
    let err = spawn_with_timeout(3, TIMEOUT, |pg| match pg.rank() {
        0 => pg.barrier(),
        1 => Ok(()),
        _ => {
            thread::sleep(Duration::from_millis(100));
            Err(failure("rank 2's own problem"))
        }
    })
    .unwrap_err()
    .to_string();
    assert!(err.contains("rank 2 failed: rank 2's own problem"), "{err}");
}

#[test]
fn spawn_returns_results_in_rank_order() {
    let ranks = spawn(4, |pg| Ok((pg.rank(), pg.world_size()))).unwrap();
    assert_eq!(ranks, vec![(0, 4), (1, 4), (2, 4), (3, 4)]);
}

#[test]
fn spawn_rejects_an_empty_world() {
    let err = spawn(0, |_pg| Ok(())).unwrap_err().to_string();
    assert!(err.contains("world_size must be at least 1"), "{err}");
}

/// A reduction runs in the dtype it is handed, as NCCL's does: in bf16,
/// 1 + 2⁻⁸ rounds back to 1 at every addition, so three ranks holding 1, 2⁻⁸
/// and 2⁻⁸ sum to 1, while the same sum reduced in f32 is 1 + 2⁻⁷. This is
/// the precision a mixed-precision policy's `reduce_dtype` gives up.
#[rstest]
fn reductions_round_in_the_dtype_they_are_handed(#[values(DType::F32, DType::BF16)] dtype: DType) {
    let sums = on_ranks(3, |pg| {
        let mine = if pg.rank() == 0 { 1.0 } else { 2f32.powi(-8) };
        let t = Tensor::new(&[mine], &Device::Cpu)?.to_dtype(dtype)?;
        Ok(values(&pg.all_reduce(&t, ReduceOp::Sum)?)[0])
    });
    let want = if dtype == DType::BF16 { 1.0 } else { 1.0 + 2f32.powi(-7) };
    assert_eq!(sums, vec![want; 3], "a {dtype:?} all-reduce must add in {dtype:?}, rounding at each addition");
}

#[test]
fn send_and_recv_between_threads_arrive_in_order() {
    let got = on_ranks(3, |pg| {
        let r = pg.rank();
        let like = Tensor::zeros(2, DType::F32, &Device::Cpu)?;
        for peer in (0..3).filter(|&p| p != r) {
            for k in 0..2 {
                pg.send(&Tensor::new(&[r as f32, (10 * peer + k) as f32], &Device::Cpu)?, peer)?;
            }
        }
        let mut received = vec![];
        for peer in (0..3).filter(|&p| p != r) {
            for _ in 0..2 {
                received.push(values(&pg.recv(&like, peer)?));
            }
        }
        Ok(received)
    });
    for (rank, received) in got.iter().enumerate() {
        let want: Vec<Vec<f32>> = (0..3)
            .filter(|&p| p != rank)
            .flat_map(|p| (0..2).map(move |k| vec![p as f32, (10 * rank + k) as f32]))
            .collect();
        assert_eq!(received, &want, "rank {rank}: each peer's tensors, in the order sent");
    }
}

#[test]
fn recv_of_the_wrong_shape_and_a_missing_send_are_errors() {
    let err = spawn_with_timeout(2, TIMEOUT, |pg| match pg.rank() {
        0 => pg.send(&Tensor::zeros(3, DType::F32, &Device::Cpu)?, 1),
        _ => pg.recv(&Tensor::zeros(4, DType::F32, &Device::Cpu)?, 0).map(drop),
    })
    .unwrap_err()
    .to_string();
    assert!(err.contains("[4]") && err.contains("[3]"), "a recv of another shape must name both shapes: {err}");
    let err = spawn_with_timeout(2, TIMEOUT, |pg| match pg.rank() {
        0 => Ok(()),
        _ => pg.recv(&Tensor::zeros(4, DType::F32, &Device::Cpu)?, 0).map(drop),
    })
    .unwrap_err()
    .to_string();
    assert!(err.contains("rank 0 finished without sending"), "a recv whose sender finished must fail at once: {err}");
}

#[test]
fn thread_ranks_finish_async_calls_before_returning_them() {
    let results = spawn_with_timeout(2, TIMEOUT, |pg| {
        let t = Tensor::new(&[pg.rank() as f32 + 1.0, 10.0], &Device::Cpu)?;
        let work = pg.all_reduce_async(&t, ReduceOp::Sum)?;
        Ok((pg.properties().overlaps, work.wait()?.to_vec1::<f32>()?))
    })
    .unwrap();
    for (overlaps, sum) in results {
        assert!(!overlaps, "thread ranks say their async calls overlap, which they do not");
        assert_eq!(sum, [3.0, 20.0]);
    }
}
