//! Reference solution of exercise 25: the device mesh.

use crate::distributed::{Axis, MeshCoords, MeshShape};

pub fn mesh_coords(shape: MeshShape, rank: usize) -> MeshCoords {
    MeshCoords { dp: rank / (shape.pp * shape.tp), pp: rank / shape.tp % shape.pp, tp: rank % shape.tp }
}

pub fn axis_group(shape: MeshShape, rank: usize, axis: Axis) -> Vec<usize> {
    let here = mesh_coords(shape, rank);
    (0..shape.size(axis)).map(|i| shape.rank(here.with(axis, i))).collect()
}
