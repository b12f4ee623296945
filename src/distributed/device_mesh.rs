//! The world laid out as a grid of ranks, one axis per kind of parallelism,
//! and the process group along each axis (PyTorch: `DeviceMesh`; picotron:
//! its process-group manager).
//!
//! A job of `dp · pp · tp` ranks is a grid of shape (dp, pp, tp). Rank `r`
//! sits at coordinates (d, p, t) with `r = (d · pp + p) · tp + t` (where each
//! rank sits, and its group along each axis, is exercise 25): the tensor-
//! parallel axis varies fastest, so the ranks of one tensor-parallel group
//! are neighbours (on one machine, where their per-layer all-reduces find
//! the fastest links), and data parallelism, which talks least often, spans
//! machines.
//!
//! ```text
//!   dp 2 × pp 2 × tp 2 = 8 ranks          groups of rank 5 = (1, 0, 1)
//!            tp 0   tp 1
//!   dp 0 pp 0   0      1                 tp: {4, 5}   same (d, p)
//!        pp 1   2      3                 pp: {5, 7}   same (d, t)
//!   dp 1 pp 0   4      5                 dp: {1, 5}   same (p, t)
//!        pp 1   6      7
//! ```
//!
//! Each group is split off the world ([`ProcessGroup::split`]), coloured by
//! the rank of its first member. Every collective names the group it runs
//! on: a tensor-parallel all-reduce goes over [`DeviceMesh::tp`], a stage's
//! activation over [`DeviceMesh::pp`], a gradient all-reduce over
//! [`DeviceMesh::dp`].

use std::fmt;

use candle_core::{bail, Result};

use super::{CommStats, ProcessGroup, SharedGroup, SingleProcess};
use crate::phase4_under_the_hood::{axis_group, mesh_coords};

/// How many ranks lie along each axis.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MeshShape {
    /// Data-parallel replicas: each reads its own share of the batch.
    pub dp: usize,
    /// Pipeline stages: each holds a run of consecutive blocks.
    pub pp: usize,
    /// Tensor-parallel ranks: each holds a slice of every block's weights.
    pub tp: usize,
}

/// Where one rank sits on each axis.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MeshCoords {
    pub dp: usize,
    pub pp: usize,
    pub tp: usize,
}

/// One of the mesh's axes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Axis {
    Dp,
    Pp,
    Tp,
}

impl MeshShape {
    /// The shape of a job of `world_size` ranks from the sizes given: an
    /// omitted `pp` or `tp` is 1, an omitted `dp` is whatever the world
    /// leaves for it.
    pub fn new(world_size: usize, dp: Option<usize>, pp: Option<usize>, tp: Option<usize>) -> Result<Self> {
        let (pp, tp) = (pp.unwrap_or(1), tp.unwrap_or(1));
        if pp == 0 || tp == 0 || dp == Some(0) {
            bail!("--dp, --pp and --tp must be at least 1");
        }
        let dp = match dp {
            Some(dp) => dp,
            None if world_size.is_multiple_of(pp * tp) => world_size / (pp * tp),
            None => bail!(
                "{} {} not make whole replicas of {} × {} ({} ranks each): give --nproc (times --nnodes) \
                 a multiple of {}",
                crate::words::count(world_size, "rank"),
                if world_size == 1 { "does" } else { "do" },
                crate::words::count(pp, "pipeline stage"),
                crate::words::count(tp, "tensor-parallel rank"),
                pp * tp,
                pp * tp
            ),
        };
        let shape = Self { dp, pp, tp };
        if shape.world_size() != world_size {
            bail!("the mesh {shape} needs {} ranks, but the job has {world_size}", shape.world_size());
        }
        Ok(shape)
    }

    /// One data-parallel axis over every rank: plain DDP or FSDP.
    pub fn data_parallel(world_size: usize) -> Self {
        Self { dp: world_size, pp: 1, tp: 1 }
    }

    pub fn world_size(&self) -> usize {
        self.dp * self.pp * self.tp
    }

    /// Where rank `rank` sits: the learner's exercise 25.
    pub fn coords(&self, rank: usize) -> MeshCoords {
        mesh_coords(*self, rank)
    }

    /// The rank at `coords`: the layout's formula.
    pub fn rank(&self, coords: MeshCoords) -> usize {
        (coords.dp * self.pp + coords.pp) * self.tp + coords.tp
    }

    /// The ranks of the group along `axis` that rank `rank` belongs to, in
    /// order: the learner's exercise 25.
    pub fn group_of(&self, rank: usize, axis: Axis) -> Vec<usize> {
        axis_group(*self, rank, axis)
    }

    /// How many ranks lie along `axis`.
    pub fn size(&self, axis: Axis) -> usize {
        match axis {
            Axis::Dp => self.dp,
            Axis::Pp => self.pp,
            Axis::Tp => self.tp,
        }
    }
}

