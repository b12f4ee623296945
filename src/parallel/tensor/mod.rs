//! Tensor parallelism, Megatron style: one layer's weights split across the
//! ranks, each computing its part of every token. The collectives enter
//! autograd as Megatron's conjugate operators f and g, so a split block is
//! an ordinary module: one forward, and candle's backward. The MLP's split,
//! f and g are exercise 20 (`exercises/phase4_under_the_hood/ex20_tensor_parallel_mlp.rs`);
//! a whole block assembled from them is exercise 23
//! (`exercises/phase4_under_the_hood/ex23_tensor_parallel_block.rs`), which
//! the [`MeshTrainer`](crate::parallel::MeshTrainer) (`train --tp T`) runs
//! every block with ([`SplitBlock`]); the same block with the activations
//! outside the matrices cut along the sequence is exercise 27
//! (`train --tp T --sequence-parallel`).

mod sequence;
mod shards;
mod split_block;
pub use sequence::{gather_sequence, join_tokens, own_tokens, scatter_sequence, split_tokens};
pub use shards::{moments_part, part_of, ShardCuts};
pub use split_block::{BlockStep, SplitBlock};

use candle_core::{bail, Result, Tensor};

use crate::model::{layer_of, CausalSelfAttention, GptConfig, ParamStore, RmsNorm, RotaryCache, Weights};

/// One rank's shard of a SwiGLU MLP (`down(silu(gate x) * up x)`) split
/// across N ranks along the intermediate dimension I; its `partial` and
/// `forward` are exercise 20.
#[derive(Debug, Clone)]
pub struct TensorParallelMlp {
    /// This rank's part of gate_proj's (I, C) weight: (I/N, C).
    pub gate_proj: Tensor,
    /// This rank's part of up_proj's (I, C) weight: (I/N, C).
    pub up_proj: Tensor,
    /// This rank's part of down_proj's (C, I) weight: (C, I/N).
    pub down_proj: Tensor,
}

/// One rank's shard of a decoder block `h = x + attn(norm₁(x))`,
/// `y = h + mlp(norm₂(h))`: attention split by heads (its rows of q, k and v,
/// its columns of o), the MLP by hidden units (exercise 20's split), the two
/// norms whole on every rank. Each shard is a variable of its own, named as
/// the whole parameter is. Its forward is exercise 23 (27 under sequence
/// parallelism).
pub struct TensorParallelBlock {
    /// norm₁, the same on every rank.
    pub input_layernorm: RmsNorm,
    /// norm₂, the same on every rank.
    pub post_attention_layernorm: RmsNorm,
    /// This rank's hidden units of the MLP (exercise 20's split).
    pub mlp: TensorParallelMlp,
    attention: CausalSelfAttention,
    params: ParamStore,
}

