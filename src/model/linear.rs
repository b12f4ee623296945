//! The linear layer every projection of the model uses, and autocast: its
//! matrix products in bf16 while everything else stays f32.

use std::cell::Cell;

use candle_core::{DType, Module, Result, Tensor};

use crate::kernels;

thread_local! {
    static AUTOCAST_BF16: Cell<bool> = const { Cell::new(false) };
}

/// Makes every [`Linear`] that runs on this thread multiply f32 inputs and
/// weights in bf16 and hand back f32 (`true`), or stop doing so: PyTorch's
/// `torch.autocast(dtype=torch.bfloat16)` for the model's projections and
/// head, and like it a setting of the thread that runs the forward pass.
///
/// The weights stay f32 (the master copy AdamW updates) and get f32
/// gradients; the norms, the softmax, the loss and attention's own products
/// stay f32. On a GPU with tensor cores a bf16 product runs many times faster
/// than an f32 one, for the cost of casting its operands. (bf16 keeps f32's
/// range, so no loss scaling is needed, as f16 would need.)
pub fn set_autocast_bf16(on: bool) {
    AUTOCAST_BF16.with(|autocast| autocast.set(on));
}

/// Whether [`set_autocast_bf16`] turned autocast on for this thread.
pub fn autocast_bf16() -> bool {
    AUTOCAST_BF16.with(Cell::get)
}

/// `y = x · wᵀ (+ b)` for `x` (..., in_features) and `weight` (out_features,
/// in_features), as PyTorch's `nn.Linear`: leading dimensions pass through.
///
/// It does what `candle_nn::Linear` does, as one node of the autograd graph
/// ([`kernels::linear`]), which makes its backward pass cheaper.
#[derive(Debug, Clone)]
pub struct Linear {
    weight: Tensor,
    bias: Option<Tensor>,
}

impl Linear {
    pub fn new(weight: Tensor, bias: Option<Tensor>) -> Self {
        Self { weight, bias }
    }

    pub fn weight(&self) -> &Tensor {
        &self.weight
    }

    pub fn bias(&self) -> Option<&Tensor> {
        self.bias.as_ref()
    }

    /// The weight, and the bias when there is one.
    pub fn tensors(&self) -> Vec<Tensor> {
        std::iter::once(self.weight.clone()).chain(self.bias.clone()).collect()
    }
}

impl Module for Linear {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let y = if autocast_bf16() && x.dtype() == DType::F32 && self.weight.dtype() == DType::F32 {
            let bf16 = DType::BF16;
            kernels::linear(&x.to_dtype(bf16)?, &self.weight.to_dtype(bf16)?)?.to_dtype(DType::F32)?
        } else {
            kernels::linear(x, &self.weight)?
        };
        match &self.bias {
            Some(bias) => y.broadcast_add(bias),
            None => Ok(y),
        }
    }
}
