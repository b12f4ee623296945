//! Exercise 20: a SwiGLU MLP split across ranks, Megatron style, with its
//! collectives recorded as the operators f and g. The expected numbers are
//! computed here on plain f64 numbers: the whole MLP `down(silu(gate x) ⊙ up x)`
//! and its backward written out by the chain rule, and f and g on a few
//! worked numbers. A wrong result is compared with what each typical mistake
//! computes on the same numbers, and named only when it matches. The
//! collectives are counted by the process group, forward and backward apart.

use std::ops::Range;
use std::time::Duration;

use candle_core::{Device, Tensor, Var};
use rstest::rstest;
use workbook::autograd::vjp;
use workbook::distributed::{spawn_with_timeout, Collective, CommStats, ProcessGroup, SharedGroup};
use workbook::parallel::tensor::TensorParallelMlp;
use workbook::phase4_under_the_hood::{copy_to_tensor_parallel, reduce_from_tensor_parallel};

use crate::process_ranks::on_processes;
use crate::support::{cause, explain_error, first_mismatch, mistake};

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

/// ∂L/∂y, the same on every rank: every rank computes the same loss from the whole output.
fn grad_output() -> Matrix {
    values(ROWS, C, 5)
}

fn scaled(m: &Matrix, by: f64) -> Matrix {
    m.iter().map(|row| row.iter().map(|v| v * by).collect()).collect()
}

fn sigmoid(z: f64) -> f64 {
    1.0 / (1.0 + (-z).exp())
}

fn silu(z: f64) -> f64 {
    z * sigmoid(z)
}

/// d silu(z) / dz.
fn silu_slope(z: f64) -> f64 {
    sigmoid(z) * (1.0 + z * (1.0 - sigmoid(z)))
}

fn transpose(m: &Matrix) -> Matrix {
    (0..m[0].len()).map(|c| m.iter().map(|row| row[c]).collect()).collect()
}

/// `rows (n, k) · wᵀ` for `w` (m, k): a linear layer without bias.
fn linear(rows: &Matrix, w: &Matrix) -> Matrix {
    rows.iter().map(|r| w.iter().map(|wr| r.iter().zip(wr).map(|(a, b)| a * b).sum()).collect()).collect()
}

fn elementwise(a: &Matrix, b: &Matrix, f: impl Fn(f64, f64) -> f64) -> Matrix {
    a.iter().zip(b).map(|(a, b)| a.iter().zip(b).map(|(a, b)| f(*a, *b)).collect()).collect()
}

/// What hidden units `units` of the whole MLP do with input `x`: their share
/// of the output, and the gradients a backward from `grad_output` gives
/// through them alone.
struct Units {
    share: Matrix,
    /// ∂L/∂x through these units only: a part of the whole ∂L/∂x.
    grad_x: Matrix,
    /// ∂L/∂ of gate's and up's rows (units, C) and of down's columns (C, units).
    grad_gate: Matrix,
    grad_up: Matrix,
    grad_down: Matrix,
}

fn units(x: &Matrix, units: Range<usize>) -> Units {
    let (gate, up, down) = weights();
    let (gate, up) = (gate[units.clone()].to_vec(), up[units.clone()].to_vec());
    let down: Matrix = down.iter().map(|row| row[units.clone()].to_vec()).collect();
    let (a, u) = (linear(x, &gate), linear(x, &up)); // (ROWS, units)
    let h = elementwise(&a, &u, |a, u| silu(a) * u);
    let grad_h = linear(&grad_output(), &transpose(&down)); // (ROWS, units)
    let grad_u = elementwise(&grad_h, &a, |g, a| g * silu(a));
    let grad_a = elementwise(&elementwise(&grad_h, &u, |g, u| g * u), &a, |g, a| g * silu_slope(a));
    let through_gate = linear(&grad_a, &transpose(&gate));
    Units {
        share: linear(&h, &down),
        grad_x: elementwise(&through_gate, &linear(&grad_u, &transpose(&up)), |a, b| a + b),
        grad_gate: linear(&transpose(&grad_a), &transpose(x)),
        grad_up: linear(&transpose(&grad_u), &transpose(x)),
        grad_down: linear(&transpose(&grad_output()), &transpose(&h)),
    }
}

