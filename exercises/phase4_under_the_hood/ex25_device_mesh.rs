//! # Exercise 25: the device mesh
//!
//! A large job runs data, pipeline and tensor parallelism at once (Megatron,
//! torchtitan, picotron all do). Its ranks form a grid with one axis per kind
//! of parallelism, and every collective runs among the ranks along one axis
//! only: a tensor-parallel all-reduce among the ranks that split this rank's
//! blocks, an activation to the next stage of this rank's pipeline, a
//! gradient all-reduce among the ranks that hold the same weights in the
//! other replicas. Which ranks those are is what you compute here; the
//! runtime's `DeviceMesh` (`src/distributed/device_mesh.rs`) then splits one
//! process group per axis off the world with your answer, and `cargo train
//! --pp` and `--tp` run on it.
//!
//! The world of `dp · pp · tp` ranks is laid out with the tensor-parallel
//! coordinate varying fastest, then the pipeline stage, then the replica:
//!
//! ```text
//!   rank = (d · pp + p) · tp + t          0 ≤ d < dp, 0 ≤ p < pp, 0 ≤ t < tp
//! ```
//!
//! The order is a choice about links. Tensor parallelism all-reduces an
//! activation four times per block per micro-batch, so its ranks must share
//! a machine's fastest links, and consecutive ranks do. A pipeline sends one
//! activation per stage and micro-batch; data parallelism one all-reduce of
//! the gradients per step, which hides behind backward: it can cross the
//! slowest links, between machines.
//!
//! The group along an axis holds the ranks whose other two coordinates equal
//! this rank's, ordered by their coordinate on that axis, which is their rank
//! in the group. Worked example, dp 2 × pp 2 × tp 2:
//!
//! ```text
//!              tp 0  tp 1
//!   dp 0 pp 0    0     1        rank 5 sits at (d, p, t) = (1, 0, 1)
//!        pp 1    2     3        its tensor-parallel group:  [4, 5]
//!   dp 1 pp 0    4     5        its pipeline:               [5, 7]
//!        pp 1    6     7        its data-parallel group:    [1, 5]
//! ```
//!
//! At GPT-2 124M's shape on 64 GPUs as tp 4 × pp 2 × dp 8, rank 37 sits at
//! (4, 1, 1), and its data-parallel group is every eighth rank from 5:
//! [5, 13, 21, ..., 61].
//!
//! Read first: Narayanan et al. 2021, "Efficient Large-Scale Language Model
//! Training on GPU Clusters Using Megatron-LM", section 3 (how the three
//! combine) and figure 1; PyTorch's `DeviceMesh` recipe. Guide:
//! `guide/src/phase4/25-device-mesh.md`. Test: `cargo test exercise_25`.

use crate::distributed::{Axis, MeshCoords, MeshShape};

/// Where rank `rank`, in `0..shape.world_size()`, sits on the grid `shape`.
///
/// Pieces: `shape.dp`, `shape.pp`, `shape.tp`, `MeshCoords { dp, pp, tp }`,
/// and integer division and remainder.
pub fn mesh_coords(shape: MeshShape, rank: usize) -> MeshCoords {
    let _ = (&shape, &rank);
    todo!("Exercise 25: The device mesh; run `cargo xtask hint 25`")
}

/// The ranks of the group along `axis` that rank `rank` belongs to: those
/// whose coordinates differ from `rank`'s on `axis` only, ordered by their
/// coordinate on `axis`. There are `shape.size(axis)` of them, `rank` among
/// them.
///
/// Pieces: your `mesh_coords`, `coords.on(axis)`, `coords.with(axis, i)`
/// (the same coordinates, moved to `i` along `axis`), `shape.size(axis)`,
/// and `shape.rank(coords)`, the layout's formula above.
pub fn axis_group(shape: MeshShape, rank: usize, axis: Axis) -> Vec<usize> {
    let _ = (&shape, &rank, &axis);
    todo!("Exercise 25: The device mesh; run `cargo xtask hint 25`")
}
