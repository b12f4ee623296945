//! DDP with its all-reduce overlapped with backward (`train --ddp-overlap`):
//! the learner's exercise 19 buckets the gradients as backward makes them.
//!
//! Backward runs stage by stage ([`ForwardPass::backward_as_ready`]) on a
//! thread of its own and hands over each gradient as soon as it is final; the
//! rank's thread all-reduces the buckets meanwhile (a process group is not
//! shared between threads).
//!
//! Only the last micro-batch's backward overlaps: the earlier ones only
//! accumulate, as under PyTorch's `no_sync()`.

use std::sync::mpsc::{channel, Sender};

use candle_core::{bail, Result, Tensor};

use super::Ddp;
use crate::autograd::Gradients;
use crate::model::{ForwardPass, GptConfig, ParamStore};
use crate::phase4_under_the_hood::overlapped_all_reduce;
use crate::train::{StepStats, Trainer};

/// Runs `pass`'s backward stage by stage and sends each parameter's gradient
/// as soon as it is final, as `earlier + scale · gradient` (what earlier
/// micro-batches accumulated plus this one's share). Stops when the receiver
/// is gone: the all-reduce stopped, and its error is the one to report.
fn send_when_final(
    config: &GptConfig,
    pass: &ForwardPass,
    params: &ParamStore,
    earlier: &Gradients,
    scale: f64,
    ready: Sender<(String, Tensor)>,
) -> Result<()> {
    pass.backward_as_ready(config, params, |name, gradient| {
        let this = (gradient * scale)?;
        let total = match earlier.get(name) {
            Some(sum) => (sum + this)?,
            None => this,
        };
        ready.send((name.to_string(), total)).map_err(|_| candle_core::Error::Msg("the all-reduce stopped".into()))
    })
}

impl Ddp {
    /// Averages across ranks the gradients `backward` sends, with the
    /// learner's exercise 19, while `backward` is still computing the next:
    /// `backward` runs on a thread of its own.
    fn average_during(
        &mut self,
        names: usize,
        backward: impl FnOnce(Sender<(String, Tensor)>) -> Result<()> + Send,
    ) -> Result<Gradients> {
        if self.powersgd.is_some() {
            bail!("PowerSGD compression and overlapped buckets do not combine: choose one of the two");
        }
        self.syncs += 1;
        let (ready, arriving) = channel();
        let (averaged, backward) = std::thread::scope(|scope| {
            let backward = scope.spawn(move || backward(ready));
            let averaged = overlapped_all_reduce(self.pg.as_ref(), arriving.into_iter(), self.bucket_bytes);
            (averaged, backward.join())
        });
        let Ok(backward) = backward else { bail!("the backward thread panicked") };
        let averaged = averaged?; // before backward's: a failed all-reduce is what stopped backward
        backward?;
        if averaged.len() != names {
            bail!(
                "exercise 19's overlapped_all_reduce returned {} gradients for the {names} it was given: return every one",
                averaged.len()
            );
        }
        let mut grads = Gradients::default();
        for (name, grad) in averaged {
            grads.insert(&name, grad);
        }
        Ok(grads)
    }
}

impl Trainer {
    /// Exercise 10's step with DDP's all-reduce overlapped with the last
    /// micro-batch's backward: the earlier micro-batches accumulate their
    /// gradients (each divided by their count) without communicating.
    pub fn overlapped_train_step(&mut self, micro_batches: &[Tensor]) -> Result<StepStats> {
        let Some((last, earlier)) = micro_batches.split_last() else {
            bail!("train_step needs at least one micro-batch");
        };
        let k = micro_batches.len() as f64;
        let mut loss_sum = 0.0;
        let mut forward = |batch: &Tensor| -> Result<ForwardPass> {
            let pass = self.model.forward(batch, Some(batch))?;
            loss_sum += pass.loss_value()?;
            Ok(pass)
        };
        for batch in earlier {
            let pass = forward(batch)?;
            let mut grads = Gradients::from_store(&self.params, &pass.backward()?)?;
            grads.scale(1.0 / k)?;
            self.grads.accumulate(&grads)?;
        }
        let pass = forward(last)?;
        let (config, params, accumulated) = (self.model.config(), &self.params, &self.grads);
        let names = params.iter().count();
        self.grads = self
            .ddp
            .average_during(names, |ready| send_when_final(config, &pass, params, accumulated, 1.0 / k, ready))?;
        let grad_norm = self.grads.clip_global_norm(self.config.max_grad_norm)?;
        let lr = self.config.schedule.lr(self.step);
        self.optimizer.step(&self.params, &self.grads, lr)?;
        self.grads.clear();
        self.step += 1;
        let tokens = micro_batches.iter().map(Tensor::elem_count).sum();
        Ok(StepStats { loss: loss_sum / k, grad_norm, lr, tokens })
    }
}
