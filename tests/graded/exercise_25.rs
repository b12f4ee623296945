//! Exercise 25: the device mesh. The expected coordinates and groups come
//! from the layout's definition alone: every (d, p, t) is enumerated and
//! placed by `MeshShape::rank`, the formula the exercise states, and each
//! rank's place is read off that table. A typical mistake is named only when
//! the output equals what that mistake gives for every rank; otherwise the
//! first wrong rank is reported.

use std::time::Duration;

use candle_core::{Device, Tensor};
use rstest::rstest;
use workbook::distributed::{spawn_with_timeout, Axis, DeviceMesh, MeshCoords, MeshShape, ProcessGroup};
use workbook::phase4_under_the_hood::{axis_group, mesh_coords};

use crate::support::{cause, explain_error, mistake, values};

const AXES: [Axis; 3] = [Axis::Dp, Axis::Pp, Axis::Tp];

/// Shapes in which no two axes have the same size, and some of size 1.
fn shapes() -> Vec<MeshShape> {
    [(2, 3, 2), (3, 2, 4), (1, 4, 3), (2, 1, 3), (5, 2, 1)].map(|(dp, pp, tp)| MeshShape { dp, pp, tp }).to_vec()
}

/// Every grid point of `shape`, in the order `place` numbers them: rank r at index r.
fn table(shape: MeshShape, place: impl Fn(MeshCoords) -> usize) -> Vec<MeshCoords> {
    let mut by_rank = vec![None; shape.world_size()];
    for dp in 0..shape.dp {
        for pp in 0..shape.pp {
            for tp in 0..shape.tp {
                let coords = MeshCoords { dp, pp, tp };
                by_rank[place(coords)] = Some(coords);
            }
        }
    }
    by_rank.into_iter().map(|c| c.expect("the layout places one point per rank")).collect()
}

/// The layout that reads the axes in `order`, slowest first; the workbook's is `[Dp, Pp, Tp]`.
fn axes_read_as(shape: MeshShape, order: [Axis; 3]) -> impl Fn(MeshCoords) -> usize {
    move |c| order.iter().fold(0, |rank, &axis| rank * shape.size(axis) + c.on(axis))
}

/// The replica varying fastest and the tensor-parallel coordinate slowest.
const REPLICA_FASTEST: [Axis; 3] = [Axis::Tp, Axis::Pp, Axis::Dp];

/// The orders of the axes that are neither the layout's nor replica-fastest.
const OTHER_ORDERS: [[Axis; 3]; 4] = [
    [Axis::Dp, Axis::Tp, Axis::Pp],
    [Axis::Pp, Axis::Dp, Axis::Tp],
    [Axis::Pp, Axis::Tp, Axis::Dp],
    [Axis::Tp, Axis::Dp, Axis::Pp],
];

/// Why `got` (every rank's coordinates) differs from `want`, if the evidence singles one mistake out.
fn diagnose(shape: MeshShape, got: &[MeshCoords]) -> Option<&'static str> {
    // With tp = 1 the replica-fastest layout is also dp and pp read in each
    // other's place: only a tensor-parallel axis tells the two apart.
    let replica_fastest = got == table(shape, axes_read_as(shape, REPLICA_FASTEST));
    if shape.dp > 1 && shape.tp > 1 && replica_fastest {
        return Some(mistake(25, "replica_fastest"));
    }
    // Some other order of the axes: a layout, just not this one.
    if !replica_fastest && OTHER_ORDERS.iter().any(|&order| got == table(shape, axes_read_as(shape, order))) {
        return Some(mistake(25, "axes_in_another_order"));
    }
    let unwrapped = |rank: usize, c: &MeshCoords| c.pp == rank / shape.tp && c.pp >= shape.pp;
    let want = table(shape, |c| shape.rank(c));
    let wrong: Vec<usize> = (0..got.len()).filter(|&r| got[r] != want[r]).collect();
    let only_stage_unwrapped =
        wrong.iter().all(|&r| unwrapped(r, &got[r]) && got[r].dp == want[r].dp && got[r].tp == want[r].tp);
    (!wrong.is_empty() && only_stage_unwrapped).then(|| mistake(25, "stage_not_wrapped"))
}

#[rstest]
fn every_rank_sits_where_the_layout_puts_it(#[values(0, 1, 2, 3, 4)] which: usize) {
    let shape = shapes()[which];
    let want = table(shape, |c| shape.rank(c));
    let got: Vec<MeshCoords> = (0..shape.world_size()).map(|rank| mesh_coords(shape, rank)).collect();
    if let Some(rank) = (0..got.len()).find(|&r| got[r] != want[r]) {
        panic!(
            "{shape}: mesh_coords(rank {rank}) = {:?}, expected {:?} (rank = (d · pp + p) · tp + t).{}",
            got[rank],
            want[rank],
            cause(diagnose(shape, &got))
        );
    }
}

