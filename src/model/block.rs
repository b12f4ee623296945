//! One pre-norm transformer block, and where its weights are when it runs.

use std::sync::Arc;

use candle_core::{Module, Result, Tensor};

use super::{CausalSelfAttention, GptConfig, Mlp, RmsNorm, RotaryCache, Weights};
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
}
