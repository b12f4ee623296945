//! The ways a run trains across ranks; the loop sees each through
//! [`workbook::train::Train`].

use workbook::distributed::MeshShape;
use workbook::parallel::pipeline::PipelineSchedule;
use workbook::parallel::DataAxis;

/// How a run's ranks share the work: its strategy and the flags that
/// shape it ([`crate::layout_flags::LayoutFlags`] chooses it).
#[derive(Debug, Clone, PartialEq)]
pub struct Layout {
    /// Recompute each block in backward instead of keeping its activations.
    pub activation_checkpointing: bool,
    /// DDP, or the model over a mesh, and what its replicas share.
    pub strategy: Strategy,
    /// All-reduce with exercise 16's ring (the learner's code) instead of the backend's.
    pub own_ring: bool,
    /// Under DDP, average matrix gradients as rank-R PowerSGD estimates (exercise 18).
    pub powersgd_rank: Option<usize>,
    /// Under DDP, all-reduce buckets during backward (exercise 19).
    pub ddp_overlap: bool,
    /// Under FSDP, gather the next unit while one computes.
    pub prefetch: bool,
    /// Under FSDP, keep what only the optimizer step reads in a file in `out_dir`.
    pub offload: bool,
    /// Under DDP, the most bytes of gradients one all-reduce carries.
    pub bucket_bytes: usize,
}

/// How a run spreads over its ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Strategy {
    /// Phase 2: whole replicas, gradients all-reduced.
    Ddp,
    /// Phases 3 and 4: the model over a mesh. Its blocks cut into `stages`
    /// pipeline stages (1: none), stepped on GPipe's schedule (exercise 21)
    /// or 1F1B's (exercise 24); each stage's blocks split across `tp`
    /// tensor-parallel ranks (1: whole), run by exercise 23, or by
    /// exercise 27 with the norms and residuals cut along the sequence (the
    /// MLP cut by exercise 20); the ranks beyond one pipeline of split
    /// stages are data-parallel replicas of it, whose `data` axis shares each
    /// step: DDP's averaged gradients, ZeRO-1's sharded AdamW (exercise 17;
    /// `--strategy zero1`, with one stage of whole blocks or any mesh),
    /// ZeRO-2's sharded gradients too (`--strategy zero2`, one stage), FSDP's
    /// units (exercises 12-15 and 22, `--strategy fsdp`, any mesh), or
    /// the learner's own DDP (exercise 26, `--own-ddp`, one stage only).
    Mesh { stages: usize, tp: usize, schedule: PipelineSchedule, sequence_parallel: bool, data: DataAxis },
}

impl Strategy {
    /// How a job of `nproc` ranks is laid out: one data-parallel axis, or
    /// pipelines or tensor-parallel groups replicated across the rest.
    pub fn mesh(self, nproc: usize) -> candle_core::Result<MeshShape> {
        match self {
            Strategy::Mesh { stages, tp, .. } => MeshShape::new(nproc, None, Some(stages), Some(tp)),
            Strategy::Ddp => Ok(MeshShape::data_parallel(nproc)),
        }
    }
}

impl Strategy {
    /// Whole replicas of the model, sharing each step as `data` says:
    /// `--strategy zero1`, `zero2` or `fsdp` alone, or `--own-ddp`.
    pub const fn whole_replicas(data: DataAxis) -> Strategy {
        Strategy::Mesh { stages: 1, tp: 1, schedule: PipelineSchedule::GPipe, sequence_parallel: false, data }
    }

    /// `--strategy zero1` alone: whole replicas, AdamW's state sharded.
    pub const ZERO1: Strategy = Strategy::whole_replicas(DataAxis::ShardOptimizer);

    /// `--strategy zero2` alone: whole replicas, AdamW's state and the gradients sharded.
    pub const ZERO2: Strategy = Strategy::whole_replicas(DataAxis::ShardGradients);

    /// `--own-ddp`: whole replicas under the learner's DataParallel (exercise 26).
    pub const YOUR_DDP: Strategy = Strategy::whole_replicas(DataAxis::YourDdp);

    /// Whether the replicas shard some of the model states (FSDP, ZeRO-1,
    /// ZeRO-2, FSDP on a mesh).
    pub fn shards(self) -> bool {
        match self {
            Strategy::Ddp => false,
            Strategy::Mesh { data, .. } => data.shards(),
        }
    }

    /// Whether the mesh is cut at all (pipeline stages or tensor-parallel
    /// ranks): laid out by exercise 25, not one data-parallel axis.
    pub fn cuts_the_model(self) -> bool {
        matches!(self, Strategy::Mesh { stages, tp, .. } if stages > 1 || tp > 1)
    }
}
