//! The groups an FSDP rank talks to: the ranks it shards across, and under
//! HYBRID_SHARD the ranks holding the same shards in the other groups.
//!
//! ```text
//!   HYBRID_SHARD, 4 ranks in shard groups of 2:
//!     shard groups    {0, 1} {2, 3}    all-gather parameters, reduce-scatter gradients
//!     replica groups  {0, 2} {1, 3}    all-reduce the reduced shard once per step
//! ```
//!
//! A shard group is a run of consecutive ranks (a node, as the launcher
//! numbers them), so the all-gathers and reduce-scatters of every unit stay
//! on the fast links, and only one all-reduce of a shard per step crosses
//! between groups.
//!
//! The unit step runs over the *parameter group*: the ranks a unit's
//! parameters are sharded across, the shard group under FULL_SHARD and
//! HYBRID_SHARD, this rank alone when a strategy keeps parameters whole.

use candle_core::{bail, Result};

use super::Prefetch;
use crate::distributed::{CommStats, ProcessGroup, SingleProcess, WithOverride};

pub struct FsdpGroups {
    world: Box<dyn ProcessGroup>,
    /// Under HYBRID_SHARD with more than one group: this rank's shard group
    /// and its replica group.
    hybrid: Option<(Box<dyn ProcessGroup>, Box<dyn ProcessGroup>)>,
    /// This rank alone: the parameter group of units kept whole, whose
    /// collectives move nothing and so count for nothing in the stats.
    alone: SingleProcess,
}

impl FsdpGroups {
    /// Shards across all of `world`, or, with `hybrid_group_size` g, across
    /// groups of g consecutive ranks replicated `world / g` times.
    pub fn new(world: Box<dyn ProcessGroup>, hybrid_group_size: Option<usize>) -> Result<Self> {
        let (rank, n) = (world.rank(), world.world_size());
        let hybrid = match hybrid_group_size {
            None => None,
            Some(g) if g == 0 || !n.is_multiple_of(g) => {
                bail!(
                    "HYBRID_SHARD's groups of {g} ranks do not divide the {n} ranks: use a group size that divides {n}"
                )
            }
            Some(g) if g == n => None, // one group: FULL_SHARD over the world
            Some(g) => Some((world.split(rank / g)?, world.split(rank % g)?)),
        };
        Ok(Self { world, hybrid, alone: SingleProcess::new() })
    }

    /// Every rank of the job.
    pub fn world(&self) -> &dyn ProcessGroup {
        self.world.as_ref()
    }

    /// The ranks this rank's units are sharded across.
    pub fn shard(&self) -> &dyn ProcessGroup {
        self.hybrid.as_ref().map_or(self.world.as_ref(), |(shard, _)| shard.as_ref())
    }

    /// Makes the shard group's all-gather prefetch as `prefetch` is told.
    pub fn prefetch_with(&mut self, prefetch: Prefetch) {
        let shard = match &mut self.hybrid {
            Some((shard, _)) => shard,
            None => &mut self.world,
        };
        let plain = std::mem::replace(shard, Box::new(SingleProcess::new()));
        *shard = Box::new(WithOverride::new(plain, prefetch));
    }

    /// The ranks a unit's parameters are sharded across: the shard group when
    /// `params_sharded`, otherwise this rank alone.
    pub fn params(&self, params_sharded: bool) -> &dyn ProcessGroup {
        match params_sharded {
            true => self.shard(),
            false => &self.alone,
        }
    }

    /// The ranks holding the same shards as this one in the other groups,
    /// under HYBRID_SHARD with more than one group.
    pub fn replicas(&self) -> Option<&dyn ProcessGroup> {
        self.hybrid.as_ref().map(|(_, replicas)| replicas.as_ref())
    }

    /// Which replica of the sharded model this rank belongs to: 0 without HYBRID_SHARD.
    pub fn replica(&self) -> usize {
        self.replicas().map_or(0, ProcessGroup::rank)
    }

    /// What this rank has sent through all its groups.
    pub fn stats(&self) -> CommStats {
        let hybrid = self.hybrid.iter().flat_map(|(shard, replicas)| [shard.stats(), replicas.stats()]);
        std::iter::once(self.world.stats()).chain(hybrid).sum()
    }
}
