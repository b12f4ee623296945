//! Exercise 20: a SwiGLU MLP split across ranks, Megatron style. The expected
//! output is the whole MLP computed here on plain f64 numbers,
//! `down(silu(gate x) ⊙ up x)`; a wrong output is compared with what each
//! typical mistake computes on the same numbers, and named only when it
//! matches. The collectives are counted by the process group.

use std::time::Duration;

use candle_core::{Device, Tensor};
use rstest::rstest;
use workbook::distributed::{spawn_with_timeout, Collective, ProcessGroup, SharedGroup};
use workbook::parallel::tensor::TensorParallelMlp;

use crate::process_ranks::on_processes;
use crate::support::{cause, explain_error, first_mismatch, mistake, number};

const TIMEOUT: Duration = Duration::from_secs(10);
const C: usize = 8;
/// Divides by 1, 2, 3 and 4 ranks.
const I: usize = 12;
/// Rows of x: B·T with B = 2, T = 3.
const ROWS: usize = 6;

type Matrix = Vec<Vec<f64>>;

fn values(rows: usize, cols: usize, salt: usize) -> Matrix {
    (0..rows).map(|r| (0..cols).map(|c| (((r * 7 + c * 3 + salt) % 11) as f64 - 5.0) * 0.15).collect()).collect()
}

fn weights() -> (Matrix, Matrix, Matrix) {
    (values(I, C, 1), values(I, C, 4), values(C, I, 9)) // gate (I, C), up (I, C), down (C, I)
}

fn x() -> Matrix {
    values(ROWS, C, 2)
}

fn silu(z: f64) -> f64 {
    z / (1.0 + (-z).exp())
}

/// `rows (n, k) · wᵀ` for `w` (m, k): a linear layer without bias.
fn linear(rows: &Matrix, w: &Matrix) -> Matrix {
    rows.iter().map(|r| w.iter().map(|wr| r.iter().zip(wr).map(|(a, b)| a * b).sum()).collect()).collect()
}

/// The hidden units `units` of the MLP for every row of x.
fn hidden(units: std::ops::Range<usize>) -> Matrix {
    let (gate, up, _) = weights();
    let (g, u) = (linear(&x(), &gate[units.clone()].to_vec()), linear(&x(), &up[units].to_vec()));
    g.iter().zip(&u).map(|(g, u)| g.iter().zip(u).map(|(g, u)| silu(*g) * u).collect()).collect()
}

/// The share of the output that hidden units `units` contribute.
fn share(units: std::ops::Range<usize>) -> Matrix {
    let (_, _, down) = weights();
    let down_cols: Matrix = down.iter().map(|row| row[units.clone()].to_vec()).collect();
    linear(&hidden(units), &down_cols)
}

fn whole() -> Matrix {
    share(0..I)
}

fn as_tensor(m: &Matrix, shape: &[usize]) -> candle_core::Result<Tensor> {
    Tensor::from_vec(m.iter().flatten().map(|&v| v as f32).collect::<Vec<_>>(), shape, &Device::Cpu)
}

/// What one rank ends with.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct RankRun {
    shapes: [Vec<usize>; 3],
    /// The three shards' values, row by row.
    held: [Vec<f32>; 3],
    /// The forward's output, or its error (a shard of the wrong shape fails there).
    output: Result<Vec<f32>, String>,
    /// (all-reduce calls, their payload bytes, all-gather calls) in forward.
    collectives: (u64, u64, u64),
}

/// The learner's shard of the test's MLP for rank `pg`.
fn shard_for(pg: &dyn ProcessGroup) -> candle_core::Result<TensorParallelMlp> {
    let (gate, up, down) = weights();
    let (gate, up, down) = (as_tensor(&gate, &[I, C])?, as_tensor(&up, &[I, C])?, as_tensor(&down, &[C, I])?);
    TensorParallelMlp::shard(&gate, &up, &down, pg.rank(), pg.world_size())
}

fn rank_run(pg: Box<dyn ProcessGroup>) -> candle_core::Result<RankRun> {
    let pg = SharedGroup::new(pg);
    let shard = shard_for(&pg)?;
    let shards = [&shard.gate_proj, &shard.up_proj, &shard.down_proj];
    let shapes = shards.map(|t| t.dims().to_vec());
    let [gate, up, down] = shards.map(|t| t.flatten_all().and_then(|t| t.to_vec1::<f32>()));
    let held = [gate?, up?, down?];
    let before = pg.stats();
    let output = shard.forward(&pg, &as_tensor(&x(), &[2, 3, C])?).and_then(|y| y.flatten_all()?.to_vec1::<f32>());
    let output = output.map_err(|e| explain_error(&e));
    let used = pg.stats().since(&before);
    let collectives =
        (used.calls(Collective::AllReduce), used.bytes(Collective::AllReduce), used.calls(Collective::AllGather));
    Ok(RankRun { shapes, held, output, collectives })
}

fn run(world: usize) -> Vec<RankRun> {
    spawn_with_timeout(world, TIMEOUT, |pg| rank_run(Box::new(pg)))
        .unwrap_or_else(|e| panic!("the tensor-parallel MLP on {world} ranks failed: {}", explain_error(&e)))
}

fn close(got: &[f32], want: &Matrix) -> bool {
    first_mismatch(got, &want.concat(), near).is_none()
}

