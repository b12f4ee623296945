//! Reference solution of exercise 24: a pipelined step on the 1F1B schedule.

use std::collections::VecDeque;

use candle_core::{bail, Result, Tensor, Var};

use crate::autograd::Gradients;
use crate::distributed::ProcessGroup;
use crate::parallel::pipeline::{PipelineStage, PipelineStep};

/// A micro-batch between its forward and its backward: its input (a
/// variable, on every stage but the first) and its output.
type InFlight = (Option<Var>, Tensor);

pub fn one_f_one_b_step(
    pg: &dyn ProcessGroup,
    stage: &PipelineStage,
    micro_batches: &[Tensor],
) -> Result<PipelineStep> {
    let per_micro_batch = 1.0 / micro_batches.len() as f32; // ∂L/∂Lₘ for the mean loss
    let warmup = (stage.stages() - stage.index() - 1).min(micro_batches.len());
    let cut = Cut { pg, stage };
    let mut in_flight: VecDeque<InFlight> = VecDeque::with_capacity(warmup + 1);
    let (mut grads, mut loss) = (Gradients::default(), 0.0);
    for tokens in &micro_batches[..warmup] {
        let input = cut.receive_activation(tokens)?;
        let output = forward(stage, input.as_ref(), tokens)?;
        cut.send_activation(&output)?;
        in_flight.push_back((input, output));
    }
    let steady = &micro_batches[warmup..];
    let mut input = match steady.first() {
        Some(tokens) => cut.receive_activation(tokens)?,
        None => None,
    };
    for (i, tokens) in steady.iter().enumerate() {
        let output = forward(stage, input.as_ref(), tokens)?;
        // The activation goes on while the oldest micro-batch's gradient comes back: one exchange.
        let grad_output = cut.send_activation_receive_gradient(&output, per_micro_batch)?;
        in_flight.push_back((input.take(), output));
        let oldest = in_flight.pop_front().expect("a forward was just pushed");
        let (grad_input, share) = backward(stage, oldest, &grad_output, per_micro_batch, &mut grads)?;
        loss += share;
        // The gradient goes back while the next micro-batch's input comes in: one exchange.
        input = match steady.get(i + 1) {
            Some(next) => cut.send_gradient_receive_activation(grad_input.as_ref(), next)?,
            None => {
                cut.send_gradient(grad_input.as_ref())?;
                None
            }
        };
    }
    // The backwards still owed, oldest first.
    while let Some(oldest) = in_flight.pop_front() {
        let grad_output = cut.receive_gradient(&oldest.1, per_micro_batch)?;
        let (grad_input, share) = backward(stage, oldest, &grad_output, per_micro_batch, &mut grads)?;
        loss += share;
        cut.send_gradient(grad_input.as_ref())?;
    }
    Ok(PipelineStep { loss: stage.is_last().then_some(loss), grads })
}

/// The stage's forward of one micro-batch, on its received input (unless first).
fn forward(stage: &PipelineStage, input: Option<&Var>, tokens: &Tensor) -> Result<Tensor> {
    stage.forward(input.map_or(tokens, |x| x.as_tensor()), tokens)
}

/// Back-propagates one micro-batch from `grad_output` and adds its parameter
/// gradients to `grads`. Returns its input's gradient (unless first) and its
/// share of the step's loss on the last stage, 0 elsewhere.
fn backward(
    stage: &PipelineStage,
    (input, output): InFlight,
    grad_output: &Tensor,
    per_micro_batch: f32,
    grads: &mut Gradients,
) -> Result<(Option<Tensor>, f32)> {
    let share = if stage.is_last() { output.to_scalar::<f32>()? * per_micro_batch } else { 0.0 };
    let store = stage.backward(&output, grad_output)?;
    grads.accumulate(&stage.gradients(&store)?)?;
    let grad_input = match input {
        None => None,
        Some(input) => match store.get(input.as_tensor()) {
            Some(grad) => Some(grad.clone()),
            None => bail!("stage {}'s input got no gradient", stage.index()),
        },
    };
    Ok((grad_input, share))
}

/// This stage's two cuts: to the stage before (unless first) and after (unless last).
struct Cut<'a> {
    pg: &'a dyn ProcessGroup,
    stage: &'a PipelineStage,
}

impl Cut<'_> {
    fn before(&self) -> Option<usize> {
        (!self.stage.is_first()).then(|| self.pg.rank() - 1)
    }

    fn after(&self) -> Option<usize> {
        (!self.stage.is_last()).then(|| self.pg.rank() + 1)
    }

    fn receive_activation(&self, tokens: &Tensor) -> Result<Option<Var>> {
        let Some(before) = self.before() else { return Ok(None) };
        Ok(Some(Var::from_tensor(&self.pg.recv(&self.stage.activation_like(tokens)?, before)?)?))
    }

    fn send_activation(&self, output: &Tensor) -> Result<()> {
        match self.after() {
            Some(after) => self.pg.send(output, after),
            None => Ok(()),
        }
    }

    /// The gradient of an output like `output` from the stage after; the
    /// loss's own, 1/M, on the last stage.
    fn receive_gradient(&self, output: &Tensor, per_micro_batch: f32) -> Result<Tensor> {
        match self.after() {
            Some(after) => self.pg.recv(output, after),
            None => Tensor::new(per_micro_batch, output.device()),
        }
    }

    fn send_gradient(&self, grad_input: Option<&Tensor>) -> Result<()> {
        match (self.before(), grad_input) {
            (Some(before), Some(grad)) => self.pg.send(grad, before),
            _ => Ok(()),
        }
    }

    fn send_activation_receive_gradient(&self, output: &Tensor, per_micro_batch: f32) -> Result<Tensor> {
        match self.after() {
            Some(after) => self.pg.send_recv(output, after, output, after),
            None => self.receive_gradient(output, per_micro_batch),
        }
    }

    fn send_gradient_receive_activation(&self, grad_input: Option<&Tensor>, next: &Tensor) -> Result<Option<Var>> {
        match (self.before(), grad_input) {
            (Some(before), Some(grad)) => {
                let input = self.pg.send_recv(grad, before, &self.stage.activation_like(next)?, before)?;
                Ok(Some(Var::from_tensor(&input)?))
            }
            _ => self.receive_activation(next),
        }
    }
}
