//! Which windows each rank reads, epoch after epoch: PyTorch's `DistributedSampler`.
//!
//! Under data parallelism every rank must see different data, or W ranks do
//! the work of one. Each epoch, every rank shuffles the window numbers
//! `0..N` the same way (a ChaCha8 generator seeded with `seed`, on stream
//! `epoch`), so all ranks agree on one order without talking. The order is cut
//! to a multiple of the world size W, dropping the last `N % W` windows (a
//! different few each epoch), so every rank gets the same number of windows and
//! no rank waits at an all-reduce for a batch that never comes. Rank r then
//! takes positions `r, r+W, r+2W, ...` of the order.
//!
//! So within an epoch the ranks' windows are disjoint and together cover every
//! kept window once; the next epoch reshuffles. The sampler's position,
//! [`SamplerState`], is saved in a checkpoint so a resumed run reads on
//! exactly where the interrupted one stopped, on any number of ranks: after
//! c windows each, W ranks have read positions `0..c·W` of the epoch's order
//! between them, and W' ranks that have read `c·W / W'` each stand at the same
//! point, so the next global batch is the same windows.

use candle_core::{bail, Result};
use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

/// Where a sampler stands: the epoch, and how many of this rank's windows of
/// that epoch it has handed out, as one of `world_size` ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct SamplerState {
    pub epoch: u64,
    pub cursor: usize,
    /// The ranks the cursor counts for; absent from checkpoints that did not
    /// record it, which restore on as many ranks as restore them.
    #[serde(default)]
    pub world_size: Option<usize>,
}

impl SamplerState {
    /// Window `cursor` of epoch `epoch`, counted for each of `world_size` ranks.
    pub fn at(epoch: u64, cursor: usize, world_size: usize) -> Self {
        Self { epoch, cursor, world_size: Some(world_size) }
    }
}

/// Hands one rank its share of the windows, batch after batch, across epochs.
#[derive(Debug, Clone)]
pub struct DistributedSampler {
    num_windows: usize,
    world_size: usize,
    rank: usize,
    seed: u64,
    state: SamplerState,
    /// This rank's windows in `state.epoch`, in the order they are handed out.
    order: Vec<usize>,
}

impl DistributedSampler {
    /// A sampler for `rank` of `world_size` over windows `0..num_windows`,
    /// starting at epoch 0. Every rank must pass the same `seed`.
    pub fn new(num_windows: usize, world_size: usize, rank: usize, seed: u64) -> Result<Self> {
        if world_size == 0 {
            bail!("world_size must be at least 1");
        }
        if rank >= world_size {
            bail!("rank {rank} is out of range for world_size {world_size}: ranks are 0..{world_size}");
        }
        if num_windows < world_size {
            bail!(
                "{num_windows} windows cannot be shared among {world_size} ranks: \
                 each rank needs at least one; use more text or a smaller seq_len"
            );
        }
        let mut sampler =
            Self { num_windows, world_size, rank, seed, state: SamplerState::at(0, 0, world_size), order: Vec::new() };
        sampler.order = sampler.epoch_order(0);
        Ok(sampler)
    }

    /// This rank's windows in `epoch`, in order: positions `rank, rank+W, ...`
    /// of that epoch's shuffled order, cut to a multiple of W.
    pub fn epoch_order(&self, epoch: u64) -> Vec<usize> {
        let mut all: Vec<usize> = (0..self.num_windows).collect();
        let mut rng = ChaCha8Rng::seed_from_u64(self.seed);
        rng.set_stream(epoch);
        all.shuffle(&mut rng);
        all.truncate(self.windows_per_rank() * self.world_size);
        all.into_iter().skip(self.rank).step_by(self.world_size).collect()
    }

    /// The next `batch_size` windows of this rank, moving into the next epoch
    /// (and its new order) when this one runs out.
    pub fn next_batch(&mut self, batch_size: usize) -> Vec<usize> {
        let mut batch = Vec::with_capacity(batch_size);
        while batch.len() < batch_size {
            if self.state.cursor == self.order.len() {
                self.state = SamplerState::at(self.state.epoch + 1, 0, self.world_size);
                self.order = self.epoch_order(self.state.epoch);
            }
            let take = (batch_size - batch.len()).min(self.order.len() - self.state.cursor);
            batch.extend_from_slice(&self.order[self.state.cursor..self.state.cursor + take]);
            self.state.cursor += take;
        }
        batch
    }

    /// The position to save in a checkpoint.
    pub fn state(&self) -> SamplerState {
        self.state
    }

    /// Moves to a saved position: the next global batch is the one that
    /// followed it, whatever the world size it was saved with.
    pub fn restore(&mut self, state: SamplerState) -> Result<()> {
        let cursor = match state.world_size {
            Some(saved) if saved != self.world_size => {
                let read = state.cursor * saved; // the windows of this epoch the saved ranks read together
                if !read.is_multiple_of(self.world_size) {
                    bail!(
                        "sampler state {state:?}: {saved} ranks had read {read} windows of epoch {}, which {} ranks \
                         cannot have read in equal shares: resume with a world size that divides the global batch",
                        state.epoch,
                        self.world_size
                    );
                }
                read / self.world_size
            }
            _ => state.cursor,
        };
        if cursor > self.windows_per_rank() {
            bail!(
                "sampler state {state:?} is past the {} windows this rank reads per epoch: \
                 it was saved for a different dataset or seq_len",
                self.windows_per_rank()
            );
        }
        if state.epoch != self.state.epoch {
            self.order = self.epoch_order(state.epoch);
        }
        self.state = SamplerState::at(state.epoch, cursor, self.world_size);
        Ok(())
    }

    /// The epoch the next window comes from (or the one just finished).
    pub fn epoch(&self) -> u64 {
        self.state.epoch
    }

    /// How many windows each rank reads per epoch: `num_windows / world_size`.
    pub fn windows_per_rank(&self) -> usize {
        self.num_windows / self.world_size
    }

    /// How many windows each epoch leaves out so the ranks get equal shares.
    pub fn dropped_per_epoch(&self) -> usize {
        self.num_windows % self.world_size
    }

    /// This sampler's rank, in `0..world_size`.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// How many ranks share the windows.
    pub fn world_size(&self) -> usize {
        self.world_size
    }
}
