//! Ungraded checks of subgroups and of the mesh's shape: which ranks a split
//! groups together, that collectives on two groups of the same ranks never
//! mix, and that a failure in one group reaches the ranks waiting in another.
//! Where each rank sits on a mesh, and its groups, is exercise 25's to grade.

use std::time::{Duration, Instant};

use candle_core::{DType, Device, Tensor};
use rstest::rstest;
use workbook::distributed::{spawn_with_timeout, Collective, MeshShape, ProcessGroup, ReduceOp, SingleProcess};

use crate::process_ranks::on_processes;
use crate::support::values;

const TIMEOUT: Duration = Duration::from_secs(5);

/// World rank `rank`'s tensor: `[rank + 1]` scaled by `scale`, so sums show who took part.
fn mine(rank: usize, scale: f32) -> candle_core::Result<Tensor> {
    Tensor::new(&[(rank + 1) as f32 * scale], &Device::Cpu)
}

/// Splits 6 ranks by `rank % 2` and by `rank / 3`, then interleaves
/// all-reduces and point-to-point messages on the two groups; returns per
/// rank (place and size in each group, the two sums, what the ring of each
/// group passed on).
fn interleaved(world: &dyn ProcessGroup) -> candle_core::Result<Vec<f32>> {
    let rank = world.rank();
    let parity = world.split(rank % 2)?;
    let half = world.split(rank / 3)?;
    let mut out = vec![parity.rank() as f32, parity.world_size() as f32, half.rank() as f32, half.world_size() as f32];
    // Different payloads on the two groups: crossed wires would show in the sums.
    let a = parity.all_reduce(&mine(rank, 1.0)?, ReduceOp::Sum)?;
    let b = half.all_reduce(&mine(rank, 100.0)?, ReduceOp::Sum)?;
    out.extend(values(&a).into_iter().chain(values(&b)));
    // A ring in each group: send to the next member, receive from the previous one.
    for (group, scale) in [(&parity, 1000.0), (&half, 10_000.0)] {
        let (n, r) = (group.world_size(), group.rank());
        group.send(&mine(rank, scale)?, (r + 1) % n)?;
        let like = Tensor::zeros(1, DType::F32, &Device::Cpu)?;
        out.extend(values(&group.recv(&like, (r + n - 1) % n)?));
    }
    Ok(out)
}

/// What [`interleaved`] returns on rank `rank` of 6, worked out by hand.
fn interleaved_expected(rank: usize) -> Vec<f32> {
    let parity: Vec<usize> = (0..6).filter(|r| r % 2 == rank % 2).collect();
    let half: Vec<usize> = (0..6).filter(|r| r / 3 == rank / 3).collect();
    let place = |group: &[usize]| group.iter().position(|&r| r == rank).unwrap();
    let sum = |group: &[usize], scale: f32| group.iter().map(|&r| (r + 1) as f32 * scale).sum::<f32>();
    let previous = |group: &[usize]| group[(place(group) + group.len() - 1) % group.len()];
    vec![
        place(&parity) as f32,
        3.0,
        place(&half) as f32,
        3.0,
        sum(&parity, 1.0),
        sum(&half, 100.0),
        (previous(&parity) + 1) as f32 * 1000.0,
        (previous(&half) + 1) as f32 * 10_000.0,
    ]
}

#[test]
fn collectives_on_two_subgroups_of_threads_never_mix() {
    let got = spawn_with_timeout(6, TIMEOUT, |pg| interleaved(&pg)).unwrap();
    for (rank, got) in got.iter().enumerate() {
        assert_eq!(got, &interleaved_expected(rank), "rank {rank}");
    }
}

#[test]
fn collectives_on_two_subgroups_of_processes_never_mix() {
    let got = on_processes(6, |pg| interleaved(&pg));
    for (rank, got) in got.iter().enumerate() {
        assert_eq!(got, &interleaved_expected(rank), "rank {rank}");
    }
}

