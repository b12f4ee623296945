//! A collective in flight: what an asynchronous call returns (PyTorch's
//! `Work`, from `async_op=True`).

use candle_core::{Result, Tensor};

/// The result of a collective that may still be running. `wait` blocks
/// until it is done; a backend that cannot overlap hands out finished ones.
pub struct Work {
    state: State,
}

enum State {
    Done(Result<Tensor>),
    Pending(Box<dyn FnOnce() -> Result<Tensor> + Send>),
}

impl Work {
    /// Work already done, with `result`.
    pub fn done(result: Result<Tensor>) -> Self {
        Self { state: State::Done(result) }
    }

    /// Work that `finish` completes, blocking until the result is there.
    pub fn pending(finish: impl FnOnce() -> Result<Tensor> + Send + 'static) -> Self {
        Self { state: State::Pending(Box::new(finish)) }
    }

    /// Blocks until the collective is done and returns its result.
    pub fn wait(self) -> Result<Tensor> {
        match self.state {
            State::Done(result) => result,
            State::Pending(finish) => finish(),
        }
    }
}

impl std::fmt::Debug for Work {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self.state {
            State::Done(_) => "Work(done)",
            State::Pending(_) => "Work(pending)",
        })
    }
}
