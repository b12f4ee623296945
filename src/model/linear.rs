//! The linear layer every projection of the model uses.

use candle_core::{Module, Result, Tensor};

use crate::kernels;

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
}

impl Module for Linear {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let y = kernels::linear(x, &self.weight)?;
        match &self.bias {
            Some(bias) => y.broadcast_add(bias),
            None => Ok(y),
        }
    }
}