fn near(got: f64, want: f64) -> bool {
    (got - want).abs() <= 1e-5 + 1e-5 * want.abs()
}

#[rstest]
fn each_rank_holds_the_part_of_each_weight_its_units_need(#[values(1, 2, 3, 4)] world: usize) {
    let part = I / world;
    for (rank, got) in run(world).iter().enumerate() {
        let [gate, up, down] = &got.shapes;
        let why = if gate[..] == [I, C / world] {
            Some(mistake(20, "gate_up_split_by_input"))
        } else {
            (down[..] == [C / world, I]).then(|| mistake(20, "down_split_by_output"))
        };
        assert!(
            got.shapes == [vec![part, C], vec![part, C], vec![C, part]],
            "rank {rank} of {world} holds gate {gate:?}, up {up:?}, down {down:?}; its {part} hidden units are \
             gate and up ({part}, {C}) and down ({C}, {part}){}",
            cause(why)
        );
        // Its units are rows of gate and up, columns of down.
        let units = rank * part..(rank + 1) * part;
        let (gate, up, down) = weights();
        let down_cols: Matrix = down.iter().map(|row| row[units.clone()].to_vec()).collect();
        let want = [gate[units.clone()].concat(), up[units.clone()].concat(), down_cols.concat()];
        for ((name, held), want) in ["gate", "up", "down"].iter().zip(&got.held).zip(&want) {
            if let Some(difference) = first_mismatch(held, want, near) {
                panic!(
                    "rank {rank} of {world} holds {name} of the right shape, but not its own hidden units \
                     {units:?} (rows of gate and up, columns of down): {difference}"
                );
            }
        }
    }
}

#[rstest]
fn every_rank_gets_the_whole_mlps_output(#[values(1, 2, 3, 4)] world: usize) {
    let want = whole();
    let part = I / world;
    for (rank, got) in run(world).iter().enumerate() {
        let output = match &got.output {
            Ok(output) => output,
            Err(e) => panic!("on {world} ranks, rank {rank}'s forward failed: {e}"),
        };
        if close(output, &want) {
            continue;
        }
        let own_share = close(output, &share(rank * part..(rank + 1) * part));
        let averaged = close(output, &want.iter().map(|r| r.iter().map(|v| v / world as f64).collect()).collect());
        let why = if own_share {
            Some(mistake(20, "no_all_reduce"))
        } else {
            averaged.then(|| mistake(20, "averaged_not_summed"))
        };
        let flat: Vec<f64> = want.iter().flatten().copied().collect();
        let first = output.iter().zip(&flat).position(|(&g, w)| (g as f64 - w).abs() > 1e-5).unwrap_or(0);
        panic!(
            "on {world} ranks, rank {rank}'s output element {first} is {}, expected {} (the whole MLP){}",
            number(output.get(first).copied().unwrap_or(f32::NAN) as f64),
            number(flat[first]),
            cause(why)
        );
    }
}

#[rstest]
fn forward_is_one_all_reduce_of_the_output(#[values(2, 4)] world: usize) {
    let output_bytes = (ROWS * C * 4) as u64;
    for (rank, got) in run(world).iter().enumerate() {
        if let Err(e) = &got.output {
            panic!("rank {rank}'s forward failed before its collectives could be counted: {e}");
        }
        let (all_reduces, bytes, all_gathers) = got.collectives;
        // A rank's hidden activations, (ROWS, I / N): what an all-reduce in the middle carries.
        let hidden_bytes = (ROWS * I / world * 4) as u64;
        let right_output = got.output.as_ref().is_ok_and(|y| close(y, &whole()));
        let why = match (all_reduces, all_gathers) {
            (0, 0) => Some(mistake(20, "no_all_reduce")),
            (0, _) if right_output => Some(mistake(20, "gathered_and_summed")),
            (n, _) if n > 0 && bytes == hidden_bytes + (n - 1) * output_bytes => {
                Some(mistake(20, "all_reduce_in_the_middle"))
            }
            _ => None,
        };
        assert!(
            (all_reduces, bytes, all_gathers) == (1, output_bytes, 0),
            "rank {rank}'s forward made {all_reduces} all-reduce(s) of {bytes} bytes and {all_gathers} all-gather(s); \
             the split needs one all-reduce of the ({ROWS}, {C}) output, {output_bytes} bytes{}",
            cause(why)
        );
    }
}

#[test]
fn a_width_the_ranks_do_not_divide_is_an_error() {
    let results = spawn_with_timeout(5, TIMEOUT, |pg| Ok(shard_for(&pg).err().map(|e| e.to_string()))).unwrap();
    assert!(results.iter().all(Option::is_some), "splitting {I} hidden units across 5 ranks must be an error");
}

/// Each rank a process, the output summed over TCP.
#[test]
fn it_runs_across_processes_over_tcp() {
    let runs: Vec<RankRun> = on_processes(2, |pg| rank_run(Box::new(pg)));
    for (rank, got) in runs.iter().enumerate() {
        let difference = match &got.output {
            Ok(y) => first_mismatch(y, &whole().concat(), near),
            Err(error) => Some(format!("an error: {error}")),
        };
        if let Some(difference) = difference {
            panic!("rank {rank}'s process: its output: {difference} (the whole MLP's)");
        }
    }
}
