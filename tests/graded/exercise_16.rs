//! Exercise 16: ring all-reduce from send and recv. The expected result is
//! the sum of every rank's tensor, added here in f64 with no collective at
//! all. Each rank's sends and receives are recorded on the way; a typical
//! mistake is named only when that record shows it (a rank that passes on
//! what it received without adding to it, a receive from a rank that never
//! sends to it), otherwise the first wrong element is reported.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use candle_core::{DType, Device, Tensor};
use rstest::rstest;
use workbook::distributed::{chunk_ranges, spawn_with_timeout, Collective, P2pRecorder, P2pTrace, ProcessGroup};
use workbook::phase4_under_the_hood::ring_all_reduce;

use crate::process_ranks::{every_rank, on_processes_timing_out_after};
use crate::support::{cause, explain_error, first_mismatch, mistake, number};

/// Long enough for any healthy ring on a busy machine, short enough that a
/// ring whose ranks wait for each other fails fast.
const TIMEOUT: Duration = Duration::from_secs(5);

/// Rank `rank`'s tensor: values that differ per rank and per element.
fn input(rank: usize, len: usize) -> Vec<f32> {
    (0..len).map(|i| ((rank * 7 + i * 3) % 11) as f32 * 0.25 - 1.0 + rank as f32 * 0.5).collect()
}

/// The sum of every rank's `input`, element by element.
fn expected(world: usize, len: usize) -> Vec<f32> {
    (0..len).map(|i| (0..world).map(|r| input(r, len)[i] as f64).sum::<f64>() as f32).collect()
}

/// Whether `got` equals `want` within f32 rounding of a sum in another order.
fn close(got: &[f32], want: &[f32]) -> bool {
    got.len() == want.len() && got.iter().zip(want).all(|(&g, &w)| near(g as f64, w as f64))
}

fn near(got: f64, want: f64) -> bool {
    (got - want).abs() <= 1e-5 + 1e-5 * want.abs()
}

/// Runs the learner's ring on `world` thread ranks, each on its `input` of
/// `len` elements shaped `shape`: each rank's result as numbers (or the
/// error), and what each rank sent and received.
fn run(world: usize, len: usize, shape: &[usize]) -> (std::result::Result<Vec<Vec<f32>>, String>, Vec<P2pTrace>) {
    let traces: Vec<Arc<Mutex<P2pTrace>>> = (0..world).map(|_| Arc::default()).collect();
    let results = spawn_with_timeout(world, TIMEOUT, |pg| {
        let rank = pg.rank();
        let t = Tensor::from_vec(input(rank, len), shape, &Device::Cpu)?;
        let recorded = P2pRecorder::around(Box::new(pg), traces[rank].clone());
        let out = ring_all_reduce(&recorded, &t)?;
        if out.dims() != shape {
            candle_core::bail!("the result has shape {:?}, the input {shape:?}: keep the input's shape", out.dims());
        }
        out.flatten_all()?.to_vec1::<f32>()
    });
    (results.map_err(|e| explain_error(&e)), traces.iter().map(|t| t.lock().unwrap().clone()).collect())
}

