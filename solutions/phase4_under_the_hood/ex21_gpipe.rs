//! Reference solution of exercise 21: a pipelined step on GPipe's schedule.

use candle_core::{bail, Result, Tensor, Var};

use crate::autograd::Gradients;
use crate::distributed::ProcessGroup;
use crate::parallel::pipeline::{PipelineStage, PipelineStep};

pub fn gpipe_step(pg: &dyn ProcessGroup, stage: &PipelineStage, micro_batches: &[Tensor]) -> Result<PipelineStep> {
    let rank = pg.rank();
    let per_micro_batch = 1.0 / micro_batches.len() as f32; // ∂L/∂Lₘ for the mean loss

    // All forwards: keep each micro-batch's input (a variable, to get its gradient) and output.
    let mut kept = Vec::with_capacity(micro_batches.len());
    for tokens in micro_batches {
        let input = match stage.is_first() {
            true => None,
            false => Some(Var::from_tensor(&pg.recv(&stage.activation_like(tokens)?, rank - 1)?)?),
        };
        let output = stage.forward(input.as_ref().map_or(tokens, |x| x.as_tensor()), tokens)?;
        if !stage.is_last() {
            pg.send(&output, rank + 1)?;
        }
        kept.push((input, output));
    }

    // All backwards, last micro-batch first, as on every stage.
    let (mut grads, mut loss) = (Gradients::default(), 0.0);
    for (input, output) in kept.iter().rev() {
        let grad_output = match stage.is_last() {
            true => {
                loss += output.to_scalar::<f32>()? * per_micro_batch;
                Tensor::new(per_micro_batch, output.device())?
            }
            false => pg.recv(output, rank + 1)?,
        };
        let store = stage.backward(output, &grad_output)?;
        grads.accumulate(&stage.gradients(&store)?)?;
        if let Some(input) = input {
            let Some(grad_input) = store.get(input.as_tensor()) else {
                bail!("stage {rank}'s input got no gradient");
            };
            pg.send(grad_input, rank - 1)?;
        }
    }
    Ok(PipelineStep { loss: stage.is_last().then_some(loss), grads })
}