fn whole() -> Units {
    units(&x(), 0..I)
}

fn own_units(rank: usize, world: usize) -> Range<usize> {
    rank * I / world..(rank + 1) * I / world
}

fn as_tensor(m: &Matrix, shape: &[usize]) -> candle_core::Result<Tensor> {
    Tensor::from_vec(m.iter().flatten().map(|&v| v as f32).collect::<Vec<_>>(), shape, &Device::Cpu)
}

fn flat(t: &Tensor) -> candle_core::Result<Vec<f32>> {
    t.flatten_all()?.to_vec1::<f32>()
}

/// Where `got` first differs from `want` by more than f32's rounding at
/// `want`'s scale, if it does.
fn difference(got: &[f32], want: &Matrix) -> Option<String> {
    let want = want.concat();
    let scale = want.iter().fold(0f64, |m, v| m.max(v.abs()));
    first_mismatch(got, &want, |g, w| (g - w).abs() <= 1e-5 + 1e-4 * scale)
}

fn close(got: &[f32], want: &Matrix) -> bool {
    difference(got, want).is_none()
}

/// The learner's shard of the test's MLP for rank `pg`.
fn shard_for(pg: &dyn ProcessGroup) -> candle_core::Result<TensorParallelMlp> {
    let (gate, up, down) = weights();
    let (gate, up, down) = (as_tensor(&gate, &[I, C])?, as_tensor(&up, &[I, C])?, as_tensor(&down, &[C, I])?);
    TensorParallelMlp::shard(&gate, &up, &down, pg.rank(), pg.world_size())
}

/// Rank `pg`'s shard as the test cuts it (rows of gate and up, columns of
/// down for its units), so that the forward's checks do not hang on `shard`.
fn test_shard(pg: &dyn ProcessGroup) -> candle_core::Result<TensorParallelMlp> {
    let units = own_units(pg.rank(), pg.world_size());
    let (gate, up, down) = weights();
    let down: Matrix = down.iter().map(|row| row[units.clone()].to_vec()).collect();
    let rows = units.len();
    Ok(TensorParallelMlp {
        gate_proj: as_tensor(&gate[units.clone()].to_vec(), &[rows, C])?,
        up_proj: as_tensor(&up[units].to_vec(), &[rows, C])?,
        down_proj: as_tensor(&down, &[C, rows])?,
    })
}

/// What one rank's shard holds.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct Held {
    shapes: [Vec<usize>; 3],
    /// gate, up and down's values, row by row.
    values: [Vec<f32>; 3],
}

/// What rank `pg`'s shard holds, or the error `shard` returned.
fn held(pg: Box<dyn ProcessGroup>) -> Result<Held, String> {
    let shard = shard_for(pg.as_ref()).map_err(|e| explain_error(&e))?;
    let shards = [&shard.gate_proj, &shard.up_proj, &shard.down_proj];
    let [gate, up, down] = shards.map(|t| flat(t).map_err(|e| explain_error(&e)));
    Ok(Held { shapes: shards.map(|t| t.dims().to_vec()), values: [gate?, up?, down?] })
}

/// The collectives of one stretch of a run: (all-reduce calls, their bytes, calls of any other collective).
type Calls = (u64, u64, u64);

fn calls(used: &CommStats) -> Calls {
    let others = Collective::ALL.iter().filter(|&&c| c != Collective::AllReduce).map(|&c| used.calls(c)).sum();
    (used.calls(Collective::AllReduce), used.bytes(Collective::AllReduce), others)
}

/// One rank's forward and backward through its shard.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct Step {
    output: Vec<f32>,
    /// ∂L/∂x, then the gradients of gate's, up's and down's shards: each
    /// `None` when the backward did not reach it.
    grads: [Option<Vec<f32>>; 4],
    forward: Calls,
    backward: Calls,
}