/// Two groups of the same two ranks, whose all-reduces the ranks issue in
/// opposite orders: what each rank's first call ends with.
fn opposite_orders(world: &dyn ProcessGroup) -> String {
    let run = || -> candle_core::Result<Vec<f32>> {
        let (first, second) = (world.split(0)?, world.split(0)?);
        let (a, b) = (mine(world.rank(), 1.0)?, mine(world.rank(), 100.0)?);
        let sum = match world.rank() {
            0 => first.all_reduce(&a, ReduceOp::Sum)?,
            _ => second.all_reduce(&b, ReduceOp::Sum)?,
        };
        Ok(values(&sum))
    };
    match run() {
        Ok(sum) => format!("completed with {sum:?}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn calls_on_two_groups_of_the_same_ranks_in_opposite_orders_fail_instead_of_crossing() {
    let got = on_processes(2, |pg| Ok(opposite_orders(&pg)));
    assert!(got.iter().any(|m| m.contains("of subgroup")), "no rank named the subgroups: {got:?}");
    assert!(got.iter().all(|m| !m.starts_with("completed")), "the wires crossed: {got:?}");
    // Threads meet per group: each waits for the other in its own group until one gives up.
    let got = spawn_with_timeout(2, Duration::from_millis(500), |pg| Ok(opposite_orders(&pg))).unwrap();
    assert!(got.iter().any(|m| m.contains("timed out")), "{got:?}");
    assert!(got.iter().all(|m| !m.starts_with("completed")), "{got:?}");
}

#[test]
fn a_subgroup_counts_its_own_calls() {
    let counts = spawn_with_timeout(4, TIMEOUT, |pg| {
        let group = pg.split(pg.rank() % 2)?;
        group.all_reduce(&Tensor::zeros(8, DType::F32, &Device::Cpu)?, ReduceOp::Sum)?;
        Ok((pg.stats().calls(Collective::AllReduce), group.stats().calls(Collective::AllReduce)))
    })
    .unwrap();
    // The split's own all-gather is the world's; the all-reduce is the subgroup's alone.
    assert!(counts.iter().all(|&c| c == (0, 1)), "{counts:?}");
}

#[test]
fn a_rank_failing_in_one_group_releases_the_ranks_waiting_in_another() {
    let start = Instant::now();
    let error = spawn_with_timeout(4, Duration::from_secs(30), |pg| {
        let group = pg.split(pg.rank() / 2)?;
        if pg.rank() == 0 {
            candle_core::bail!("rank 0 gives up");
        }
        // Ranks 2 and 3 wait in their own group for nobody that failed; rank 1 waits for rank 0.
        group.barrier()?;
        pg.barrier()
    })
    .unwrap_err()
    .to_string();
    assert!(error.contains("rank 0 failed: rank 0 gives up"), "{error}");
    assert!(start.elapsed() < Duration::from_secs(10), "the others waited {:?} for their timeout", start.elapsed());
}

#[test]
fn a_single_process_splits_into_itself() {
    let group = SingleProcess::new().split(7).unwrap();
    assert_eq!((group.rank(), group.world_size()), (0, 1));
}

#[rstest]
#[case::infers_dp(8, None, Some(2), Some(2), (2, 2, 2))]
#[case::defaults_pp_and_tp(4, None, None, None, (4, 1, 1))]
#[case::tp_only(4, None, None, Some(4), (1, 1, 4))]
fn a_mesh_shape_fills_in_what_is_omitted(
    #[case] world: usize,
    #[case] dp: Option<usize>,
    #[case] pp: Option<usize>,
    #[case] tp: Option<usize>,
    #[case] want: (usize, usize, usize),
) {
    let shape = MeshShape::new(world, dp, pp, tp).unwrap();
    assert_eq!((shape.dp, shape.pp, shape.tp), want);
}

#[rstest]
#[case::does_not_divide(6, None, Some(4), None, "multiple of 4")]
#[case::wrong_product(8, Some(2), Some(2), None, "needs 4 ranks")]
#[case::zero(4, None, Some(0), None, "at least 1")]
fn a_mesh_shape_that_does_not_fit_says_why(
    #[case] world: usize,
    #[case] dp: Option<usize>,
    #[case] pp: Option<usize>,
    #[case] tp: Option<usize>,
    #[case] why: &str,
) {
    let error = MeshShape::new(world, dp, pp, tp).unwrap_err().to_string();
    assert!(error.contains(why), "{error}");
}
