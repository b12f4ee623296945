//! Reference solution of exercise 22: the FSDP unit step.

use candle_core::{bail, Result, Tensor, Var};

use crate::autograd::vjp;
use crate::distributed::{ProcessGroup, ReduceOp};
use crate::parallel::fsdp_unit::{BlockUnit, FsdpForward};

pub fn fsdp_forward(pg: &dyn ProcessGroup, units: &mut [BlockUnit], x: &Tensor) -> Result<FsdpForward> {
    let mut inputs = Vec::with_capacity(units.len());
    let mut h = x.detach();
    for unit in units.iter_mut() {
        unit.unshard(pg.all_gather(&unit.shard()?)?)?;
        // No graph: it would keep the whole parameters alive until backward.
        let output = unit.forward(&h)?.detach();
        unit.reshard();
        inputs.push(std::mem::replace(&mut h, output));
    }
    Ok(FsdpForward { output: h, inputs })
}

pub fn fsdp_backward(
    pg: &dyn ProcessGroup,
    units: &mut [BlockUnit],
    inputs: &[Tensor],
    grad_output: &Tensor,
) -> Result<Tensor> {
    if inputs.len() != units.len() {
        bail!("{} inputs kept for {} units: keep one per unit", inputs.len(), units.len());
    }
    let mut grad = grad_output.clone();
    for (unit, input) in units.iter_mut().zip(inputs).rev() {
        unit.unshard(pg.all_gather(&unit.shard()?)?)?;
        let input = Var::from_tensor(input)?;
        let grads = vjp(&unit.forward(input.as_tensor())?, &grad)?;
        let (Some(whole), Some(grad_input)) = (unit.flat_grad(&grads)?, grads.get(input.as_tensor())) else {
            bail!("unit {}'s replay gave no gradient for its parameters or its input", unit.layer());
        };
        unit.add_grad(&pg.reduce_scatter(&whole, ReduceOp::Avg)?)?;
        unit.reshard();
        grad = grad_input.clone();
    }
    Ok(grad)
}