/// The ranks sharing `rank`'s coordinate on `axis` (not its other two).
fn sharing_the_coordinate(shape: MeshShape, rank: usize, axis: Axis) -> Vec<usize> {
    let coords = table(shape, |c| shape.rank(c));
    (0..coords.len()).filter(|&r| coords[r].on(axis) == coords[rank].on(axis)).collect()
}

/// When the learner's `mesh_coords` is wrong for `shape` and `got` is what a
/// right `axis_group` gives over those coordinates (read with the layout's
/// formula, or by matching every rank's), a note that says so: the group
/// follows the coordinates, and the coordinates are what to fix.
fn follows_wrong_coordinates(shape: MeshShape, rank: usize, axis: Axis, got: &[usize]) -> Option<String> {
    let right = table(shape, |c| shape.rank(c));
    let theirs: Vec<MeshCoords> = (0..shape.world_size()).map(|r| mesh_coords(shape, r)).collect();
    let first_wrong = (0..theirs.len()).find(|&r| theirs[r] != right[r])?;
    let by_formula: Vec<usize> = (0..shape.size(axis)).map(|i| shape.rank(theirs[rank].with(axis, i))).collect();
    let others_equal = |r: &usize| AXES.iter().all(|&a| a == axis || theirs[*r].on(a) == theirs[rank].on(a));
    let mut by_matching: Vec<usize> = (0..theirs.len()).filter(others_equal).collect();
    by_matching.sort_by_key(|&r| theirs[r].on(axis));
    (got == by_formula || got == by_matching).then(|| {
        format!(
            " It is the group a right axis_group gives over the coordinates your mesh_coords returns, and those are \
             wrong for this shape: mesh_coords(rank {first_wrong}) = {:?}, expected {:?}. Put mesh_coords right \
             first (every_rank_sits_where_the_layout_puts_it)",
            theirs[first_wrong], right[first_wrong]
        )
    })
}

#[rstest]
fn each_axis_group_holds_the_ranks_that_differ_only_on_that_axis(#[values(0, 1, 2, 3, 4)] which: usize) {
    let shape = shapes()[which];
    let coords = table(shape, |c| shape.rank(c));
    for rank in 0..shape.world_size() {
        for axis in AXES {
            let others_equal = |r: &usize| AXES.iter().all(|&a| a == axis || coords[*r].on(a) == coords[rank].on(a));
            let mut want: Vec<usize> = (0..coords.len()).filter(others_equal).collect();
            want.sort_by_key(|&r| coords[r].on(axis));
            let got = axis_group(shape, rank, axis);
            if got == want {
                continue;
            }
            let follows = follows_wrong_coordinates(shape, rank, axis, &got);
            let reversed: Vec<usize> = want.iter().rev().copied().collect();
            let without_self: Vec<usize> = want.iter().copied().filter(|&r| r != rank).collect();
            let named = match follows {
                Some(_) => None,
                None if want.len() > 1 && got == sharing_the_coordinate(shape, rank, axis) => {
                    Some(mistake(25, "same_coordinate_group"))
                }
                None if want.len() > 1 && got == reversed => Some(mistake(25, "group_reversed")),
                None if got == without_self => Some(mistake(25, "group_without_self")),
                None => None,
            };
            panic!(
                "{shape}: axis_group(rank {rank}, {axis:?}) = {got:?}, expected {want:?}: the ranks whose other \
                 coordinates equal rank {rank}'s {:?}, by their {axis:?} coordinate.{}{}",
                coords[rank],
                follows.unwrap_or_default(),
                cause(named)
            );
        }
    }
}

#[test]
fn a_mesh_of_twelve_threads_gives_each_axis_its_group() {
    let shape = MeshShape { dp: 3, pp: 2, tp: 2 };
    let seen = spawn_with_timeout(12, Duration::from_secs(20), |pg| {
        let rank = pg.rank() as f32;
        let mesh = DeviceMesh::new(Box::new(pg), shape)?;
        // Each group's all-gather of the world ranks lists its members, in group order.
        AXES.iter()
            .map(|&axis| Ok(values(&mesh.group(axis).all_gather(&Tensor::new(&[rank], &Device::Cpu)?)?)))
            .collect::<candle_core::Result<Vec<_>>>()
    })
    .unwrap_or_else(|e| panic!("building a {shape} mesh on 12 thread ranks failed: {}", explain_error(&e)));
    let coords = table(shape, |c| shape.rank(c));
    for (rank, groups) in seen.iter().enumerate() {
        for (axis, got) in AXES.iter().zip(groups) {
            let got: Vec<usize> = got.iter().map(|&r| r as usize).collect();
            let others_equal = |r: &usize| AXES.iter().all(|a| a == axis || coords[*r].on(*a) == coords[rank].on(*a));
            let want: Vec<usize> = (0..coords.len()).filter(others_equal).collect();
            if got != want {
                panic!(
                    "the mesh's {axis:?} group of rank {rank}, built from your axis_group, holds ranks {got:?}, \
                     expected {want:?}.{}",
                    follows_wrong_coordinates(shape, rank, *axis, &got).unwrap_or_default()
                );
            }
        }
    }
}
