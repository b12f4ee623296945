//! The process backend on real processes (see `process_ranks.rs` for the
//! harness): its collectives against their definitions, the bytes it sends,
//! and how it fails when a peer misbehaves, dies, stops or is busy.

use std::process::Command;

use candle_core::DType::{BF16, F32};
use candle_core::{DType, Device, Tensor};
use rstest::rstest;
use workbook::distributed::{while_busy, Collective, ProcessGroup, ReduceOp};

use crate::distributed::{ring_step, ring_step_expected};
use crate::process_ranks::{on_processes, on_processes_some_may_exit, on_processes_timing_out_after};

/// Rank `rank`'s tensor: values that differ per rank and are not round, so
/// the order of a sum shows in its bits.
pub fn input(rank: usize, len: usize, dtype: DType) -> Tensor {
    let values: Vec<f32> =
        (0..len).map(|i| ((rank * 31 + i * 7) % 17) as f32 * 0.37 - 2.9 + rank as f32 * 0.013).collect();
    Tensor::from_vec(values, len, &Device::Cpu).unwrap().to_dtype(dtype).unwrap()
}

fn as_f32(t: &Tensor) -> Vec<f32> {
    t.flatten_all().unwrap().to_dtype(DType::F32).unwrap().to_vec1().unwrap()
}

/// The sum of every rank's `input`, added in `dtype` in the order `order`.
fn sum_in_order(order: impl Iterator<Item = usize>, len: usize, dtype: DType) -> Vec<f32> {
    let mut order = order;
    let mut total = input(order.next().unwrap(), len, dtype);
    for rank in order {
        total = (total + input(rank, len, dtype)).unwrap();
    }
    as_f32(&total)
}

/// Element `i` of the ring's sum: chunk c is added starting from rank c + 1.
fn ring_sum(world: usize, len: usize, dtype: DType) -> Vec<f32> {
    let (base, extra) = (len / world, len % world);
    let chunk_of = |i: usize| {
        let long = extra * (base + 1);
        if i < long {
            i / (base + 1)
        } else {
            extra + (i - long) / base.max(1)
        }
    };
    let orders: Vec<Vec<f32>> =
        (0..world).map(|c| sum_in_order((1..=world).map(|k| (c + k) % world), len, dtype)).collect();
    (0..len).map(|i| orders[chunk_of(i)][i]).collect()
}

/// Elements enough for chunks of more than one 1 MiB piece on the wire.
const MULTI_PIECE: usize = (1 << 20) + 3;

/// 10 elements do not divide by 3 or 4, so the chunks differ in length; 1
/// element leaves some ranks' chunks empty, and 0 all of them.
#[rstest]
fn ring_all_reduce_equals_the_sum_in_the_rings_order(
    #[values(2, 3, 4)] world: usize,
    #[values((10, F32), (10, BF16), (1, F32), (0, F32), (MULTI_PIECE, F32))] case: (usize, DType),
) {
    let (len, dtype) = case;
    let got: Vec<(Vec<f32>, bool)> = on_processes(world, |pg| {
        let t = pg.all_reduce(&input(pg.rank(), len, dtype), ReduceOp::Sum)?;
        Ok((as_f32(&t), t.dtype() == dtype))
    });
    let want = ring_sum(world, len, dtype);
    for (rank, (values, same_dtype)) in got.iter().enumerate() {
        assert!(same_dtype, "rank {rank}: the result must keep the input's dtype");
        assert_eq!(
            values, &want,
            "world {world}, {len} {dtype:?} elements: rank {rank}'s all_reduce is not the sum in the ring's order"
        );
    }
    if world == 2 {
        let rank_order = sum_in_order(0..2, len, dtype);
        assert_eq!(got[0].0, rank_order, "two ranks: a + b = b + a, so the ring must equal rank order exactly");
    }
}

