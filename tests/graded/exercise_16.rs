//! Exercise 16: ring all-reduce from send and recv. The expected result is
//! the sum of every rank's tensor, added here in f64 with no collective at
//! all. A wrong result is compared with what each typical mistake produces,
//! computed by running that mistake's ring on plain numbers (`ring`), and
//! named only when it matches.

use std::time::Duration;

use candle_core::{DType, Device, Tensor};
use rstest::rstest;
use workbook::distributed::{chunk_ranges, spawn_with_timeout, Collective, ProcessGroup};
use workbook::phase4_under_the_hood::ring_all_reduce;

use crate::process_ranks::on_processes;
use crate::support::{cause, mistake, number};

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

/// The typical mistakes this test can recognise from the numbers alone.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Ring {
    Textbook,
    ReduceScatterOnly,
    ReceivedNotAdded,
    ChunkIndexOffByOne,
}

/// What every rank ends with when all of them run `ring` on their `input`:
/// the algorithm on plain numbers, one step at a time, all ranks together.
fn ring(kind: Ring, world: usize, len: usize) -> Vec<Vec<f32>> {
    let ranges = chunk_ranges(len, world);
    let mut chunks: Vec<Vec<Vec<f32>>> =
        (0..world).map(|r| ranges.iter().map(|c| input(r, len)[c.clone()].to_vec()).collect()).collect();
    let n = world;
    for s in 0..n - 1 {
        let recv_index = |r: usize| (r + 2 * n - s - 1) % n;
        let send_index = |r: usize| if kind == Ring::ChunkIndexOffByOne { recv_index(r) } else { (r + n - s) % n };
        let sent: Vec<Vec<f32>> = (0..n).map(|r| chunks[r][send_index(r)].clone()).collect();
        for (r, rank_chunks) in chunks.iter_mut().enumerate() {
            let incoming = &sent[(r + n - 1) % n];
            let own = &mut rank_chunks[recv_index(r)];
            if incoming.len() != own.len() {
                return vec![vec![f32::NAN; len]; n]; // a shape error in the real thing
            }
            match kind {
                Ring::ReceivedNotAdded => own.clone_from(incoming),
                _ => own.iter_mut().zip(incoming).for_each(|(o, i)| *o += i),
            }
        }
    }
    if kind != Ring::ReduceScatterOnly {
        for s in 0..n - 1 {
            let sent: Vec<Vec<f32>> = (0..n).map(|r| chunks[r][(r + 1 + n - s) % n].clone()).collect();
            for (r, rank_chunks) in chunks.iter_mut().enumerate() {
                rank_chunks[(r + n - s) % n].clone_from(&sent[(r + n - 1) % n]);
            }
        }
    }
    chunks.into_iter().map(|c| c.concat()).collect()
}

/// Whether `got` equals `want` within f32 rounding of a sum in another order.
fn close(got: &[f32], want: &[f32]) -> bool {
    got.len() == want.len() && got.iter().zip(want).all(|(g, w)| (g - w).abs() <= 1e-5 + 1e-5 * w.abs())
}

/// Runs the learner's ring on `world` thread ranks, each on its `input` of
/// `len` elements shaped `shape`; each rank's result as numbers, or the error.
fn run(world: usize, len: usize, shape: &[usize]) -> Result<Vec<Vec<f32>>, String> {
    let results = spawn_with_timeout(world, TIMEOUT, |pg| {
        let t = Tensor::from_vec(input(pg.rank(), len), shape, &Device::Cpu)?;
        let out = ring_all_reduce(&pg, &t)?;
        if out.dims() != shape {
            candle_core::bail!("the result has shape {:?}, the input {shape:?}: keep the input's shape", out.dims());
        }
        out.flatten_all()?.to_vec1::<f32>()
    });
    results.map_err(|e| e.to_string())
}

/// Why a run that failed with `error` failed, when the error shows it.
fn diagnose_error(error: &str, world: usize, len: usize) -> Option<&'static str> {
    if error.contains("recv(src") && error.contains("timed out") {
        return Some(mistake(16, "wrong_neighbour"));
    }
    // Fails only where the length does not divide: the chunking drops the rest.
    let divides_fine = !len.is_multiple_of(world)
        && run(world, world * 3, &[world * 3])
            .is_ok_and(|got| got.iter().all(|rank| close(rank, &expected(world, world * 3))));
    divides_fine.then(|| mistake(16, "remainder_dropped"))
}

/// Which typical mistake gives exactly `got`, if one does.
fn diagnose(got: &[Vec<f32>], world: usize, len: usize) -> Option<&'static str> {
    [
        (Ring::ReduceScatterOnly, "reduce_scatter_only"),
        (Ring::ReceivedNotAdded, "received_not_added"),
        (Ring::ChunkIndexOffByOne, "chunk_index_off_by_one"),
    ]
    .into_iter()
    .find(|(kind, _)| ring(*kind, world, len).iter().zip(got).all(|(want, got)| close(got, want)))
    .map(|(_, id)| mistake(16, id))
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
    // The mistakes' rings below are only as good as this one.
    assert!(ring(Ring::Textbook, world, len).iter().all(|r| close(r, &want)), "the test's own ring is wrong");
    let got = match run(world, len, shape) {
        Ok(got) => got,
        Err(e) => panic!(
            "ring_all_reduce on {world} ranks, a tensor of shape {shape:?}, failed: {e}{}",
            cause(diagnose_error(&e, world, len))
        ),
    };
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
            cause(diagnose(&got, world, len))
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
    .unwrap_or_else(|e| panic!("ring_all_reduce on {world} ranks failed: {e}"));
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
    .unwrap_or_else(|e| panic!("ring_all_reduce of a bf16 tensor failed: {e}"));
    assert!(dtypes.iter().all(|&d| d == DType::BF16), "a bf16 input gave {dtypes:?}: add in the dtype you are handed");
}

/// Each rank a process of its own, the chunks over TCP: the ring as it runs on a cluster.
#[test]
fn it_runs_across_processes_over_tcp() {
    let (world, len) = (3, 10);
    let got: Vec<Vec<f32>> = on_processes(world, |pg| {
        let t = Tensor::from_vec(input(pg.rank(), len), len, &Device::Cpu)?;
        ring_all_reduce(&pg, &t)?.to_vec1::<f32>()
    });
    for (rank, values) in got.iter().enumerate() {
        assert!(close(values, &expected(world, len)), "rank {rank}'s process got {values:?}");
    }
}