/// A typical mistake the record of sends and receives shows, if one does;
/// `failure`: the group's error, `None` when the ranks returned (with wrong
/// numbers) rather than failing.
fn diagnose(traces: &[P2pTrace], world: usize, len: usize, failure: Option<&str>) -> Option<&'static str> {
    let finished = failure.is_none();
    // A rank waited for one that sent, but never to it, and that is what
    // stopped the group: after another error, the ranks stop before sending
    // all. A rank that sent nothing at all is no evidence: it may wait in a
    // recv of its own (every rank receiving before it sends).
    let waits = ["can never complete", "did not send", "finished without sending"];
    let stuck = failure.is_some_and(|e| waits.iter().any(|w| e.contains(w)));
    let sends_elsewhere =
        |src: usize, dst: usize| traces.get(src).is_some_and(|t| !t.sent_to.is_empty() && !t.sent_to.contains(&dst));
    if stuck && traces.iter().enumerate().any(|(rank, t)| t.waited_on.iter().any(|&src| sends_elsewhere(src, rank))) {
        return Some(mistake(16, "wrong_neighbour"));
    }
    // Every rank sent its 2(N − 1) chunks to rank − 1 and received from rank
    // + 1: a ring the other way round (on 2 ranks the two ways are one). A
    // group that failed on the way recorded only part of the ring's way.
    let reversed = |rank: usize, t: &P2pTrace| {
        let (left, right) = ((rank + world - 1) % world, (rank + 1) % world);
        t.sent_to.len() == 2 * (world - 1)
            && t.sent_to.iter().all(|&to| to == left)
            && t.waited_on.iter().all(|&from| from == right)
    };
    if finished && world >= 3 && traces.iter().enumerate().all(|(rank, t)| reversed(rank, t)) {
        return Some(mistake(16, "ring_reversed"));
    }
    // Every message a whole len / N when N does not divide len: the rest was cut off.
    let cut = len / world;
    if !len.is_multiple_of(world) && traces.iter().all(|t| !t.sent.is_empty() && t.sent.iter().all(|v| v.len() == cut))
    {
        return Some(mistake(16, "remainder_dropped"));
    }
    let chunks = chunk_ranges(len, world);
    // With one-number chunks a value could match another by chance.
    if world < 2 || chunks.iter().any(|c| c.len() < 2) {
        return None;
    }
    // After its first receive, a rank passes on a chunk it added that arrival to.
    let second_send_is = |is: &dyn Fn(usize, &P2pTrace, &[f32]) -> bool| {
        traces.iter().enumerate().all(|(rank, t)| t.sent.get(1).is_some_and(|v| is(rank, t, v)))
    };
    if second_send_is(&|_, t, v| t.received.first().is_some_and(|arrived| close(v, arrived))) {
        return Some(mistake(16, "received_not_added"));
    }
    let own_chunk = |rank: usize, v: &[f32]| chunks.iter().any(|c| close(v, &input(rank, len)[c.clone()]));
    if world >= 3 && second_send_is(&|rank, _, v| own_chunk(rank, v)) {
        return Some(mistake(16, "chunk_index_off_by_one"));
    }
    if finished && traces.iter().all(|t| t.sent.len() == world - 1) {
        return Some(mistake(16, "reduce_scatter_only"));
    }
    // Through the reduce-scatter each send after a receive is one of the rank's
    // own chunks plus that arrival; the all-gather starts from the chunk the
    // last arrival finished. A rank that adds right but then sends another
    // chunk passes on one that is not finished.
    let adds_arrival = |rank: usize, t: &P2pTrace, s: usize| match (t.sent.get(s), t.received.get(s - 1)) {
        (Some(sent), Some(arrived)) => chunks.iter().any(|c| {
            let own = &input(rank, len)[c.clone()];
            own.len() == sent.len()
                && own.len() == arrived.len()
                && close(sent, &own.iter().zip(arrived).map(|(o, a)| o + a).collect::<Vec<f32>>())
        }),
        _ => false,
    };
    // On 2 ranks the reduce-scatter has no send after a receive: nothing
    // shows it right, and a wrong one leaves the all-gather an unfinished chunk too.
    let scatter_adds =
        world >= 3 && traces.iter().enumerate().all(|(rank, t)| (1..world - 1).all(|s| adds_arrival(rank, t, s)));
    let gathers_another = traces.iter().enumerate().all(|(rank, t)| !adds_arrival(rank, t, world - 1));
    if scatter_adds && gathers_another && traces.iter().all(|t| t.sent.len() >= world) {
        return Some(mistake(16, "gather_not_reduced"));
    }
    None
}