/// `shard`'s forward on x, then candle's backward from ∂L/∂y.
fn step(
    pg: Box<dyn ProcessGroup>,
    shard: fn(&dyn ProcessGroup) -> candle_core::Result<TensorParallelMlp>,
) -> candle_core::Result<Step> {
    let tp = SharedGroup::new(pg);
    let shard = shard(&tp)?;
    let vars = [&shard.gate_proj, &shard.up_proj, &shard.down_proj].map(Var::from_tensor);
    let [gate, up, down] = vars;
    let (gate, up, down) = (gate?, up?, down?);
    let mlp = TensorParallelMlp {
        gate_proj: gate.as_tensor().clone(),
        up_proj: up.as_tensor().clone(),
        down_proj: down.as_tensor().clone(),
    };
    let x = Var::from_tensor(&as_tensor(&x(), &[2, 3, C])?)?;
    let before = tp.stats();
    let y = mlp.forward(&tp, x.as_tensor())?;
    let forward = tp.stats();
    if y.dims() != [2, 3, C] {
        candle_core::bail!("the output has shape {:?}, expected [2, 3, {C}], x's", y.dims());
    }
    let store = vjp(&y, &as_tensor(&grad_output(), &[2, 3, C])?)?;
    let backward = tp.stats().since(&forward);
    let grads =
        [x.as_tensor(), gate.as_tensor(), up.as_tensor(), down.as_tensor()].map(|t| store.get(t).map(flat).transpose());
    let [dx, dgate, dup, ddown] = grads;
    Ok(Step {
        output: flat(&y)?,
        grads: [dx?, dgate?, dup?, ddown?],
        forward: calls(&forward.since(&before)),
        backward: calls(&backward),
    })
}

fn run(world: usize) -> Vec<Step> {
    spawn_with_timeout(world, TIMEOUT, |pg| step(Box::new(pg), test_shard))
        .unwrap_or_else(|e| panic!("the tensor-parallel MLP on {world} ranks failed: {}", explain_error(&e)))
}

#[rstest]
fn each_rank_holds_the_part_of_each_weight_its_units_need(#[values(1, 2, 3, 4)] world: usize) {
    let runs = spawn_with_timeout(world, TIMEOUT, |pg| Ok(held(Box::new(pg))))
        .unwrap_or_else(|e| panic!("TensorParallelMlp::shard on {world} ranks failed: {}", explain_error(&e)));
    let part = I / world;
    for (rank, got) in runs.iter().enumerate() {
        let got = got.as_ref().unwrap_or_else(|e| panic!("rank {rank} of {world}: TensorParallelMlp::shard: {e}"));
        let [gate, up, down] = &got.shapes;
        // All I units and fewer than C inputs: gate cut by its columns; all I columns and fewer than C rows: down by its rows.
        let why = if gate.len() == 2 && gate[0] == I && gate[1] < C {
            Some(mistake(20, "gate_up_split_by_input"))
        } else {
            (down.len() == 2 && down[0] < C && down[1] == I).then(|| mistake(20, "down_split_by_output"))
        };
        assert!(
            got.shapes == [vec![part, C], vec![part, C], vec![C, part]],
            "rank {rank} of {world} holds gate {gate:?}, up {up:?}, down {down:?}; its {part} hidden units are \
             gate and up ({part}, {C}) and down ({C}, {part}){}",
            cause(why)
        );
        // Its units are rows of gate and up, columns of down.
        let units = own_units(rank, world);
        let (gate, up, down) = weights();
        let down_cols: Matrix = down.iter().map(|row| row[units.clone()].to_vec()).collect();
        let want = [gate[units.clone()].to_vec(), up[units.clone()].to_vec(), down_cols];
        for ((name, held), want) in ["gate", "up", "down"].iter().zip(&got.values).zip(&want) {
            if let Some(difference) = difference(held, want) {
                panic!(
                    "rank {rank} of {world} holds {name} of the right shape, but not its own hidden units \
                     {units:?} (rows of gate and up, columns of down): {difference}"
                );
            }
        }
    }
}