/// A view sums its own elements, wherever they lie in its storage: one
/// that starts past the storage's first element, and one with strides.
#[test]
fn all_reduce_of_a_view_sums_the_views_elements() {
    let offset = |t: &Tensor| t.narrow(0, 3, 8);
    let strided = |t: &Tensor| t.narrow(0, 1, 12)?.reshape((3, 4))?.t();
    let got: Vec<(Vec<f32>, Vec<f32>)> = on_processes(2, |pg| {
        let whole = input(pg.rank(), 13, DType::F32);
        let summed_offset = pg.all_reduce(&offset(&whole)?, ReduceOp::Sum)?;
        let summed_strided = pg.all_reduce(&strided(&whole)?, ReduceOp::Sum)?;
        Ok((as_f32(&summed_offset), as_f32(&summed_strided)))
    });
    // Two ranks: a + b = b + a, so the ring's sum is exactly this one.
    let total = (input(0, 13, DType::F32) + input(1, 13, DType::F32)).unwrap();
    let want = (as_f32(&offset(&total).unwrap()), as_f32(&strided(&total).unwrap()));
    for (rank, got) in got.iter().enumerate() {
        assert_eq!(got.0, want.0, "rank {rank}: all_reduce of elements 3..11 of a 13-element tensor");
        assert_eq!(got.1, want.1, "rank {rank}: all_reduce of a transposed (strided) view");
    }
}

/// What one rank got from the three collectives.
#[derive(serde::Serialize, serde::Deserialize)]
struct Collected {
    gathered: Vec<f32>,
    broadcast: Vec<f32>,
    scattered: Vec<f32>,
    scattered_dims: Vec<usize>,
    /// The same reduce-scatter, started with `reduce_scatter_async`.
    scattered_async: Vec<f32>,
}

#[rstest]
fn all_gather_broadcast_and_reduce_scatter_match_their_definitions(#[values(2, 3, 4)] world: usize) {
    let rows = 2 * world; // reduce-scatter needs dim 0 divisible by the world size
    let got: Vec<Collected> = on_processes(world, |pg| {
        let r = pg.rank();
        let gathered = pg.all_gather(&input(r, 3, DType::F32))?;
        let broadcast = pg.broadcast(&input(r, 5, DType::F32), world - 1)?;
        let mine = input(r, rows * 3, DType::F32).reshape((rows, 3))?;
        let scattered = pg.reduce_scatter(&mine, ReduceOp::Avg)?;
        let scattered_async = pg.reduce_scatter_async(&mine, ReduceOp::Avg)?.wait()?;
        Ok(Collected {
            gathered: as_f32(&gathered),
            broadcast: as_f32(&broadcast),
            scattered: as_f32(&scattered),
            scattered_dims: scattered.dims().to_vec(),
            scattered_async: as_f32(&scattered_async),
        })
    });
    let gathered: Vec<f32> = (0..world).flat_map(|r| as_f32(&input(r, 3, DType::F32))).collect();
    let mean: Vec<f32> = ring_sum(world, rows * 3, DType::F32).iter().map(|v| v / world as f32).collect();
    for (rank, Collected { gathered: g, broadcast: b, scattered: s, scattered_dims: dims, scattered_async }) in
        got.iter().enumerate()
    {
        assert_eq!(g, &gathered, "rank {rank}: all_gather must concatenate every rank's tensor in rank order");
        assert_eq!(
            b,
            &as_f32(&input(world - 1, 5, DType::F32)),
            "rank {rank}: broadcast must deliver the root's tensor"
        );
        assert_eq!(dims, &[2, 3], "rank {rank}: reduce_scatter gives each rank 1/world of dim 0");
        let close = s.iter().zip(&mean[rank * 6..rank * 6 + 6]).all(|(a, b)| (a - b).abs() <= 1e-6 * (1.0 + b.abs()));
        assert!(close, "rank {rank}: reduce_scatter(avg) must give rank r the r-th chunk of the mean: got {s:?}");
        assert_eq!(scattered_async, s, "rank {rank}: reduce_scatter_async must sum as reduce_scatter does");
    }
}

