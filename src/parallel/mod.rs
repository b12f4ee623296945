//! How ranks share the work of training one model.
//!
//! - [`ddp`]: every rank holds the whole model and averages gradients with the
//!   others before each step (PyTorch's `DistributedDataParallel`).
//! - [`fsdp`]: every rank holds a shard of the parameters, gradients and
//!   optimizer state, and gathers what a unit needs just before using it
//!   (PyTorch's `FullyShardedDataParallel`, the ZeRO stages).
//! - [`fsdp_unit`]: one block as an FSDP unit, gathered and freed by exercise 22.
//! - [`zero`]: the sharded optimizer on its own (ZeRO stages 1 and 2), exercise 17.
//! - [`powersgd`]: gradients compressed to low rank before they are averaged, exercise 18.
//! - [`tensor`]: one layer's weights split across the ranks (Megatron), exercise 20.
//! - [`pipeline`]: the blocks split into stages, one per rank, exercise 21.
//! - [`MeshTrainer`]: the model over a mesh of data, pipeline and tensor
//!   parallelism, each axis one of the transforms above.
//! - [`threads`]: a rank's batch split across its threads, each running the whole model.
//!
//! Each strategy keeps its communication in its own `comm` file; every
//! collective goes through a [`ProcessGroup`](crate::distributed::ProcessGroup).

pub mod ddp;
pub mod fsdp;
pub mod fsdp_unit;
mod mesh;
pub mod pipeline;
pub mod powersgd;
pub mod tensor;
pub mod threads;
pub mod zero;

pub use mesh::{DataAxis, MeshPlan, MeshTrainer};
pub(crate) use threads::on_threads;