impl MeshCoords {
    /// The coordinate on `axis`.
    pub fn on(&self, axis: Axis) -> usize {
        match axis {
            Axis::Dp => self.dp,
            Axis::Pp => self.pp,
            Axis::Tp => self.tp,
        }
    }

    /// These coordinates moved to `index` along `axis`.
    pub fn with(mut self, axis: Axis, index: usize) -> Self {
        match axis {
            Axis::Dp => self.dp = index,
            Axis::Pp => self.pp = index,
            Axis::Tp => self.tp = index,
        }
        self
    }
}

/// `dp 2 × pp 2 × tp 2`.
impl fmt::Display for MeshShape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "dp {} × pp {} × tp {}", self.dp, self.pp, self.tp)
    }
}

/// One rank's view of the mesh: the world, where this rank sits, and its
/// group along each axis.
pub struct DeviceMesh {
    shape: MeshShape,
    coords: MeshCoords,
    world: SharedGroup,
    /// Shared: ZeRO's sharded step runs on it with its clipping around it.
    /// The world itself when the mesh has no other axis.
    dp: SharedGroup,
    /// Shared, as tp: ZeRO's clipping adds the norm's squares over it.
    pp: SharedGroup,
    /// Shared: a pipeline stage split across the tp group keeps a handle to it.
    tp: SharedGroup,
}

impl DeviceMesh {
    /// Lays `world` out as `shape`: every rank calls it, and it splits off
    /// the three axis groups, in the same order on every rank.
    pub fn new(world: Box<dyn ProcessGroup>, shape: MeshShape) -> Result<Self> {
        if shape.world_size() != world.world_size() {
            bail!("the mesh {shape} needs {} ranks, but the group has {}", shape.world_size(), world.world_size());
        }
        let rank = world.rank();
        let group = |axis: Axis| world.split(shape.group_of(rank, axis)[0]);
        let (tp, pp, dp) = (group(Axis::Tp)?, group(Axis::Pp)?, group(Axis::Dp)?);
        let (dp, pp, tp) = (SharedGroup::new(dp), SharedGroup::new(pp), SharedGroup::new(tp));
        Ok(Self { shape, coords: shape.coords(rank), world: SharedGroup::new(world), dp, pp, tp })
    }

    /// `world` as a mesh of one axis, every rank a replica: the dp group is
    /// the world, the pp and tp groups this rank alone. Nothing is split, so
    /// no subgroup is made (which a backend may not support) and no layout
    /// is computed.
    pub fn data_parallel(world: Box<dyn ProcessGroup>) -> Self {
        let shape = MeshShape::data_parallel(world.world_size());
        let coords = MeshCoords { dp: world.rank(), pp: 0, tp: 0 };
        let world = SharedGroup::new(world);
        let alone = || SharedGroup::new(Box::new(SingleProcess::new()));
        Self { shape, coords, dp: world.clone(), world, pp: alone(), tp: alone() }
    }

    pub fn shape(&self) -> MeshShape {
        self.shape
    }

    /// Where this rank sits.
    pub fn coords(&self) -> MeshCoords {
        self.coords
    }

    /// Every rank of the job.
    pub fn world(&self) -> &dyn ProcessGroup {
        &self.world
    }

    /// The ranks that differ from this one only in their data-parallel coordinate.
    pub fn dp(&self) -> &dyn ProcessGroup {
        &self.dp
    }

    /// The dp group, for what wraps it (ZeRO's clipping reduce-scatter).
    pub fn dp_shared(&self) -> SharedGroup {
        self.dp.clone()
    }

    /// The stages of this rank's pipeline.
    pub fn pp(&self) -> &dyn ProcessGroup {
        &self.pp
    }

    /// The ranks that share this rank's blocks' weights between them.
    pub fn tp(&self) -> &dyn ProcessGroup {
        &self.tp
    }

    /// The tp group, for what runs on it beside the mesh (a pipeline stage's
    /// split blocks, ZeRO's clipping).
    pub fn tp_shared(&self) -> SharedGroup {
        self.tp.clone()
    }

    /// The pp group, for what runs on it beside the mesh (ZeRO's clipping).
    pub fn pp_shared(&self) -> SharedGroup {
        self.pp.clone()
    }

    /// The group along `axis`.
    pub fn group(&self, axis: Axis) -> &dyn ProcessGroup {
        match axis {
            Axis::Dp => self.dp(),
            Axis::Pp => self.pp(),
            Axis::Tp => self.tp(),
        }
    }

    /// What this rank has sent through all its groups so far.
    pub fn stats(&self) -> CommStats {
        let dp = (!self.dp.is(&self.world)).then_some(&self.dp);
        [Some(&self.world), dp, Some(&self.pp), Some(&self.tp)].into_iter().flatten().map(|g| g.stats()).sum()
    }
}

impl fmt::Debug for DeviceMesh {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DeviceMesh({}, rank {} at {:?})", self.shape, self.world.rank(), self.coords)
    }
}
