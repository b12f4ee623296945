//! Training machinery around exercises 8–11: gradients, the optimizer, the
//! schedule, data parallelism and the trainer's state.

mod adamw;
mod checkpoint;
mod ddp;
mod gradients;
mod optimizer;
mod schedule;
mod trainer;

pub use adamw::{AdamW, AdamWConfig, ParamGroup};
pub(crate) use adamw::Moments;
pub use checkpoint::{Checkpoint, DataPosition, TrainerState};
pub use ddp::{broadcast_parameters, Ddp, DEFAULT_BUCKET_BYTES};
pub use gradients::{clip_factor, sum_of_squares, Gradients};
pub use optimizer::OptimizerConfig;
pub use schedule::{CosineSchedule, LrSchedule, WsdSchedule};
pub use trainer::{StepStats, TrainConfig, Trainer};
