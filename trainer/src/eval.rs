//! Evaluation on held-out data. With `--eval-every N` the last 1% of the
//! windows (at least one per replica, at most [`MOST_HELD_OUT`]) are never
//! trained on; before the first step, every N steps and at the end, each
//! replica measures the loss on its share of them, and the ranks average it.
//! The perplexity is e^loss: the number of tokens the model is, on average,
//! as unsure between as a uniform guess would be.

use std::ops::Range;

use anyhow::{bail, Result};
use candle_core::{Device, Tensor};
use workbook::data::Dataset;
use workbook::distributed::{all_reduce_scalar, ReduceOp};
use workbook::train::Train;

/// The most windows held out: about half a million tokens at T = 1024, so an
/// evaluation of a large corpus stays a small fraction of the run.
pub const MOST_HELD_OUT: usize = 512;

/// The windows kept out of training, at the end of the data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldOut {
    windows: Range<usize>,
}

impl HeldOut {
    /// The held-out tail of `num_windows` windows read by `replicas`
    /// data-parallel replicas, of which `batch_size` a step trains on.
    pub fn of(num_windows: usize, replicas: usize, batch_size: usize) -> Result<Self> {
        let count = (num_windows / 100).clamp(replicas, MOST_HELD_OUT.max(replicas));
        if num_windows < count + batch_size {
            bail!(
                "the data makes {num_windows} windows: holding out {count} for evaluation leaves fewer than one batch \
                 of {batch_size} to train on; use more text, or drop --eval-every"
            );
        }
        Ok(Self { windows: num_windows - count..num_windows })
    }

    /// How many windows training may read: those before the held-out tail.
    pub fn train_windows(&self) -> usize {
        self.windows.start
    }

    /// How many windows are held out.
    pub fn len(&self) -> usize {
        self.windows.len()
    }

    /// Whether nothing is held out (never: `of` holds out one per replica).
    pub fn is_empty(&self) -> bool {
        self.windows.is_empty()
    }

    /// Replica `replica`'s share, in batches of at most `batch`: every
    /// replica gets as many windows as the others, so all take part in the
    /// same number of collectives.
    pub fn batches(&self, replica: usize, replicas: usize, batch: usize) -> Vec<Vec<usize>> {
        let share = self.windows.len() / replicas;
        let mine: Vec<usize> = self.windows.clone().skip(replica).step_by(replicas).take(share).collect();
        mine.chunks(batch.max(1)).map(<[usize]>::to_vec).collect()
    }
}

/// The mean loss on the held-out windows, averaged over every rank (the
/// ranks of one replica measure the same batches). Changes no parameter.
pub fn evaluate(
    trainer: &mut impl Train,
    dataset: &Dataset,
    held_out: &HeldOut,
    batch: usize,
    device: &Device,
) -> Result<f64> {
    let (replica, replicas) = trainer.replica();
    let batches = held_out.batches(replica, replicas, batch);
    let mut total = 0.0;
    for windows in &batches {
        let tokens: Tensor = dataset.batch(windows, device)?;
        total += trainer.eval_loss(&tokens).map_err(|e| anyhow::anyhow!("evaluating: {e}"))? * windows.len() as f64;
    }
    let mine = total / batches.iter().map(Vec::len).sum::<usize>().max(1) as f64;
    Ok(all_reduce_scalar(trainer.process_group(), mine, ReduceOp::Avg, device)?)
}
