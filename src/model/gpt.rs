//! The whole model: embeddings, blocks, final norm and head. Its forward pass is exercise 7.

use candle_core::backprop::GradStore;
use candle_core::{bail, Result, Tensor};
use candle_nn::Embedding;

use super::{Block, GptConfig, Linear, ParamStore, RmsNorm, RotaryCache, Weights};
use crate::autograd::Recompute;

/// A Llama-style GPT: `embed_tokens` → `blocks` → `norm` → `lm_head`.
///
/// The forward pass is exercise 7 (`exercises/phase1_model/ex07_gpt_forward.rs`).
#[derive(Debug, Clone)]
pub struct Gpt {
    config: GptConfig,
    pub embed_tokens: Embedding,
    pub blocks: Vec<Block>,
    pub norm: RmsNorm,
    pub lm_head: Linear,
    /// Recompute each block during backward instead of keeping its activations.
    pub activation_checkpointing: bool,
}

impl Gpt {
    /// Builds the model around `params`, which must match `config`.
    pub fn new(config: &GptConfig, params: &ParamStore) -> Result<Self> {
        config.validate()?;
        params.check_matches(config)?;
        let device = params.device()?;
        let rotary = RotaryCache::new(config.head_dim(), config.max_seq_len, config.rope_theta, &device)?;
        let blocks =
            (0..config.num_layers).map(|layer| Block::new(config, params, layer, &rotary)).collect::<Result<_>>()?;
        Self::assemble(config, Outer::new(config, params)?, blocks)
    }

    /// A model from parts built elsewhere.
    pub fn assemble(config: &GptConfig, outer: Outer, blocks: Vec<Block>) -> Result<Self> {
        config.validate()?;
        if blocks.len() != config.num_layers {
            bail!("{} blocks for a model of {} layers", blocks.len(), config.num_layers);
        }
        let Outer { embed_tokens, norm, lm_head } = outer;
        Ok(Self { config: config.clone(), embed_tokens, blocks, norm, lm_head, activation_checkpointing: false })
    }

    /// Turns activation checkpointing of every block on or off.
    pub fn with_activation_checkpointing(mut self, on: bool) -> Self {
        self.activation_checkpointing = on;
        self
    }

    /// Runs every block through the recompute engine, so that backward can
    /// be taken one block at a time ([`Recompute::backward_through`]): DDP
    /// starts each block's all-reduce between two of them. Blocks keep their
    /// graph, so nothing is recomputed unless activation checkpointing was on.
    pub fn with_blockwise_backward(mut self) -> Self {
        if !self.activation_checkpointing {
            self.blocks = self.blocks.into_iter().map(Block::keeping_graph).collect();
            self.activation_checkpointing = true;
        }
        self
    }

    pub fn config(&self) -> &GptConfig {
        &self.config
    }
}

/// The modules around the blocks: the embedding before them, the final norm
/// and the head after. FSDP keeps them together in its root unit.
#[derive(Debug, Clone)]
pub struct Outer {
    pub embed_tokens: Embedding,
    pub norm: RmsNorm,
    pub lm_head: Linear,
}

impl Outer {
    pub fn new(config: &GptConfig, weights: &dyn Weights) -> Result<Self> {
        Ok(Self {
            embed_tokens: Embedding::new(weights.tensor("model.embed_tokens.weight")?, config.hidden_size),
            norm: RmsNorm::new(weights.tensor("model.norm.weight")?, config.norm_eps),
            lm_head: lm_head(config, weights)?,
        })
    }
}

/// The head: its own weight, or tied, the embedding's (V, C) tensor itself,
/// so that the one gradient sums what both uses send back.
pub fn lm_head(config: &GptConfig, weights: &dyn Weights) -> Result<Linear> {
    match config.tie_word_embeddings {
        true => Ok(Linear::new(weights.tensor("model.embed_tokens.weight")?, None)),
        false => weights.linear("lm_head", false),
    }
}

/// What [`Gpt::forward`] returns.
#[derive(Debug)]
pub struct ForwardPass {
    /// (B, T, V) scores for the token after each position.
    pub logits: Tensor,
    /// The mean next-token cross-entropy, an f32 scalar; `None` without labels.
    pub loss: Option<Tensor>,
    /// The blocks run under activation checkpointing, to replay in [`ForwardPass::backward`].
    pub recompute: Recompute,
}

impl ForwardPass {
    /// The loss as a number; an error when the forward ran without labels.
    pub fn loss_value(&self) -> Result<f64> {
        let Some(loss) = &self.loss else {
            bail!("the forward ran without labels, so it has no loss: call forward with labels");
        };
        Ok(loss.to_scalar::<f32>()? as f64)
    }

    /// Gradients of the loss for every parameter, recomputing checkpointed
    /// blocks; for a batch split across threads, each part's on its thread.
    pub fn backward(&self) -> Result<GradStore> {
        let Some(loss) = &self.loss else {
            bail!("backward needs a loss: call forward with labels");
        };
        self.recompute.gradients_of(loss)
    }
}
