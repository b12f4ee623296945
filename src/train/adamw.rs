//! AdamW with parameter groups and state that can be saved and restored.
//!
//! candle-nn's `AdamW` has a single weight decay and keeps its moments private,
//! so it can neither skip decay for norms and biases nor be checkpointed. This
//! one follows PyTorch's `torch.optim.AdamW` step for step:
//!
//! ```text
//! p ← p − lr · wd · p                 decoupled weight decay (per group)
//! m ← β₁ m + (1 − β₁) g               first moment
//! v ← β₂ v + (1 − β₂) g²              second moment
//! p ← p − lr · (m / (1 − β₁ᵗ)) / (sqrt(v / (1 − β₂ᵗ)) + ε)
//! ```
//!
//! Moments are f32 whatever the parameters' dtype: 8 bytes per parameter,
//! the largest share of training memory that ZeRO stage 1 shards away.

use std::collections::{BTreeMap, HashMap};

use candle_core::{bail, DType, Result, Tensor};
use serde::{Deserialize, Serialize};

use crate::autograd::Gradients;
use crate::kernels::{adamw_update, scale, AdamWStep};
use crate::model::ParamStore;

/// The hyper-parameters shared by every group.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct AdamWConfig {
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
}

impl Default for AdamWConfig {
    fn default() -> Self {
        Self { beta1: 0.9, beta2: 0.95, eps: 1e-8 }
    }
}

/// A set of parameters that share a weight decay.
#[derive(Debug, Clone, PartialEq)]
pub struct ParamGroup {
    pub names: Vec<String>,
    pub weight_decay: f64,
}

impl ParamGroup {
    /// The weight decay of every parameter in `params`, from `groups`. Fails
    /// unless each parameter is in exactly one group and each grouped name is
    /// a parameter: one in no group would silently never train.
    pub fn decay_by_name(groups: &[ParamGroup], params: &ParamStore) -> Result<HashMap<String, f64>> {
        let mut decay = HashMap::new();
        for group in groups {
            for name in &group.names {
                if params.get(name).is_err() {
                    bail!("the optimizer groups name `{name}`, which is not a parameter of the model");
                }
                if decay.insert(name.clone(), group.weight_decay).is_some() {
                    bail!("parameter `{name}` is in two optimizer groups: each parameter belongs to exactly one");
                }
            }
        }
        if let Some((name, _)) = params.iter().find(|(name, _)| !decay.contains_key(*name)) {
            bail!("parameter `{name}` is in no optimizer group: it would never be updated");
        }
        Ok(decay)
    }
}

impl AdamWConfig {
    /// The AdamW update at step `t` (counted from 1) of parameters already
    /// decayed, `decayed = p · (1 − lr · wd)`, whatever their layout: whole
    /// tensors here, flat shards under FSDP. Returns the new parameters.
    pub(crate) fn update(
        &self,
        t: u64,
        lr: f64,
        decayed: &Tensor,
        grad: &Tensor,
        moments: Moments,
    ) -> Result<(Tensor, Moments)> {
        let Self { beta1, beta2, eps } = *self;
        let t = t as i32;
        let (correction1, correction2) = (1.0 - beta1.powi(t), 1.0 - beta2.powi(t));
        let step = AdamWStep { lr, beta1, beta2, eps, correction1, correction2 };
        let (new_p, exp_avg, exp_avg_sq) = adamw_update(decayed, grad, &moments.exp_avg, &moments.exp_avg_sq, step)?;
        Ok((new_p, Moments { exp_avg, exp_avg_sq }))
    }
}

/// AdamW's running averages for some parameters: f32, shaped like them.
#[derive(Debug, Clone)]
pub(crate) struct Moments {
    pub exp_avg: Tensor,
    pub exp_avg_sq: Tensor,
}

impl Moments {
    pub fn zeros_like(p: &Tensor) -> Result<Self> {
        Ok(Self { exp_avg: p.zeros_like()?, exp_avg_sq: p.zeros_like()? })
    }
}

#[derive(Debug, Clone)]
pub struct AdamW {
    groups: Vec<ParamGroup>,
    config: AdamWConfig,
    /// Optimizer steps taken so far (t in the bias corrections).
    steps: u64,
    /// Updates refused because a gradient was not finite.
    skipped: u64,
    moments: HashMap<String, Moments>,
}

impl AdamW {
    /// An optimizer over `groups`; a parameter may belong to at most one group.
    pub fn new(groups: Vec<ParamGroup>, config: AdamWConfig) -> Result<Self> {
        let mut seen = std::collections::HashSet::new();
        for name in groups.iter().flat_map(|g| &g.names) {
            if !seen.insert(name) {
                bail!("parameter `{name}` is in two optimizer groups: each parameter belongs to exactly one");
            }
        }
        Ok(Self { groups, config, steps: 0, skipped: 0, moments: HashMap::new() })
    }

