//! Training machinery around exercises 8–11: the optimizer, the schedule,
//! checkpoints and the trainer's state. Gradients by name are in
//! [`crate::autograd`]; how ranks share the work, in [`crate::parallel`].

mod adamw;
mod checkpoint;
pub mod faults;
mod optimizer;
mod schedule;
mod seam;
mod step_end;
mod tensor_file;
mod trainer;

pub(crate) use adamw::Moments;
pub use adamw::{AdamW, AdamWConfig, ParamGroup};
pub use checkpoint::{Checkpoint, CheckpointWriter, DataPosition, TrainerState};
pub use optimizer::OptimizerConfig;
pub use schedule::{CosineSchedule, LrSchedule, WsdSchedule};
pub use seam::Train;
pub use step_end::{StepCounters, Verdict};
pub use trainer::{StepStats, TrainConfig, Trainer};
