//! A tensor whose numbers come from one computation and whose gradient
//! follows another: how a collective enters autograd. candle records no graph
//! through a collective (its result is a fresh tensor), and a custom op's
//! forward sees only device memory, not a process group; so the collective
//! runs outside, and this op records its result as a function of its input
//! with the backward the caller names.

use std::sync::Arc;

use candle_core::{bail, CpuStorage, CustomOp2, Layout, Result, Shape, Tensor};

use super::rows::{rearrange, Rearrange};
#[cfg(feature = "cuda")]
use candle_core::cuda_backend::CudaStorage;

/// What a backward does with ∂L/∂output: ∂L/∂input.
type Backward = Arc<dyn Fn(&Tensor) -> Result<Tensor> + Send + Sync>;

/// `value`'s numbers, recorded as a function of `x`: a backward through the
/// result hands `backward(∂L/∂result)` to `x` as its gradient, which must
/// have `x`'s shape. `value` may have any shape and carries no gradient
/// itself. When `x` tracks no gradient nothing is recorded, and the result
/// is `value`.
pub fn with_backward(
    x: &Tensor,
    value: &Tensor,
    backward: impl Fn(&Tensor) -> Result<Tensor> + Send + Sync + 'static,
) -> Result<Tensor> {
    if !x.track_op() {
        return Ok(value.clone());
    }
    if x.device().location() != value.device().location() {
        bail!("with_backward: the input is on {:?} and the value on {:?}", x.device(), value.device());
    }
    x.apply_op2(&value.detach().contiguous()?, Recorded { backward: Arc::new(backward) })
}

struct Recorded {
    backward: Backward,
}

/// A contiguous copy.
struct Same;

impl Rearrange for Same {
    fn apply<T: Copy>(&self, src: &[T]) -> Vec<T> {
        src.to_vec()
    }
}

impl CustomOp2 for Recorded {
    fn name(&self) -> &'static str {
        "workbook-with-backward"
    }

    fn cpu_fwd(&self, _: &CpuStorage, _: &Layout, value: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        Ok((rearrange(value, layout, &Same, self.name())?, layout.shape().clone()))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        _: &CudaStorage,
        _: &Layout,
        value: &CudaStorage,
        layout: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        super::cuda::copy_strided(value, layout, layout.shape().clone())
    }

    fn bwd(&self, x: &Tensor, _: &Tensor, _: &Tensor, dy: &Tensor) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let dx = (self.backward)(dy)?;
        if dx.dims() != x.dims() {
            bail!(
                "with_backward: the backward gave a gradient of shape {:?} for an input of shape {:?}",
                dx.dims(),
                x.dims()
            );
        }
        Ok((Some(dx), None))
    }
}

#[cfg(test)]
mod tests {
    use candle_core::{Device, Var};

    use super::*;

    #[test]
    fn the_value_goes_forward_and_the_named_backward_goes_back() -> Result<()> {
        let x = Var::new(&[1f32, 2., 3.], &Device::Cpu)?;
        let value = Tensor::new(&[[10f32, 20.], [30., 40.]], &Device::Cpu)?;
        let y = with_backward(x.as_tensor(), &value, |dy| dy.sum_all()?.broadcast_as(3))?;
        assert_eq!(y.to_vec2::<f32>()?, [[10., 20.], [30., 40.]]);
        let grads = (y * 2.0)?.sum_all()?.backward()?;
        assert_eq!(grads.get(x.as_tensor()).unwrap().to_vec1::<f32>()?, [8., 8., 8.]);
        Ok(())
    }

    #[test]
    fn a_backward_of_the_wrong_shape_is_refused() -> Result<()> {
        let x = Var::new(&[1f32, 2.], &Device::Cpu)?;
        let y = with_backward(x.as_tensor(), &x.as_tensor().detach(), |dy| dy.sum_all())?;
        let error = y.sum_all()?.backward().unwrap_err().to_string();
        assert!(error.contains("shape [] for an input of shape [2]"), "{error}");
        Ok(())
    }
}
