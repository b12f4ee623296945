//! The optimizer's settings; which parameters decay is exercise 8.

use serde::{Deserialize, Serialize};

use super::AdamWConfig;

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct OptimizerConfig {
    /// Decoupled weight decay for the parameters that decay (matrices and embeddings).
    pub weight_decay: f64,
    pub adamw: AdamWConfig,
}

impl Default for OptimizerConfig {
    fn default() -> Self {
        Self { weight_decay: 0.1, adamw: AdamWConfig::default() }
    }
}
