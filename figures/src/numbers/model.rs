//! A model config's shape and what a token of training costs in FLOPs, as
//! the profiling chapter counts it: 6N for the N weights that multiply an
//! activation, plus attention's 12·L·T·C when it is counted.

use std::path::Path;

use anyhow::{Context, Result};
use serde::Deserialize;

/// The parts of `configs/<size>.toml` a quoted number depends on.
#[derive(Deserialize)]
pub struct Config {
    pub seq_len: usize,
    pub batch_size: usize,
    pub model: Shape,
}

#[derive(Deserialize)]
pub struct Shape {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub num_layers: usize,
    pub intermediate_size: usize,
}

impl Config {
    /// `configs/{size}.toml` under `configs`.
    pub fn read(configs: &Path, size: &str) -> Result<Config> {
        let path = configs.join(format!("{size}.toml"));
        let text = std::fs::read_to_string(&path).with_context(|| format!("cannot read {}", path.display()))?;
        toml::from_str(&text).with_context(|| format!("{} is not a model config", path.display()))
    }
}

impl Shape {
    /// The weights of matrix products: each block's attention (4C²) and MLP
    /// (3CI) and the untied head (VC). The embedding is a lookup and the
    /// norms' scales multiply element by element, so neither counts.
    pub fn product_weights(&self) -> f64 {
        let (l, c, i, v) =
            (self.num_layers as f64, self.hidden_size as f64, self.intermediate_size as f64, self.vocab_size as f64);
        l * (4.0 * c * c + 3.0 * c * i) + v * c
    }

    /// Training FLOPs per token: 6N, forward and backward.
    pub fn flops_per_token(&self) -> f64 {
        6.0 * self.product_weights()
    }

    /// Attention's scores and weighted sum at sequence length `t`, forward
    /// and backward: 12·L·T·C per token.
    pub fn attention_flops_per_token(&self, t: usize) -> f64 {
        12.0 * (self.num_layers * t * self.hidden_size) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_small_config_costs_what_the_profiling_chapter_derives() {
        let configs = Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs");
        let small = Config::read(&configs, "small").unwrap().model;
        assert_eq!(small.product_weights(), 123_532_032.0);
        assert_eq!((small.flops_per_token() / 1e5).round(), 7412.0, "6N = 741.2 MFLOP");
        assert_eq!((small.attention_flops_per_token(1024) / 1e5).round(), 1132.0, "113.2 MFLOP at T 1024");
    }
}