/// A ring all-reduce of P bytes on N ranks sends 2(N−1) chunks from each rank.
#[rstest]
fn each_rank_sends_2_n_minus_1_chunks_in_an_all_reduce(#[values(2, 3, 4)] world: usize) {
    let len = 1000; // not divisible by 3: chunks of 334 and 333 elements
    let sent: Vec<(u64, u64)> = on_processes(world, |pg| {
        pg.all_reduce(&input(pg.rank(), len, DType::F32), ReduceOp::Sum)?;
        let stats = pg.stats();
        Ok((stats.wire_bytes(Collective::AllReduce), stats.bytes(Collective::AllReduce)))
    });
    let (base, extra) = (len / world, len % world);
    for (rank, &(wire, payload)) in sent.iter().enumerate() {
        assert_eq!(payload, 4 * len as u64, "rank {rank}: the payload is the buffer handed in");
        // Reduce-scatter sends every chunk but the one the rank ends up
        // owning (its own); all-gather every chunk but its successor's.
        let chunk = |c: usize| 4 * (base + usize::from(c < extra)) as u64;
        let all_but = |skip: usize| (0..world).filter(|&c| c != skip).map(chunk).sum::<u64>();
        let want = all_but(rank) + all_but((rank + 1) % world);
        assert_eq!(
            wire, want,
            "rank {rank} of {world}: sent {wire} bytes for a {payload}-byte all-reduce; a ring sends 2(N-1) chunks"
        );
    }
}

#[test]
fn send_recv_passes_each_ranks_tensor_one_step_round_a_ring() {
    for (rank, got) in on_processes(3, |pg| ring_step(&pg)).iter().enumerate() {
        assert_eq!(got, &ring_step_expected(rank, 3), "rank {rank}");
    }
}

#[test]
fn send_and_recv_deliver_in_order_between_any_two_ranks() {
    let got: Vec<Vec<Vec<f32>>> = on_processes(3, |pg| {
        let r = pg.rank();
        let like = input(0, 4, DType::F32);
        // Every rank sends two tensors to each other rank, then receives them.
        for peer in (0..3).filter(|&p| p != r) {
            pg.send(&input(10 * r + peer, 4, DType::F32), peer)?;
            pg.send(&input(100 * r + peer, 4, DType::F32), peer)?;
        }
        let mut received = vec![];
        for peer in (0..3).filter(|&p| p != r) {
            received.push(as_f32(&pg.recv(&like, peer)?));
            received.push(as_f32(&pg.recv(&like, peer)?));
        }
        Ok(received)
    });
    for (rank, received) in got.iter().enumerate() {
        let peers = (0..3).filter(|&p| p != rank);
        let want: Vec<Vec<f32>> = peers
            .flat_map(|p| [as_f32(&input(10 * p + rank, 4, DType::F32)), as_f32(&input(100 * p + rank, 4, DType::F32))])
            .collect();
        assert_eq!(received, &want, "rank {rank}: recv must return what each peer sent, in the order it was sent");
    }
}

#[test]
fn mismatched_collectives_fail_with_both_calls_named() {
    let errors: Vec<String> = on_processes(2, |pg| {
        let t = input(pg.rank(), 6, DType::F32);
        let result = match pg.rank() {
            0 => pg.all_reduce(&t, ReduceOp::Sum).map(drop),
            _ => pg.all_gather(&t).map(drop),
        };
        Ok(result.err().map(|e| e.to_string()).unwrap_or_default())
    });
    let named = errors.iter().any(|e| e.contains("all_reduce") && e.contains("all_gather"));
    assert!(named, "a rank that issues another collective must be named with both calls, got: {errors:?}");
}

#[test]
fn a_rank_that_exits_makes_the_others_fail_at_once_naming_it() {
    let results: Vec<Option<(String, f64)>> = on_processes_some_may_exit(3, |pg| {
        if pg.rank() == 2 {
            std::process::exit(0); // gone without a word, as a crashed process
        }
        let start = std::time::Instant::now();
        let result = pg.all_reduce(&input(pg.rank(), 8, DType::F32), ReduceOp::Sum);
        Ok((result.err().map(|e| e.to_string()).unwrap_or_default(), start.elapsed().as_secs_f64()))
    });
    // Rank 1 waits for rank 2 directly; rank 0 may instead see rank 1 give up.
    let (error, seconds) = results[1].clone().expect("rank 1 reports");
    assert!(error.contains("rank 2"), "rank 1's error must name rank 2, the rank that exited: {error:?}");
    assert!(
        seconds < 10.0,
        "rank 1 waited {seconds:.1} s: a closed connection must fail the collective at once, not at the timeout"
    );
    let (error, _) = results[0].clone().expect("rank 0 reports");
    assert!(!error.is_empty(), "rank 0's collective must fail too");
}

