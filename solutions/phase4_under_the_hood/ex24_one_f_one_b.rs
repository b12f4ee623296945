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
    let mut in_flight = VecDeque::with_capacity(warmup + 1);
    let (mut grads, mut loss) = (Gradients::default(), 0.0);
    for (m, tokens) in micro_batches.iter().enumerate() {
        in_flight.push_back(forward(pg, stage, tokens)?);
        // After the warm-up, every forward is followed by the oldest micro-batch's backward.
        if m >= warmup {
            let oldest = in_flight.pop_front().expect("a forward was just pushed");
            loss += backward(pg, stage, oldest, per_micro_batch, &mut grads)?;
        }
    }
    // The backwards still owed, oldest first.
    while let Some(oldest) = in_flight.pop_front() {
        loss += backward(pg, stage, oldest, per_micro_batch, &mut grads)?;
    }
    Ok(PipelineStep { loss: stage.is_last().then_some(loss), grads })
}

/// Receives the micro-batch's input (unless first), runs the stage and sends
/// the output on (unless last).
fn forward(pg: &dyn ProcessGroup, stage: &PipelineStage, tokens: &Tensor) -> Result<InFlight> {
    let rank = pg.rank();
    let input = match stage.is_first() {
        true => None,
        false => Some(Var::from_tensor(&pg.recv(&stage.activation_like(tokens)?, rank - 1)?)?),
    };
    let output = stage.forward(input.as_ref().map_or(tokens, |x| x.as_tensor()), tokens)?;
    if !stage.is_last() {
        pg.send(&output, rank + 1)?;
    }
    Ok((input, output))
}

/// Back-propagates one micro-batch, adds its parameter gradients to `grads`
/// and sends its input's gradient back (unless first). Returns its share of
/// the step's loss on the last stage, 0 elsewhere.
fn backward(
    pg: &dyn ProcessGroup,
    stage: &PipelineStage,
    (input, output): InFlight,
    per_micro_batch: f32,
    grads: &mut Gradients,
) -> Result<f32> {
    let rank = pg.rank();
    let (grad_output, loss) = match stage.is_last() {
        true => (Tensor::new(per_micro_batch, output.device())?, output.to_scalar::<f32>()? * per_micro_batch),
        false => (pg.recv(&output, rank + 1)?, 0.0),
    };
    let store = stage.backward(&output, &grad_output)?;
    grads.accumulate(&stage.gradients(&store)?)?;
    if let Some(input) = input {
        let Some(grad_input) = store.get(input.as_tensor()) else {
            bail!("stage {rank}'s input got no gradient");
        };
        pg.send(grad_input, rank - 1)?;
    }
    Ok(loss)
}
