//! Gradients by parameter name: the buffer micro-batches accumulate into.
//!
//! candle's `GradStore` is keyed by tensor id and lives for one backward pass.
//! Accumulation, all-reduce, clipping and the optimizer want a stable, ordered
//! view instead: name → f32 gradient, in the `ParamStore`'s name order.

use std::collections::BTreeMap;

use candle_core::backprop::GradStore;
use candle_core::{DType, Result, Tensor, Var};

use crate::kernels;
use crate::model::ParamStore;

#[derive(Debug, Clone, Default)]
pub struct Gradients {
    by_name: BTreeMap<String, Tensor>,
}

impl Gradients {
    /// The gradients of `params` in `store`, as f32. A parameter that did not
    /// reach the loss gets a zero gradient.
    pub fn from_store(params: &ParamStore, store: &GradStore) -> Result<Self> {
        let mut by_name = BTreeMap::new();
        for (name, var) in params.iter() {
            by_name.insert(name.to_string(), gradient_of(var, store)?);
        }
        Ok(Self { by_name })
    }

    /// Adds `other` to these gradients (an empty buffer simply takes `other`).
    pub fn accumulate(&mut self, other: &Gradients) -> Result<()> {
        for (name, grad) in &other.by_name {
            let sum = match self.by_name.get(name) {
                Some(mine) => kernels::add(mine, grad)?,
                None => grad.clone(),
            };
            self.by_name.insert(name.clone(), sum);
        }
        Ok(())
    }

    /// Empties the buffer, like PyTorch's `optimizer.zero_grad()`.
    pub fn clear(&mut self) {
        self.by_name.clear();
    }

    pub fn is_empty(&self) -> bool {
        self.by_name.is_empty()
    }

    pub fn get(&self, name: &str) -> Option<&Tensor> {
        self.by_name.get(name)
    }

    /// Takes the gradient of `name` out of the buffer.
    pub fn remove(&mut self, name: &str) -> Option<Tensor> {
        self.by_name.remove(name)
    }

    /// Replaces the gradient of `name`.
    pub fn insert(&mut self, name: &str, grad: Tensor) {
        self.by_name.insert(name.to_string(), grad);
    }

    /// Name and gradient, in name order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Tensor)> {
        self.by_name.iter().map(|(n, g)| (n.as_str(), g))
    }

    /// Multiplies every gradient by `factor`.
    pub fn scale(&mut self, factor: f64) -> Result<()> {
        for grad in self.by_name.values_mut() {
            *grad = kernels::scale(grad, factor)?;
        }
        Ok(())
    }

    /// Whether no gradient holds an inf or a NaN.
    pub fn all_finite(&self) -> Result<bool> {
        kernels::all_finite(&self.by_name.values().collect::<Vec<_>>())
    }

    /// The L2 norm of all gradients taken together, computed in f32.
    pub fn global_norm(&self) -> Result<f64> {
        Ok(sum_of_squares(self.by_name.values())?.sqrt())
    }

    /// Scales the gradients so that their global norm is at most `max_norm`,
    /// and returns the norm before clipping (what PyTorch's `clip_grad_norm_` returns).
    pub fn clip_global_norm(&mut self, max_norm: f64) -> Result<f64> {
        let norm = self.global_norm()?;
        if let Some(factor) = clip_factor(norm, max_norm) {
            self.scale(factor)?;
        }
        Ok(norm)
    }
}

/// The gradient of `var` in `store` as f32, detached; zero when `var` did not
/// reach the loss.
pub fn gradient_of(var: &Var, store: &GradStore) -> Result<Tensor> {
    as_f32_gradient(var, store.get(var).cloned())
}

/// [`gradient_of`], taken out of `store`: once it is final, the store need
/// not hold a second copy while backward goes on.
pub fn take_gradient_of(var: &Var, store: &mut GradStore) -> Result<Tensor> {
    as_f32_gradient(var, store.remove(var))
}

fn as_f32_gradient(var: &Var, grad: Option<Tensor>) -> Result<Tensor> {
    let grad = match grad {
        Some(g) => g.to_dtype(DType::F32)?,
        None => var.zeros_like()?.to_dtype(DType::F32)?,
    };
    Ok(grad.detach())
}

/// The sum of the squares of every element of `grads` (f32 tensors), added
/// in f64 across tensors ([`kernels::sum_of_squares`]).
pub fn sum_of_squares<'a>(grads: impl IntoIterator<Item = &'a Tensor>) -> Result<f64> {
    kernels::sum_of_squares(&grads.into_iter().collect::<Vec<_>>())
}

/// What gradients of global norm `norm` are multiplied by to clip them to
/// `max_norm`, or `None` when they are within it. PyTorch's formula: the
/// 1e-6 keeps a zero norm from dividing by zero.
pub fn clip_factor(norm: f64, max_norm: f64) -> Option<f64> {
    let factor = max_norm / (norm + 1e-6);
    (factor < 1.0).then_some(factor)
}