/// The timeout of the liveness tests: short, so that they show what waits past it.
const SHORT_TIMEOUT_S: u64 = 2;

#[test]
fn a_rank_busy_writing_a_checkpoint_is_waited_for_past_the_timeout() {
    let results: Vec<Option<f64>> = on_processes_timing_out_after(2, SHORT_TIMEOUT_S, |pg| {
        let start = std::time::Instant::now();
        if pg.rank() == 0 {
            // Two and a half timeouts: the save ends between two of the
            // waiting rank's looks at whether it is busy, not at one.
            let slow_save = std::time::Duration::from_millis(2500 * SHORT_TIMEOUT_S);
            while_busy(&pg, "writing checkpoint step_000100", || std::thread::sleep(slow_save));
        }
        pg.barrier()?;
        Ok(start.elapsed().as_secs_f64())
    });
    let waited = results[1].expect("rank 1 reports");
    assert!(
        waited >= 2.5 * SHORT_TIMEOUT_S as f64,
        "rank 1 passed the barrier after {waited:.1} s, before rank 0 finished its save"
    );
}

#[test]
fn a_live_rank_that_sends_nothing_times_out_and_is_named() {
    let results: Vec<Option<(String, f64)>> = on_processes_timing_out_after(2, SHORT_TIMEOUT_S, |pg| {
        let start = std::time::Instant::now();
        if pg.rank() == 0 {
            // Stuck in its own work, not saying it is busy.
            std::thread::sleep(std::time::Duration::from_secs(3 * SHORT_TIMEOUT_S));
        }
        let error = pg.barrier().err().map(|e| e.to_string()).unwrap_or_default();
        Ok((error, start.elapsed().as_secs_f64()))
    });
    let (error, waited) = results[1].clone().expect("rank 1 reports");
    assert!(error.contains("rank 0 is alive"), "rank 1's error must say rank 0 is alive but sent nothing: {error:?}");
    assert!(waited < 2.5 * SHORT_TIMEOUT_S as f64, "rank 1 waited {waited:.1} s for a {SHORT_TIMEOUT_S} s timeout");
}

#[test]
fn a_stopped_rank_falls_silent_and_the_others_fail_naming_it() {
    let results: Vec<Option<String>> = on_processes_timing_out_after(2, SHORT_TIMEOUT_S, |pg| {
        let pids = pg.all_gather(&Tensor::new(&[std::process::id()], &Device::Cpu)?)?.to_vec1::<u32>()?;
        if pg.rank() == 1 {
            // Stops every thread of this process, heartbeats included, as a hung machine would.
            // It never joins the barrier: a stop that takes hold late must not let rank 0's
            // barrier pass. Woken by rank 0, it leaves.
            stop_until_woken(3 * SHORT_TIMEOUT_S);
            return Ok(String::new());
        }
        let error = pg.barrier().err().map(|e| e.to_string()).unwrap_or_default();
        signal("CONT", pids[1]);
        Ok(error)
    });
    let error = results[0].clone().expect("rank 0 reports");
    assert!(error.contains("rank 1 stopped answering"), "rank 0's error must say rank 1 fell silent: {error:?}");
}

#[test]
fn a_rank_stopped_mid_all_reduce_is_named_within_the_timeout() {
    let results = all_reduce_beside_a_stopped_rank(2);
    let (error, waited) = results[0].clone().expect("rank 0 reports");
    assert!(error.contains("rank 1 stopped answering"), "rank 0's error must say rank 1 fell silent: {error:?}");
    assert!(
        waited < 1.8 * SHORT_TIMEOUT_S as f64,
        "rank 0 gave up after {waited:.1} s with a {SHORT_TIMEOUT_S} s timeout: a blocked send held it back"
    );
}