/// 12 elements divide by 1–4; 10 do not divide by 3 or 4, so chunks differ
/// in length; 3 leave rank 3's chunk empty on 4 ranks.
#[rstest]
fn every_rank_gets_the_sum_of_every_ranks_tensor(
    #[values(1, 2, 3, 4)] world: usize,
    #[values(&[2, 6][..], &[10][..], &[3][..])] shape: &[usize],
) {
    let len: usize = shape.iter().product();
    let want = expected(world, len);
    let (got, traces) = run(world, len, shape);
    let got = match got {
        Ok(got) => got,
        Err(e) => panic!(
            "ring_all_reduce on {world} ranks, a tensor of shape {shape:?}, failed: {e}{}",
            cause(diagnose(&traces, world, len, Some(&e)))
        ),
    };
    // Every rank holding the sum over N: a mean, whatever the ring did on the way.
    let mean: Vec<f32> = want.iter().map(|w| w / world as f32).collect();
    let averaged = world > 1 && got.iter().all(|values| close(values, &mean));
    for (rank, values) in got.iter().enumerate() {
        if close(values, &want) {
            continue;
        }
        let first = values.iter().zip(&want).position(|(g, w)| (g - w).abs() > 1e-5 + 1e-5 * w.abs()).unwrap_or(0);
        let chunk = chunk_ranges(len, world).iter().position(|c| c.contains(&first)).unwrap_or(0);
        panic!(
            "ring_all_reduce on {world} ranks, {len} elements: rank {rank}'s element {first} (in chunk {chunk}) is {}, \
             expected {} (the sum over the ranks){}",
            number(values[first] as f64),
            number(want[first] as f64),
            cause(if averaged { Some(mistake(16, "averaged")) } else { diagnose(&traces, world, len, None) })
        );
    }
}

#[rstest]
fn each_rank_sends_2_n_minus_1_chunks_of_a_nth_of_the_tensor(#[values(2, 3, 4)] world: usize) {
    let len = 12;
    let sent = spawn_with_timeout(world, TIMEOUT, |pg| {
        let t = Tensor::from_vec(input(pg.rank(), len), len, &Device::Cpu)?;
        let before = pg.stats();
        ring_all_reduce(&pg, &t)?;
        let used = pg.stats().since(&before);
        Ok((used.calls(Collective::Send), used.wire_bytes(Collective::Send), used.calls(Collective::AllReduce)))
    })
    .unwrap_or_else(|e| panic!("ring_all_reduce on {world} ranks failed: {}", explain_error(&e)));
    let payload = (len * 4) as u64;
    let (want_sends, want_bytes) = (2 * (world as u64 - 1), 2 * (world as u64 - 1) * payload / world as u64);
    for (rank, &(sends, bytes, all_reduces)) in sent.iter().enumerate() {
        assert_eq!(all_reduces, 0, "rank {rank} called pg.all_reduce: build the ring from send and recv only");
        let whole = (bytes >= sends * payload && sends > 0).then(|| mistake(16, "whole_tensor_sent"));
        assert!(
            (sends, bytes) == (want_sends, want_bytes),
            "rank {rank} of {world} sent {sends} messages, {bytes} bytes, for a {payload}-byte tensor; a ring sends \
             2(N−1) = {want_sends} chunks, 2(N−1)/N · {payload} = {want_bytes} bytes{}",
            cause(whole)
        );
    }
}

#[test]
fn the_result_keeps_the_inputs_dtype() {
    let dtypes = spawn_with_timeout(2, TIMEOUT, |pg| {
        let t = Tensor::from_vec(input(pg.rank(), 6), (2, 3), &Device::Cpu)?.to_dtype(DType::BF16)?;
        Ok(ring_all_reduce(&pg, &t)?.dtype())
    })
    .unwrap_or_else(|e| panic!("ring_all_reduce of a bf16 tensor failed: {}", explain_error(&e)));
    assert!(dtypes.iter().all(|&d| d == DType::BF16), "a bf16 input gave {dtypes:?}: add in the dtype you are handed");
}

/// Each rank a process of its own, the chunks over TCP: the ring as it runs on a cluster.
#[test]
fn it_runs_across_processes_over_tcp() {
    let (world, len) = (3, 10);
    // Ten floats a rank: a rank that waits 10 s for one is in a deadlock,
    // which the tests on threads have named already.
    let got: Vec<Vec<f32>> = every_rank(on_processes_timing_out_after(world, 10, |pg| {
        let t = Tensor::from_vec(input(pg.rank(), len), len, &Device::Cpu)?;
        ring_all_reduce(&pg, &t)?.to_vec1::<f32>()
    }));
    let want: Vec<f64> = expected(world, len).into_iter().map(f64::from).collect();
    for (rank, values) in got.iter().enumerate() {
        if let Some(difference) = first_mismatch(values, &want, near) {
            panic!("rank {rank}'s process: {difference} (the sum over the ranks)");
        }
    }
}
