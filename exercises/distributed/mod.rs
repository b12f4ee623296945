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
//! ## Backends
//!
//! The trainer is written against the [`ProcessGroup`] trait and never knows
//! which backend it has, exactly as PyTorch code calls `dist.all_reduce` on
//! Gloo or NCCL alike:
//!
//! - [`SingleProcess`]: world size 1; every collective is the identity.
//! - [`CpuProcessGroup`]: each rank is a thread of this process, started by
//!   [`spawn`] (the counterpart of `torch.multiprocessing.spawn`).
//!
//! ## Guarantees every backend keeps
//!
//! - A result has the input's dtype; reductions are computed in f32, adding the
//!   ranks' tensors in rank order 0, 1, ..., so every rank receives
//!   bit-identical numbers and a rerun gives the same ones.
//! - A result is a fresh, untracked tensor on the input's device: a
//!   collective is a communication step, not part of the autograd graph.
//! - [`ProcessGroup::stats`] counts the calls and bytes of each collective, so
//!   a test can check "exactly one all-reduce per optimizer step".
//! - Nothing hangs: a rank that fails, panics, skips a collective or calls a
//!   different one turns every other rank's collective into an error.
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

mod collective;
mod cpu;
mod process_group;
mod reduce_op;
mod single;
mod stats;

pub use collective::Collective;
pub use cpu::{spawn, spawn_with_timeout, CpuProcessGroup, DEFAULT_TIMEOUT};
pub use process_group::ProcessGroup;
pub use reduce_op::ReduceOp;
pub use single::SingleProcess;
pub use stats::CommStats;