#[test]
fn on_three_ranks_a_rank_stopped_mid_all_reduce_is_the_one_both_others_name() {
    // Rank 0 waits on rank 2 to receive; rank 1 waits on rank 2 to read what it sends.
    let results = all_reduce_beside_a_stopped_rank(3);
    for (rank, result) in results.iter().enumerate().take(2) {
        let (error, waited) = result.clone().expect("ranks 0 and 1 report");
        assert!(error.contains("rank 2 "), "rank {rank}'s error must name the stopped rank 2: {error:?}");
        let blamed = (0..2).find(|r| error.contains(&format!("rank {r} closed")));
        assert!(blamed.is_none(), "rank {rank} blames rank {blamed:?}, which only gave up: {error:?}");
        // Rank 1, blocked sending to rank 2, learns the cause from rank 0's abort.
        assert!(waited < 2.5 * SHORT_TIMEOUT_S as f64, "rank {rank} gave up after {waited:.1} s");
    }
}

/// On a 2 × 2 mesh (pairs {0, 1} and {2, 3}, columns {0, 2} and {1, 3}),
/// rank 2 stops; rank 1 waits on rank 0 in their pair's all-reduce while
/// rank 0 waits on rank 2 in their column's. Rank 0 is alive but sends rank 1
/// nothing: rank 1 must learn that rank 2 is the cause, not blame rank 0.
#[test]
fn on_a_mesh_the_stopped_rank_is_named_not_the_rank_waiting_on_it() {
    let results = on_processes_timing_out_after(4, SHORT_TIMEOUT_S, |pg| {
        let pids = pg.all_gather(&Tensor::new(&[std::process::id()], &Device::Cpu)?)?.to_vec1::<u32>()?;
        let (pair, column) = (pg.split(pg.rank() / 2)?, pg.split(pg.rank() % 2)?);
        let one = Tensor::new(&[1f32], &Device::Cpu)?;
        let error = match pg.rank() {
            2 => {
                stop_until_woken(4 * SHORT_TIMEOUT_S);
                return Ok(String::new());
            }
            0 => {
                // Rank 1's wait on rank 0 began first, so its deadline comes first.
                std::thread::sleep(std::time::Duration::from_millis(500 * SHORT_TIMEOUT_S));
                let error = column.all_reduce(&one, ReduceOp::Sum).err();
                std::thread::sleep(std::time::Duration::from_secs(SHORT_TIMEOUT_S)); // rank 1 gives up too
                signal("CONT", pids[2]);
                error
            }
            1 => pair.all_reduce(&one, ReduceOp::Sum).err(),
            _ => None,
        };
        Ok(error.map(|e| e.to_string()).unwrap_or_default())
    });
    for rank in [0, 1] {
        let error = results[rank].clone().expect("ranks 0 and 1 report");
        assert!(
            error.contains("rank 2 stopped answering"),
            "rank {rank}'s error must name the stopped rank 2: {error:?}"
        );
        assert!(
            !error.contains("rank 0 is alive"),
            "rank {rank} blames rank 0, which only waited on rank 2: {error:?}"
        );
    }
}

/// The last of `world` ranks stops its process (SIGSTOP) while the others
/// all-reduce 64 MiB each: more than the sockets buffer, so their writers
/// are still blocked sending when they give up. Each other rank returns its
/// error and how long it took; rank 0 wakes the stopped one afterwards.
fn all_reduce_beside_a_stopped_rank(world: usize) -> Vec<Option<(String, f64)>> {
    let elements = 16 << 20;
    on_processes_timing_out_after(world, SHORT_TIMEOUT_S, |pg| {
        let pids = pg.all_gather(&Tensor::new(&[std::process::id()], &Device::Cpu)?)?.to_vec1::<u32>()?;
        let stopped = world - 1;
        if pg.rank() == stopped {
            stop_until_woken(2 * SHORT_TIMEOUT_S);
            return Ok((String::new(), 0.0));
        }
        let start = std::time::Instant::now();
        let big = Tensor::ones(elements, DType::F32, &Device::Cpu)?;
        let error = pg.all_reduce(&big, ReduceOp::Sum).err().map(|e| e.to_string()).unwrap_or_default();
        let waited = start.elapsed().as_secs_f64();
        if pg.rank() == 0 {
            std::thread::sleep(std::time::Duration::from_secs(SHORT_TIMEOUT_S)); // the others give up too
            signal("CONT", pids[stopped]);
        }
        Ok((error, waited))
    })
}

