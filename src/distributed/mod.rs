//! Distributed training's runtime: ranks, a process group, and the collectives.
//!
//! Data-parallel training runs the same program on `world_size` workers at
//! once. Each worker is a **rank** (0, 1, ..., world_size − 1); together they
//! form a **process group**. The workers compute on their own data and meet
//! only in **collectives**: calls that every rank makes, in the same order,
//! and that return once all ranks have contributed. Everything DDP and FSDP do
//! between ranks is one of five collectives:
//!
//! | method             | what each rank gets back                        | NCCL                  |
//! |--------------------|-------------------------------------------------|-----------------------|
//! | `all_reduce`       | the sum (or mean) of every rank's tensor        | `ncclAllReduce`       |
//! | `broadcast`        | the root rank's tensor                          | `ncclBroadcast`       |
//! | `all_gather`       | every rank's tensor, concatenated in rank order | `ncclAllGather`       |
//! | `reduce_scatter`   | its own 1/world_size chunk of the sum           | `ncclReduceScatter`   |
//! | `barrier`          | nothing: it only returns once all have arrived  | (a 1-element all-reduce) |
//!
//! DDP all-reduces gradients after backward; FSDP all-gathers parameter shards
//! before using them and reduce-scatters gradients into shards afterwards.
//! The pictures on each method of [`ProcessGroup`] show the data per rank.
//!
//! A group can be split into subgroups ([`ProcessGroup::split`]), and a
//! [`DeviceMesh`] lays the world out as a grid of data-, pipeline- and
//! tensor-parallel ranks with a group along each axis, so that each kind of
//! parallelism runs its collectives among the ranks it concerns.
//!
//! ## Backends
//!
//! The trainer is written against the [`ProcessGroup`] trait and never knows
//! which backend it has, exactly as PyTorch code calls `dist.all_reduce` on
//! Gloo or NCCL alike:
//!
//! - [`SingleProcess`]: world size 1; every collective is the identity.
//! - [`TcpProcessGroup`]: each rank is a process, on one machine or several,
//!   started by the [launcher](launch) with the `env://` variables
//!   ([`DistEnv`]) and joined by [`init_from_env`]. Rank 0 hosts a
//!   [store](store) where the ranks find each other; tensors then travel over
//!   direct TCP connections with the ring algorithms, as Gloo does.
//! - [`CpuProcessGroup`]: each rank is a thread of this process, started by
//!   [`spawn`] (the counterpart of `torch.multiprocessing.spawn`): quick to
//!   start, for tests and small runs.
//! - `NcclProcessGroup` (feature `nccl`): each rank is a process driving one
//!   GPU, joined like [`TcpProcessGroup`]; tensors travel GPU to GPU through
//!   NVIDIA's NCCL, as PyTorch's `nccl` backend does.
//!
//! ## Guarantees every backend keeps
//!
//! - A result has the input's shape, dtype and device, and every rank receives
//!   bit-identical numbers. Reductions are computed in the input's dtype, as
//!   NCCL computes them; whether they add in rank order (and so match one
//!   process bit for bit) is one of the [`Properties`] a backend reports.
//! - A result is a fresh, untracked tensor: a collective is a communication
//!   step, not part of the autograd graph.
//! - [`ProcessGroup::stats`] counts the calls and bytes of each collective, so
//!   a test can check "exactly one all-reduce per optimizer step".
//! - Nothing hangs: a rank that fails, exits, skips a collective or calls a
//!   different one turns every other rank's collective into an error that
//!   names it, at once or after the timeout.
//!
//! ```no_run
//! use candle_core::{Device, Tensor};
//! use workbook::distributed::{spawn, ProcessGroup, ReduceOp};
//!
//! // Four ranks each hold their rank number; the all-reduce adds them up.
//! let sums = spawn(4, |pg| {
//!     let mine = Tensor::new(&[pg.rank() as f32], &Device::Cpu)?;
//!     pg.all_reduce(&mine, ReduceOp::Sum)?.to_vec1::<f32>()
//! })?;
//! assert_eq!(sums, vec![vec![6.0]; 4]); // 0 + 1 + 2 + 3, on every rank
//! # Ok::<(), candle_core::Error>(())
//! ```

pub mod auth;
mod busy_board;
mod collective;
mod cpu;
mod device_mesh;
mod env;
mod interrupt;
pub mod launch;
#[cfg(feature = "nccl")]
mod nccl;
mod overridden;
mod own_ring;
mod p2p_trace;
mod process_group;
mod reduce_op;
mod rendezvous_store;
mod shared;
mod single;
mod stats;
pub mod store;
mod tcp;
mod unverified;
pub mod watchdog;
mod work;

pub use busy_board::BusyBoard;
pub use collective::{chunk_ranges, Collective};
pub use cpu::{spawn, spawn_with_timeout, CpuProcessGroup, DEFAULT_TIMEOUT};
pub use device_mesh::{Axis, DeviceMesh, MeshCoords, MeshShape};
pub use env::{init_from_env, DistEnv, NCCL_DEFAULT_TIMEOUT};
pub use interrupt::{catch_interrupts, interrupted, Again, INTERRUPTED};
pub use launch::{launch, relaunch_self, LaunchConfig};
#[cfg(feature = "nccl")]
pub use nccl::NcclProcessGroup;
pub use overridden::{CollectiveOverride, WithOverride};
pub use own_ring::OwnRing;
pub use p2p_trace::{P2pRecorder, P2pTrace};
pub use process_group::{all_reduce_scalar, while_busy, ProcessGroup, Properties};
pub use reduce_op::ReduceOp;
pub use shared::SharedGroup;
pub use single::SingleProcess;
pub use stats::CommStats;
pub use tcp::{Rendezvous, TcpProcessGroup};
pub use unverified::{allow_unverified_nccl, refuse_unverified};
pub use work::Work;
