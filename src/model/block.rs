//! One pre-norm transformer block, and where its weights are when it runs.

use std::sync::Arc;

use candle_core::{Module, Result, Tensor};

use super::{CausalSelfAttention, GptConfig, Linear, Mlp, RmsNorm, RotaryCache, Weights};
use crate::autograd::Checkpointed;

/// `h = x + attn(norm₁(x))`, then `out = h + mlp(norm₂(h))`; (B, T, C) in and out.
#[derive(Debug, Clone)]
pub struct Layers {
    input_layernorm: RmsNorm,
    self_attn: CausalSelfAttention,
    post_attention_layernorm: RmsNorm,
    mlp: Mlp,
}

impl Layers {
    /// Block `layer` of a model, reading its weights from `params`.
    pub fn new(config: &GptConfig, params: &dyn Weights, layer: usize, rotary: &RotaryCache) -> Result<Self> {
        let p = format!("model.layers.{layer}");
        let linear = |name: &str| params.linear(&format!("{p}.{name}"), config.bias);
        let norm = |name: &str| -> Result<RmsNorm> {
            Ok(RmsNorm::new(params.tensor(&format!("{p}.{name}.weight"))?, config.norm_eps))
        };
        let self_attn = CausalSelfAttention::new(
            [
                linear("self_attn.q_proj")?,
                linear("self_attn.k_proj")?,
                linear("self_attn.v_proj")?,
                linear("self_attn.o_proj")?,
            ],
            (config.num_heads, config.kv_heads()),
            rotary.clone(),
        );
        let mlp = Mlp::new(linear("mlp.gate_proj")?, linear("mlp.up_proj")?, linear("mlp.down_proj")?);
        Ok(Self {
            input_layernorm: norm("input_layernorm")?,
            self_attn,
            post_attention_layernorm: norm("post_attention_layernorm")?,
            mlp,
        })
    }
}

impl Layers {
    /// Every weight (and bias) of the block.
    pub fn weights(&self) -> Vec<Tensor> {
        let norms = [&self.input_layernorm, &self.post_attention_layernorm].map(|norm| norm.weight.clone());
        let mlp = [&self.mlp.gate_proj, &self.mlp.up_proj, &self.mlp.down_proj];
        let linears = self.self_attn.projections().into_iter().chain(mlp);
        norms.into_iter().chain(linears.flat_map(Linear::tensors)).collect()
    }
}

impl Module for Layers {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let h = (x + self.self_attn.forward(&self.input_layernorm.forward(x)?)?)?;
        &h + self.mlp.forward(&self.post_attention_layernorm.forward(&h)?)?
    }
}

/// A block as the model's forward pass sees it: `block.forward(&x)` or
/// `recompute.checkpoint(block, &x)`.
#[derive(Debug, Clone)]
pub struct Block {
    layers: Arc<Layers>,
    /// Under the recompute engine, keep the forward's graph instead of recomputing it.
    keeps_graph: bool,
}

impl Block {
    /// Block `layer` of a model, its weights read from `params` and kept.
    pub fn new(config: &GptConfig, params: &dyn Weights, layer: usize, rotary: &RotaryCache) -> Result<Self> {
        let layers = Layers::new(config, params, layer, rotary)?;
        Ok(Self { layers: Arc::new(layers), keeps_graph: false })
    }

    /// This block, run through the recompute engine with its graph kept:
    /// backward visits it alone but recomputes nothing (see `Gpt::with_blockwise_backward`).
    pub fn keeping_graph(self) -> Self {
        Self { keeps_graph: true, ..self }
    }
}

impl Module for Block {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.layers.forward(x)
    }
}

impl Checkpointed for Block {
    fn keeps_graph(&self) -> bool {
        self.keeps_graph
    }

    fn variables(&self) -> Option<Vec<Tensor>> {
        Some(self.layers.weights())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use candle_core::{Device, Var};

    use super::*;
    use crate::autograd::Recompute;
    use crate::model::init_params;

    /// Under activation checkpointing a block's replay hands on its
    /// weights' gradients and its input's, nothing more: candle's backward
    /// also leaves a gradient for every untracked operand it meets (the
    /// rotary tables, the causal mask), as large as the activations, which
    /// would otherwise pile up block after block and undo the saving.
    #[test]
    fn a_replayed_block_hands_on_only_its_weights_gradients() -> Result<()> {
        let config = GptConfig {
            vocab_size: 64,
            hidden_size: 32,
            num_layers: 3,
            num_heads: 4,
            num_kv_heads: None,
            intermediate_size: 64,
            max_seq_len: 16,
            rope_theta: 1e4,
            norm_eps: 1e-5,
            bias: false,
            tie_word_embeddings: false,
        };
        let device = Device::Cpu;
        let params = init_params(&config, 3, &device)?;
        let rotary = RotaryCache::new(config.head_dim(), config.max_seq_len, config.rope_theta, &device)?;
        let blocks = (0..config.num_layers)
            .map(|layer| Block::new(&config, &params, layer, &rotary))
            .collect::<Result<Vec<_>>>()?;
        let x = Var::from_tensor(&Tensor::randn(0f32, 1.0, (2, 16, config.hidden_size), &device)?)?;
        let mut tape = Recompute::default();
        let mut h = x.as_tensor().clone();
        for block in &blocks {
            h = tape.checkpoint(block, &h)?;
        }
        let grads = tape.gradients_of(&h.sqr()?.sum_all()?)?;
        let weights: HashSet<_> = blocks.iter().flat_map(|b| b.layers.weights()).map(|w| w.id()).collect();
        assert!(weights.iter().all(|id| grads.get_id(*id).is_some()), "every weight has its gradient");
        // The input's gradient, and the one untracked operand of the product
        // that passes it to the input (the gradient itself), are all else.
        let others = grads.get_ids().filter(|id| !weights.contains(id)).count();
        assert!(others <= 2, "{others} gradients besides the weights' are kept after backward");
        Ok(())
    }
}