/// Stops this process (SIGSTOP) and, once it runs again, returns when it
/// has been woken (SIGCONT) or `seconds` after the stop, whichever is first.
/// The stop takes hold while `kill` runs, so a sleep after it would begin
/// only once woken and hold the test up for all of its length. The
/// monotonic clock runs on while a process is stopped, and the others wake
/// it only after their timeout: a step (sending the stop, or a short nap)
/// that took over half of that spanned the stop.
fn stop_until_woken(seconds: u64) {
    let start = std::time::Instant::now();
    let spanned_the_stop = |step: std::time::Instant| step.elapsed().as_millis() > 500 * SHORT_TIMEOUT_S as u128;
    signal("STOP", std::process::id());
    let mut step = start;
    while !spanned_the_stop(step) && start.elapsed().as_secs() < seconds {
        step = std::time::Instant::now();
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// Sends `signal` to process `pid` with the system's `kill`.
fn signal(signal: &str, pid: u32) {
    let status = Command::new("kill").args([&format!("-{signal}"), &pid.to_string()]).status();
    assert!(status.is_ok_and(|s| s.success()), "kill -{signal} {pid} failed");
}

/// An `_async` call returns before its peers have even joined it, the ring
/// runs while the caller computes, and calls complete in the order they were
/// issued whatever order they are waited on.
#[test]
fn async_collectives_run_while_the_caller_computes() {
    let results: Vec<(f64, Vec<Vec<f32>>)> = on_processes(2, |pg| {
        assert!(pg.properties().overlaps);
        if pg.rank() == 1 {
            std::thread::sleep(std::time::Duration::from_millis(1500)); // joins late
        }
        let start = std::time::Instant::now();
        let t = input(pg.rank(), 10, DType::F32);
        let works = vec![
            pg.all_reduce_async(&t, ReduceOp::Sum)?,
            pg.all_gather_async(&t)?,
            pg.reduce_scatter_async(&t, ReduceOp::Sum)?,
        ];
        let returned_after = start.elapsed().as_secs_f64();
        let mut got: Vec<Vec<f32>> = vec![];
        for work in works.into_iter().rev() {
            got.push(as_f32(&work.wait()?));
        }
        got.reverse();
        Ok((returned_after, got))
    });
    let (returned_after, _) = results[0];
    assert!(returned_after < 0.5, "rank 0's async calls took {returned_after:.2} s to return: they waited for rank 1");
    let sum = sum_in_order(0..2, 10, DType::F32);
    let gathered: Vec<f32> = (0..2).flat_map(|r| as_f32(&input(r, 10, DType::F32))).collect();
    for (rank, (_, got)) in results.iter().enumerate() {
        assert_eq!(got[0], sum, "rank {rank}: all_reduce_async");
        assert_eq!(got[1], gathered, "rank {rank}: all_gather_async");
        assert_eq!(got[2], sum[rank * 5..rank * 5 + 5].to_vec(), "rank {rank}: reduce_scatter_async");
    }
}

/// The harness stops every other rank as soon as one fails, as the launcher
/// does: a rank that would otherwise wait a minute (over NCCL, a peer stuck
/// in a collective waits forever) cannot hold the test.
#[test]
fn a_failing_rank_stops_the_others_at_once() {
    let started = std::time::Instant::now();
    let failed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        on_processes(2, |pg| {
            if pg.rank() == 1 {
                candle_core::bail!("rank 1 fails on purpose");
            }
            std::thread::sleep(std::time::Duration::from_secs(60));
            Ok(())
        })
    }));
    let panic = failed.expect_err("a failing rank must fail the test");
    let message = panic.downcast_ref::<String>().map_or("", String::as_str);
    assert!(message.contains("rank 1 of 2 failed") && message.contains("fails on purpose"), "{message}");
    assert!(started.elapsed().as_secs() < 30, "the sleeping rank held the test for {:?}", started.elapsed());
}