#[test]
fn a_width_the_ranks_do_not_divide_is_an_error() {
    let results = spawn_with_timeout(5, TIMEOUT, |pg| Ok(shard_for(&pg).err().map(|e| e.to_string()))).unwrap();
    assert!(results.iter().all(Option::is_some), "splitting {I} hidden units across 5 ranks must be an error");
}

/// f and g on their own, 2 ranks, three numbers each.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct Operators {
    /// f's output, and ∂L/∂x from its backward (`None`: the backward did not reach x).
    f: (Vec<f32>, Option<Vec<f32>>),
    g: (Vec<f32>, Option<Vec<f32>>),
}

/// f's input, whole: the same on both ranks.
const F_INPUT: [f32; 3] = [1., 2., 3.];
/// ∂L/∂(f's output) on rank 0 and rank 1: each rank's part.
const F_GRADS: [[f32; 3]; 2] = [[1., 0., 2.], [0.5, 3., -1.]];
/// g's input on rank 0 and rank 1: each rank's partial output.
const G_INPUTS: [[f32; 3]; 2] = [[1., -2., 0.5], [3., 1., 1.5]];
/// ∂L/∂(g's output) on rank 0 and rank 1.
const G_GRADS: [[f32; 3]; 2] = [[2., -1., 0.5], [-1., 4., 0.]];

fn through(
    tp: &SharedGroup,
    op: fn(&SharedGroup, &Tensor) -> candle_core::Result<Tensor>,
    input: [f32; 3],
    grad: [f32; 3],
) -> candle_core::Result<(Vec<f32>, Option<Vec<f32>>)> {
    let x = Var::new(&input, &Device::Cpu)?;
    let y = op(tp, x.as_tensor())?;
    let store = vjp(&y, &Tensor::new(&grad, &Device::Cpu)?)?;
    Ok((flat(&y)?, store.get(x.as_tensor()).map(flat).transpose()?))
}

fn operators() -> Vec<Operators> {
    let result = spawn_with_timeout(2, TIMEOUT, |pg| {
        let tp = SharedGroup::new(Box::new(pg));
        let r = tp.rank();
        let f = through(&tp, copy_to_tensor_parallel, F_INPUT, F_GRADS[r])?;
        let g = through(&tp, reduce_from_tensor_parallel, G_INPUTS[r], G_GRADS[r])?;
        Ok(Operators { f, g })
    });
    result.unwrap_or_else(|e| panic!("f and g on 2 ranks failed: {}", explain_error(&e)))
}

fn add(a: [f32; 3], b: [f32; 3]) -> Vec<f32> {
    a.iter().zip(b).map(|(a, b)| a + b).collect()
}

fn same(got: &[f32], want: &[f32]) -> bool {
    got.len() == want.len() && got.iter().zip(want).all(|(g, w)| (g - w).abs() < 1e-6)
}

/// Whether f behaves as g should and g as f should, on every rank.
fn swapped(got: &[Operators]) -> bool {
    got.iter().enumerate().all(|(r, o)| {
        let f_sums = same(&o.f.0, &add(F_INPUT, F_INPUT)) && o.f.1.as_deref().is_some_and(|d| same(d, &F_GRADS[r]));
        let g_copies =
            same(&o.g.0, &G_INPUTS[r]) && o.g.1.as_deref().is_some_and(|d| same(d, &add(G_GRADS[0], G_GRADS[1])));
        f_sums && g_copies
    })
}

fn show(v: Option<&[f32]>) -> String {
    v.map_or("no gradient at all".into(), |v| format!("{v:?}"))
}

