//! Reference solution of exercise 26: your own DDP.
//!
//! The design of PyTorch's reducer: the gradient hook packs each final
//! gradient into the open bucket and starts the bucket's all-reduce the
//! moment it is full, on the thread that runs backward (the collective runs
//! on the process group's own thread); the results are read once backward
//! has returned.

use candle_core::{Result, Tensor};

use crate::autograd::Gradients;
use crate::distributed::{ProcessGroup, ReduceOp, Work};
use crate::model::{Gpt, GptConfig, ParamStore};

/// One rank's data-parallel replica.
pub struct DataParallel {
    model: Gpt,
    params: ParamStore,
    pg: Box<dyn ProcessGroup>,
    bucket_cap_bytes: usize,
    /// The sum of the micro-batches' gradients since the last `take_gradients`.
    accumulated: Gradients,
}

/// Gradients waiting for their bucket to fill.
#[derive(Default)]
struct OpenBucket {
    grads: Vec<(String, Tensor)>,
    bytes: usize,
}

/// A bucket's all-reduce in flight, with what it carries.
struct InFlight {
    grads: Vec<(String, Tensor)>,
    work: Work,
}

impl DataParallel {
    pub fn new(
        config: &GptConfig,
        params: ParamStore,
        pg: Box<dyn ProcessGroup>,
        bucket_cap_bytes: usize,
    ) -> Result<Self> {
        for (_, var) in params.iter() {
            var.set(&pg.broadcast(var.as_tensor(), 0)?)?;
        }
        let model = Gpt::new(config, &params)?.with_blockwise_backward();
        Ok(Self { model, params, pg, bucket_cap_bytes, accumulated: Gradients::default() })
    }

    pub fn forward_backward(&mut self, batch: &Tensor, sync: bool) -> Result<f64> {
        let pass = self.model.forward(batch, Some(batch))?;
        let loss = pass.loss_value()?;
        if !sync {
            self.accumulated.accumulate(&Gradients::from_store(&self.params, &pass.backward()?)?)?;
            return Ok(loss);
        }
        let mut open = OpenBucket::default();
        let mut in_flight = Vec::new();
        pass.backward_as_ready(self.model.config(), &self.params, |name, grad| {
            let total = match self.accumulated.get(name) {
                Some(earlier) => (earlier + grad)?,
                None => grad,
            };
            open.bytes += total.elem_count() * total.dtype().size_in_bytes();
            open.grads.push((name.to_string(), total));
            if open.bytes >= self.bucket_cap_bytes {
                in_flight.push(start(self.pg.as_ref(), std::mem::take(&mut open))?);
            }
            Ok(())
        })?;
        if !open.grads.is_empty() {
            in_flight.push(start(self.pg.as_ref(), open)?);
        }
        for bucket in in_flight {
            let averaged = bucket.work.wait()?;
            let mut offset = 0;
            for (name, grad) in bucket.grads {
                let n = grad.elem_count();
                self.accumulated.insert(&name, averaged.narrow(0, offset, n)?.reshape(grad.shape())?);
                offset += n;
            }
        }
        Ok(loss)
    }

    pub fn take_gradients(&mut self) -> Result<Gradients> {
        Ok(std::mem::take(&mut self.accumulated))
    }
}

/// Starts the average of `bucket`'s gradients, flattened into one tensor.
fn start(pg: &dyn ProcessGroup, bucket: OpenBucket) -> Result<InFlight> {
    let flat: Vec<Tensor> = bucket.grads.iter().map(|(_, g)| g.flatten_all()).collect::<Result<_>>()?;
    let work = pg.all_reduce_async(&Tensor::cat(&flat, 0)?, ReduceOp::Avg)?;
    Ok(InFlight { grads: bucket.grads, work })
}
