//! The model's shape, as one plain struct.

use candle_core::{bail, Result};
use serde::{Deserialize, Serialize};

use super::{param_specs, ParamKind};

/// The shape of a Llama-style GPT.
///
/// `hidden_size` is C, `num_heads` is H, `hidden_size / num_heads` is the head
/// dimension D, `intermediate_size` is the width of the SwiGLU MLP.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GptConfig {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    /// Key/value heads for grouped-query attention: each serves
    /// `num_heads / kv_heads` query heads. `None` means one per query head.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub num_kv_heads: Option<usize>,
    pub intermediate_size: usize,
    /// Longest sequence the rotary cache covers.
    pub max_seq_len: usize,
    /// Base of the rotary frequencies.
    pub rope_theta: f64,
    /// The epsilon inside RMSNorm's square root.
    pub norm_eps: f64,
    /// Whether the linear layers inside the blocks carry a bias.
    pub bias: bool,
    /// Whether the head reuses the embedding table as its weight (`lm_head = embed_tokensᵀ`).
    #[serde(default)]
    pub tie_word_embeddings: bool,
}

impl GptConfig {
    /// The head dimension D = C / H.
    pub fn head_dim(&self) -> usize {
        self.hidden_size / self.num_heads
    }

    /// The number of key/value heads: `num_kv_heads`, or H without grouping.
    pub fn kv_heads(&self) -> usize {
        self.num_kv_heads.unwrap_or(self.num_heads)
    }

    /// The FLOPs one token costs a training step, forward and backward, as
    /// model FLOPs utilisation (MFU) counts them: 6 per weight of a matrix
    /// product (2 forward, 4 backward; the embedding is a lookup, a tied
    /// head a product), plus attention's 12·L·T·C for sequences of
    /// `seq_len` tokens (QKᵀ and the weighted sum of V, 2·T·C each per layer
    /// forward, three times that with backward, counted over the whole
    /// T × T as PaLM and nanoGPT count it).
    pub fn training_flops_per_token(&self, seq_len: usize) -> f64 {
        let weights: usize = param_specs(self)
            .iter()
            .filter(|spec| spec.kind == ParamKind::LinearWeight)
            .map(|spec| spec.shape.elem_count())
            .sum();
        let tied_head = if self.tie_word_embeddings { self.vocab_size * self.hidden_size } else { 0 };
        6.0 * (weights + tied_head) as f64 + 12.0 * (self.num_layers * seq_len * self.hidden_size) as f64
    }

    /// Checks that the shape is one the model can be built with.
    pub fn validate(&self) -> Result<()> {
        let positive = [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("num_layers", self.num_layers),
            ("num_heads", self.num_heads),
            ("intermediate_size", self.intermediate_size),
            ("max_seq_len", self.max_seq_len),
        ];
        if let Some((name, _)) = positive.iter().find(|(_, v)| *v == 0) {
            bail!("model config: {name} must be positive");
        }
        if !self.hidden_size.is_multiple_of(self.num_heads) {
            bail!(
                "model config: hidden_size {} is not divisible by num_heads {}; pick sizes where C = H * D",
                self.hidden_size,
                self.num_heads
            );
        }
        let kv_heads = self.kv_heads();
        if kv_heads == 0 || !self.num_heads.is_multiple_of(kv_heads) {
            bail!(
                "model config: num_kv_heads {kv_heads} must divide num_heads {}: each key/value head serves a \
                 whole group of query heads",
                self.num_heads
            );
        }
        if !self.head_dim().is_multiple_of(2) {
            bail!("model config: the head dimension {} must be even for rotary embeddings", self.head_dim());
        }
        for (name, value) in [("norm_eps", self.norm_eps), ("rope_theta", self.rope_theta)] {
            if !(value.is_finite() && value > 0.0) {
                bail!("model config: {name} must be a positive number, not {value}");
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// GPT-2 124M's shape as `configs/small.toml` has it, counted by hand:
    /// N = L(4C² + 3CI) + VC = 12 · 7,077,888 + 38,597,376 = 123,532,032
    /// weights in products (the untied head, not the embedding, no norm
    /// scales or biases), attention 12·L·T·C at T 256; a tied head makes the
    /// embedding table a product instead.
    #[test]
    fn training_flops_per_token_of_gpt2_small() {
        let mut small = GptConfig {
            vocab_size: 50257,
            hidden_size: 768,
            num_layers: 12,
            num_heads: 12,
            num_kv_heads: None,
            intermediate_size: 2048,
            max_seq_len: 1024,
            rope_theta: 1e4,
            norm_eps: 1e-5,
            bias: true,
            tie_word_embeddings: false,
        };
        let attention = 12.0 * 12.0 * 256.0 * 768.0;
        assert_eq!(small.training_flops_per_token(256), 6.0 * 123_532_032.0 + attention);
        small.tie_word_embeddings = true;
        assert_eq!(
            small.training_flops_per_token(256),
            6.0 * 123_532_032.0 + attention,
            "a tied head is still a product"
        );
        small.num_kv_heads = Some(4);
        let fewer_kv = 12.0 * 2.0 * 768.0 * (768.0 - 256.0);
        assert_eq!(small.training_flops_per_token(256), 6.0 * (123_532_032.0 - fewer_kv) + attention);
    }
}