#[test]
fn f_is_the_identity_forward_and_sums_the_gradient_backward() {
    let got = operators();
    let grad_sum = add(F_GRADS[0], F_GRADS[1]);
    for (rank, o) in got.iter().enumerate() {
        let (output, grad) = (&o.f.0, o.f.1.as_deref());
        if same(output, &F_INPUT) && grad.is_some_and(|d| same(d, &grad_sum)) {
            continue;
        }
        let mean: Vec<f32> = grad_sum.iter().map(|v| v / 2.0).collect();
        let why = if swapped(&got) {
            Some(mistake(20, "f_and_g_swapped"))
        } else if same(output, &F_INPUT) && grad.is_some_and(|d| same(d, &mean)) {
            Some(mistake(20, "f_backward_averages"))
        } else if same(output, &add(F_INPUT, F_INPUT)) && grad.is_some_and(|d| same(d, &grad_sum)) {
            Some(mistake(20, "f_sums_forward"))
        } else {
            (same(output, &F_INPUT) && grad.is_some_and(|d| same(d, &F_GRADS[rank]))).then(|| mistake(20, "f_missing"))
        };
        let forward = match same(output, &F_INPUT) {
            true => "its output is x, as it should be".to_string(),
            false => format!("its output is {output:?}, expected x itself"),
        };
        let backward = match grad.is_some_and(|d| same(d, &grad_sum)) {
            true => "its backward gives the sum over the ranks, as it should".to_string(),
            false => format!(
                "a backward from this rank's ∂L/∂output {:?} gives x {}, expected the sum over the ranks' \
                 ∂L/∂output, {grad_sum:?} ({:?} + {:?})",
                F_GRADS[rank],
                show(grad),
                F_GRADS[0],
                F_GRADS[1]
            ),
        };
        panic!("f on rank {rank} of 2, x = {F_INPUT:?} on both ranks: {forward}; {backward}{}", cause(why));
    }
}

#[test]
fn g_sums_forward_and_is_the_identity_backward() {
    let got = operators();
    let sum = add(G_INPUTS[0], G_INPUTS[1]);
    for (rank, o) in got.iter().enumerate() {
        let (output, grad) = (&o.g.0, o.g.1.as_deref());
        if same(output, &sum) && grad.is_some_and(|d| same(d, &G_GRADS[rank])) {
            continue;
        }
        let mean: Vec<f32> = sum.iter().map(|v| v / 2.0).collect();
        let why = if swapped(&got) {
            Some(mistake(20, "f_and_g_swapped"))
        } else if same(output, &mean) {
            Some(mistake(20, "g_averages"))
        } else if same(output, &G_INPUTS[rank]) {
            Some(mistake(20, "g_missing"))
        } else if same(output, &sum) && grad.is_none() {
            Some(mistake(20, "g_not_recorded"))
        } else {
            (same(output, &sum) && grad.is_some_and(|d| same(d, &add(G_GRADS[0], G_GRADS[1]))))
                .then(|| mistake(20, "g_backward_all_reduced"))
        };
        let forward = match same(output, &sum) {
            true => "its output is the sum over the ranks, as it should be".to_string(),
            false => format!(
                "its output is {output:?}, expected the sum over the ranks' x, {sum:?} ({:?} + {:?})",
                G_INPUTS[0], G_INPUTS[1]
            ),
        };
        let backward = match grad.is_some_and(|d| same(d, &G_GRADS[rank])) {
            true => "its backward passes ∂L/∂output through, as it should".to_string(),
            false => format!(
                "a backward from ∂L/∂output {:?} gives x {}, expected that same {:?}",
                G_GRADS[rank],
                show(grad),
                G_GRADS[rank]
            ),
        };
        panic!("g on rank {rank} of 2, this rank's x = {:?}: {forward}; {backward}{}", G_INPUTS[rank], cause(why));
    }
}

#[rstest]
fn every_rank_gets_the_whole_mlps_output(#[values(1, 2, 3, 4)] world: usize) {
    let want = whole().share;
    for (rank, got) in run(world).iter().enumerate() {
        let Some(difference) = difference(&got.output, &want) else { continue };
        let own = own_units(rank, world);
        let matches = |m: &Matrix| world > 1 && close(&got.output, m);
        let why = if matches(&units(&x(), own.clone()).share) {
            Some(mistake(20, "g_missing"))
        } else if matches(&units(&scaled(&x(), world as f64), own).share) {
            Some(mistake(20, "f_and_g_swapped"))
        } else {
            matches(&scaled(&want, 1.0 / world as f64)).then(|| mistake(20, "g_averages"))
        };
        panic!("on {world} ranks, rank {rank}'s output: {difference} (the whole MLP's){}", cause(why));
    }
}