impl TensorParallelBlock {
    /// Rank `rank`'s shard of block `layer` of the model `params` holds,
    /// split across `world` ranks. Heads, key/value heads and the MLP's width
    /// must divide by `world`; biases are not supported.
    pub fn shard(config: &GptConfig, params: &ParamStore, layer: usize, rank: usize, world: usize) -> Result<Self> {
        config.validate()?;
        params.check_holds(config, |name| layer_of(name) == Some(layer))?;
        let (heads, kv_heads, d) = (config.num_heads, config.kv_heads(), config.head_dim());
        if config.bias {
            bail!("tensor parallelism here takes a model without biases: a row-parallel layer's bias would be added once per rank");
        }
        if rank >= world {
            bail!("rank {rank} of {world}: ranks are numbered 0 to {}", world.saturating_sub(1));
        }
        if !heads.is_multiple_of(world) || !kv_heads.is_multiple_of(world) {
            bail!(
                "{heads} heads and {kv_heads} key/value heads do not split evenly across {world} ranks: \
                 use a world size that divides both"
            );
        }
        let p = format!("model.layers.{layer}");
        let whole = |name: &str| params.tensor(&format!("{p}.{name}.weight"));
        // Head h reads rows h·D..(h+1)·D of q (and of k, v for its key/value head) and the same columns of o.
        let rows_of_heads = |t: Tensor, per_rank: usize| t.narrow(0, rank * per_rank * d, per_rank * d);
        let mlp = TensorParallelMlp::shard(
            &whole("mlp.gate_proj")?,
            &whole("mlp.up_proj")?,
            &whole("mlp.down_proj")?,
            rank,
            world,
        )?;
        let shards = ParamStore::from_tensors([
            (format!("{p}.input_layernorm.weight"), whole("input_layernorm")?),
            (format!("{p}.post_attention_layernorm.weight"), whole("post_attention_layernorm")?),
            (format!("{p}.self_attn.q_proj.weight"), rows_of_heads(whole("self_attn.q_proj")?, heads / world)?),
            (format!("{p}.self_attn.k_proj.weight"), rows_of_heads(whole("self_attn.k_proj")?, kv_heads / world)?),
            (format!("{p}.self_attn.v_proj.weight"), rows_of_heads(whole("self_attn.v_proj")?, kv_heads / world)?),
            (
                format!("{p}.self_attn.o_proj.weight"),
                whole("self_attn.o_proj")?.narrow(1, rank * heads / world * d, heads / world * d)?,
            ),
            (format!("{p}.mlp.gate_proj.weight"), mlp.gate_proj),
            (format!("{p}.mlp.up_proj.weight"), mlp.up_proj),
            (format!("{p}.mlp.down_proj.weight"), mlp.down_proj),
        ])?;
        let device = shards.get(&format!("{p}.input_layernorm.weight"))?.device().clone();
        let rotary = RotaryCache::new(d, config.max_seq_len, config.rope_theta, &device)?;
        Self::of_shards(config, shards, layer, world, &rotary)
    }

    /// Block `layer` on `shards`, a rank's shards of it already cut across
    /// `world` ranks (as [`shard`](Self::shard) cuts them), by the whole
    /// model's names: the block's parameters are those very variables.
    pub fn of_shards(
        config: &GptConfig,
        shards: ParamStore,
        layer: usize,
        world: usize,
        rotary: &RotaryCache,
    ) -> Result<Self> {
        let p = format!("model.layers.{layer}");
        let weight = |name: &str| shards.tensor(&format!("{p}.{name}.weight"));
        let linear = |name: &str| shards.linear(&format!("{p}.{name}"), false);
        let norm = |name: &str| Ok::<_, candle_core::Error>(RmsNorm::new(weight(name)?, config.norm_eps));
        Ok(Self {
            input_layernorm: norm("input_layernorm")?,
            post_attention_layernorm: norm("post_attention_layernorm")?,
            attention: CausalSelfAttention::new(
                [
                    linear("self_attn.q_proj")?,
                    linear("self_attn.k_proj")?,
                    linear("self_attn.v_proj")?,
                    linear("self_attn.o_proj")?,
                ],
                (config.num_heads / world, config.kv_heads() / world),
                rotary.clone(),
            ),
            mlp: TensorParallelMlp {
                gate_proj: weight("mlp.gate_proj")?,
                up_proj: weight("mlp.up_proj")?,
                down_proj: weight("mlp.down_proj")?,
            },
            params: shards,
        })
    }

    /// This rank's heads on `x` (B, T, C), through its columns of o_proj,
    /// with no communication: its part of attention's output, (B, T, C).
    /// The parts of all ranks sum to the whole attention's output.
    pub fn attention_partial(&self, x: &Tensor) -> Result<Tensor> {
        candle_core::Module::forward(&self.attention, x)
    }

    /// This rank's parameters: the shards and the two norms, by the whole
    /// model's names. [`crate::autograd::Gradients::from_store`] reads their gradients.
    pub fn params(&self) -> &ParamStore {
        &self.params
    }
}