    pub fn groups(&self) -> &[ParamGroup] {
        &self.groups
    }

    pub fn config(&self) -> AdamWConfig {
        self.config
    }

    /// Optimizer steps taken so far.
    pub fn steps(&self) -> u64 {
        self.steps
    }

    /// Updates refused so far because a gradient held an inf or NaN.
    pub fn skipped_steps(&self) -> u64 {
        self.skipped
    }

    /// One update of every grouped parameter with its gradient in `grads` at learning rate `lr`.
    ///
    /// A gradient holding an inf or NaN would poison the moments for good, so
    /// such a step is skipped whole (as PyTorch's `GradScaler` does) and counted
    /// in [`AdamW::skipped_steps`].
    pub fn step(&mut self, params: &ParamStore, grads: &Gradients, lr: f64) -> Result<()> {
        if !grads.all_finite()? {
            self.skipped += 1;
            return Ok(());
        }
        self.steps += 1;
        for group in &self.groups {
            for name in &group.names {
                let var = params.get(name)?;
                let Some(grad) = grads.get(name) else {
                    bail!(
                        "no gradient for `{name}`: accumulate gradients for every parameter before the optimizer step"
                    );
                };
                let p = var.as_tensor().to_dtype(DType::F32)?;
                let moments = match self.moments.remove(name) {
                    Some(m) => m,
                    None => Moments::zeros_like(&p)?,
                };
                let decayed = scale(&p, 1.0 - lr * group.weight_decay)?;
                let (new_p, moments) = self.config.update(self.steps, lr, &decayed, grad, moments)?;
                var.set(&new_p.to_dtype(var.dtype())?)?;
                self.moments.insert(name.clone(), moments);
            }
        }
        Ok(())
    }

    /// What a checkpoint calls the two moments of parameter `name`:
    /// `exp_avg.<name>` and `exp_avg_sq.<name>`.
    pub fn moment_names(name: &str) -> [String; 2] {
        [format!("exp_avg.{name}"), format!("exp_avg_sq.{name}")]
    }

    /// The parameter whose moment [`AdamW::moment_names`] calls `moment`.
    pub fn param_of_moment(moment: &str) -> Option<&str> {
        ["exp_avg.", "exp_avg_sq."].into_iter().find_map(|prefix| moment.strip_prefix(prefix))
    }

    /// A checkpoint's moments (by [`AdamW::moment_names`]) as two maps by
    /// parameter name: `exp_avg`'s and `exp_avg_sq`'s.
    pub fn moments_by_param(optimizer: &HashMap<String, Tensor>) -> [HashMap<String, Tensor>; 2] {
        ["exp_avg.", "exp_avg_sq."].map(|prefix| {
            let named = optimizer.iter();
            named.filter_map(|(key, t)| Some((key.strip_prefix(prefix)?.to_string(), t.clone()))).collect()
        })
    }

    /// The moments as named tensors (see [`AdamW::moment_names`]), for a checkpoint.
    pub fn state_tensors(&self) -> BTreeMap<String, Tensor> {
        let mut out = BTreeMap::new();
        for (name, m) in &self.moments {
            let [exp_avg, exp_avg_sq] = Self::moment_names(name);
            out.insert(exp_avg, m.exp_avg.clone());
            out.insert(exp_avg_sq, m.exp_avg_sq.clone());
        }
        out
    }

    /// Restores the step count and the moments written by [`AdamW::state_tensors`].
    pub fn load_state(&mut self, steps: u64, tensors: &HashMap<String, Tensor>, params: &ParamStore) -> Result<()> {
        let mut moments = HashMap::new();
        let needed = 2 * self.groups.iter().map(|g| g.names.len()).sum::<usize>();
        for name in self.groups.iter().flat_map(|g| &g.names) {
            let param = params.get(name)?;
            let shape = param.shape().clone();
            let read = |key: &String| -> Result<Tensor> {
                let Some(t) = tensors.get(key) else {
                    // Not saved, or saved for another model: the count is what is known.
                    bail!(
                        "optimizer state has no `{key}`: it holds {} tensors, and this model's AdamW needs {needed} \
                         (`exp_avg` and `exp_avg_sq` of every parameter)",
                        tensors.len()
                    );
                };
                if t.shape() != &shape {
                    bail!("optimizer state `{key}` has shape {:?}, the parameter has {:?}", t.shape(), shape);
                }
                // Checkpoints are read onto the CPU; the moments live beside their parameter.
                t.to_dtype(DType::F32)?.to_device(param.device())
            };
            if steps > 0 {
                let [exp_avg, exp_avg_sq] = Self::moment_names(name);
                moments.insert(name.clone(), Moments { exp_avg: read(&exp_avg)?, exp_avg_sq: read(&exp_avg_sq)? });
            }
        }
        self.steps = steps;
        self.moments = moments;
        Ok(())
    }
}
