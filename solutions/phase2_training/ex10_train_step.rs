//! Reference solution of exercise 10: one training step.

use candle_core::{bail, Result, Tensor};

use crate::autograd::Gradients;
use crate::train::{StepStats, Trainer};

impl Trainer {
    pub fn train_step(&mut self, micro_batches: &[Tensor]) -> Result<StepStats> {
        if micro_batches.is_empty() {
            bail!("train_step needs at least one micro-batch");
        }
        let k = micro_batches.len() as f64;
        let (mut loss_sum, mut tokens) = (0.0, 0);
        for batch in micro_batches {
            let pass = self.model.forward(batch, Some(batch))?;
            let Some(loss) = &pass.loss else { bail!("forward with labels returned no loss") };
            loss_sum += loss.to_scalar::<f32>()? as f64;
            tokens += batch.elem_count();
            let mut grads = Gradients::from_store(&self.params, &pass.backward()?)?;
            grads.scale(1.0 / k)?; // the same as back-propagating loss / k
            self.grads.accumulate(&grads)?;
        }
        self.ddp.sync_gradients(&mut self.grads)?;
        let grad_norm = self.grads.clip_global_norm(self.config.max_grad_norm)?;
        let lr = self.config.schedule.lr(self.step);
        self.optimizer.step(&self.params, &self.grads, lr)?;
        self.grads.clear();
        self.step += 1;
        Ok(StepStats { loss: loss_sum / k, grad_norm, lr, tokens })
    }
}