#[rstest]
fn backward_gives_every_rank_the_whole_input_gradient_and_its_shards_gradients(#[values(1, 2, 3)] world: usize) {
    let whole = whole();
    for (rank, got) in run(world).iter().enumerate() {
        let own = units(&x(), own_units(rank, world));
        let names = ["∂L/∂x", "the gradient of its gate_proj shard", "of its up_proj shard", "of its down_proj shard"];
        let want = [&whole.grad_x, &own.grad_gate, &own.grad_up, &own.grad_down];
        let differences: Vec<Option<String>> = got
            .grads
            .iter()
            .zip(want)
            .map(|(got, want)| match got {
                Some(got) => difference(got, want),
                None => Some("the backward did not reach it".into()),
            })
            .collect();
        let Some(first) = differences.iter().position(Option::is_some) else { continue };
        let is = |i: usize, m: &Matrix| got.grads[i].as_deref().is_some_and(|g| close(g, m));
        let shards_right = differences[1..].iter().all(Option::is_none);
        let n = world as f64;
        let why = if got.grads.iter().all(Option::is_none) && close(&got.output, &whole.share) {
            Some(mistake(20, "g_not_recorded"))
        } else if world == 1 {
            None
        } else if shards_right && is(0, &own.grad_x) {
            Some(mistake(20, "f_missing"))
        } else if shards_right && is(0, &scaled(&whole.grad_x, 1.0 / n)) {
            Some(mistake(20, "f_backward_averages"))
        } else {
            let times_n = [&whole.grad_x, &own.grad_gate, &own.grad_up, &own.grad_down].map(|m| scaled(m, n));
            times_n.iter().enumerate().all(|(i, m)| is(i, m)).then(|| mistake(20, "g_backward_all_reduced"))
        };
        panic!(
            "on {world} ranks, after a backward from ∂L/∂y (the same on every rank), rank {rank}'s {}: {} (from the \
             whole MLP's gradients){}",
            names[first],
            differences[first].as_deref().unwrap_or_default(),
            cause(why)
        );
    }
}

#[rstest]
fn a_step_is_one_all_reduce_of_the_output_forward_and_one_of_the_input_gradient_backward(#[values(2, 4)] world: usize) {
    let bytes = (ROWS * C * 4) as u64;
    for (rank, got) in run(world).iter().enumerate() {
        let right_output = close(&got.output, &whole().share);
        let why = (got.forward.0 == 0 && got.forward.2 > 0 && right_output).then(|| mistake(20, "gathered_and_summed"));
        let ((forward, forward_bytes, forward_others), (backward, backward_bytes, backward_others)) =
            (got.forward, got.backward);
        assert!(
            (got.forward, got.backward) == ((1, bytes, 0), (1, bytes, 0)),
            "rank {rank} of {world}: forward made {forward} all-reduce(s) of {forward_bytes} bytes in all and \
             {forward_others} other collective(s), backward {backward} all-reduce(s) of {backward_bytes} bytes and \
             {backward_others} other(s); the split needs one all-reduce of the ({ROWS}, {C}) output forward (g) and \
             one of ∂L/∂x backward (f), {bytes} bytes each, and nothing else{}",
            cause(why)
        );
    }
}

/// Each rank a process, its own shard, the output and ∂L/∂x summed over TCP.
#[test]
fn it_runs_across_processes_over_tcp() {
    let runs: Vec<Step> = on_processes(2, |pg| step(Box::new(pg), shard_for));
    let whole = whole();
    for (rank, got) in runs.iter().enumerate() {
        let difference = difference(&got.output, &whole.share).map(|d| format!("its output: {d}")).or_else(|| {
            match &got.grads[0] {
                Some(grad) => difference(grad, &whole.grad_x),
                None => Some("the backward did not reach x".into()),
            }
            .map(|d| format!("∂L/∂x: {d}"))
        });
        if let Some(difference) = difference {
            panic!("rank {rank}'s process, with its own shard: {difference} (the whole MLP's)");
        }
    }
}
