//! One pre-norm transformer block, and where its weights are when it runs.

use std::sync::Arc;

use candle_core::backprop::GradStore;
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
/// `recompute.checkpoint(block, &x)`, whoever keeps its weights.
///
/// In one process and under DDP the weights are resident. Under FSDP a block
/// holds only a way to make them whole ([`OnDemand`]): its unit is gathered
/// before each forward and freed after, and its gradient reduce-scattered
/// after its backward, around the same forward.
#[derive(Clone)]
pub struct Block {
    weights: BlockWeights,
    /// Under the recompute engine, keep the forward's graph instead of recomputing it.
    keeps_graph: bool,
}

#[derive(Clone)]
enum BlockWeights {
    Resident(Arc<Layers>),
    OnDemand(Arc<dyn OnDemand>),
}

/// A block whose weights are made whole only while it runs: the hooks FSDP
/// implements around the model's own forward and backward.
pub trait OnDemand: Send + Sync {
    /// The block's layers on weights made whole for one forward (gathered).
    fn gather(&self) -> Result<Layers>;
    /// The forward just run kept no graph: the gathered weights can go.
    fn release(&self);
    /// `grads` come from one replay of this block's forward and backward:
    /// take the block's weight gradient out of them and hand it on.
    fn take_gradient(&self, grads: &mut GradStore) -> Result<()>;
}

impl Block {
    /// Block `layer` of a model, its weights read from `params` and kept.
    pub fn new(config: &GptConfig, params: &dyn Weights, layer: usize, rotary: &RotaryCache) -> Result<Self> {
        let layers = Layers::new(config, params, layer, rotary)?;
        Ok(Self { weights: BlockWeights::Resident(Arc::new(layers)), keeps_graph: false })
    }

    /// A block whose weights `source` makes whole each time it runs.
    pub fn on_demand(source: Arc<dyn OnDemand>) -> Self {
        Self { weights: BlockWeights::OnDemand(source), keeps_graph: false }
    }

    /// This block, run through the recompute engine with its graph kept:
    /// backward visits it alone but recomputes nothing (see `Gpt::with_blockwise_backward`).
    pub fn keeping_graph(self) -> Self {
        Self { keeps_graph: true, ..self }
    }
}

impl std::fmt::Debug for Block {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.weights {
            BlockWeights::Resident(layers) => layers.fmt(f),
            BlockWeights::OnDemand(_) => f.write_str("Block(weights gathered on demand)"),
        }
    }
}

impl Module for Block {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        match &self.weights {
            BlockWeights::Resident(layers) => layers.forward(x),
            BlockWeights::OnDemand(source) => source.gather()?.forward(x),
        }
    }
}

impl Checkpointed for Block {
    fn after_forward(&self) {
        if let BlockWeights::OnDemand(source) = &self.weights {
            source.release();
        }
    }

    fn after_backward(&self, grads: &mut GradStore) -> Result<()> {
        match &self.weights {
            BlockWeights::Resident(_) => Ok(()),
            BlockWeights::OnDemand(source) => source.take_gradient(grads),
        }
    }

    fn keeps_graph(&self) -> bool {
        self.keeps_graph
    }
}
