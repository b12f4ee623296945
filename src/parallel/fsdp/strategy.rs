//! Sharding strategies, and what each one shards: exercise 12 maps one to the other.

use std::fmt;
use std::str::FromStr;

use candle_core::{bail, Result};
use serde::{Deserialize, Serialize};

/// PyTorch FSDP's sharding strategies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ShardingStrategy {
    /// Shard parameters, gradients and optimizer state (ZeRO stage 3).
    FullShard,
    /// Shard gradients and optimizer state; keep parameters whole (ZeRO stage 2).
    ShardGradOp,
    /// Shard nothing: every rank holds everything (DDP).
    NoShard,
    /// FULL_SHARD within a node, replicated across nodes.
    HybridShard,
}

impl ShardingStrategy {
    pub const ALL: [ShardingStrategy; 4] = [Self::FullShard, Self::ShardGradOp, Self::NoShard, Self::HybridShard];

    /// The name used on the command line and in PyTorch (lower case).
    pub fn name(self) -> &'static str {
        match self {
            Self::FullShard => "full_shard",
            Self::ShardGradOp => "shard_grad_op",
            Self::NoShard => "no_shard",
            Self::HybridShard => "hybrid_shard",
        }
    }
}

impl fmt::Display for ShardingStrategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for ShardingStrategy {
    type Err = candle_core::Error;

    fn from_str(s: &str) -> Result<Self> {
        Self::ALL.into_iter().find(|strategy| strategy.name() == s.to_ascii_lowercase()).ok_or_else(|| {
            candle_core::Error::Msg(format!(
                "unknown sharding strategy `{s}`: use full_shard, shard_grad_op, no_shard or hybrid_shard"
            ))
        })
    }
}

/// What a strategy divides across the ranks (each rank keeps 1/N of it)
/// instead of replicating it on every rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardingPlan {
    /// The model's parameters, between uses: gathered for each unit's forward
    /// and backward, freed after.
    pub params: bool,
    /// The gradients: each rank keeps the reduced gradient of its shard only.
    pub grads: bool,
    /// AdamW's moments and the f32 master weights: each rank updates its shard only.
    pub optimizer_state: bool,
    /// Shards live within one node and are replicated across nodes (HYBRID_SHARD).
    pub replicate_across_nodes: bool,
}

impl ShardingPlan {
    /// The plan of ZeRO stage `stage` (0 is DDP).
    pub fn zero(stage: u8) -> Self {
        Self { params: stage >= 3, grads: stage >= 2, optimizer_state: stage >= 1, replicate_across_nodes: false }
    }

    /// The ZeRO stage this plan is: 0 (nothing sharded) to 3 (everything).
    pub fn zero_stage(&self) -> u8 {
        [self.optimizer_state, self.grads, self.params].iter().filter(|&&sharded| sharded).count() as u8
    }

    /// The plan in words, e.g. "ZeRO stage 2 (gradients and optimizer state sharded)".
    pub fn describe(&self) -> String {
        let sharded: Vec<&str> =
            [(self.params, "parameters"), (self.grads, "gradients"), (self.optimizer_state, "optimizer state")]
                .into_iter()
                .filter_map(|(sharded, what)| sharded.then_some(what))
                .collect();
        let what = match sharded.as_slice() {
            [] => "nothing sharded".to_string(),
            [one] => format!("{one} sharded"),
            [first @ .., last] => format!("{} and {last} sharded", first.join(", ")),
        };
        // The groups are a node's ranks by default, or --hybrid-group-size's.
        let nodes =
            if self.replicate_across_nodes { " within each shard group, replicated across the groups" } else { "" };
        format!("ZeRO stage {} ({what}{nodes})", self.zero_stage())
    }

    /// Fails unless the plan is one of ZeRO's stages: sharding parameters
    /// needs sharded gradients, and those need sharded optimizer state.
    pub fn validate(&self) -> Result<()> {
        let stage = Self { replicate_across_nodes: self.replicate_across_nodes, ..Self::zero(self.zero_stage()) };
        if *self != stage {
            bail!(
                "{self:?} is not a ZeRO stage: each rank can only shard what it updates (optimizer state), \
                 then the gradients it needs for that, then the parameters"
            );
        }
        Ok(())
    }
}
