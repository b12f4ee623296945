//! Data parallelism inside one process: the rows of each batch split across
//! threads, every thread running the same model (the same parameter tensors,
//! read and never copied) on its part, as PyTorch's `DataParallel` splits a
//! batch across the GPUs of one process.
//!
//! On a CPU this uses the cores better than splitting each tensor operation:
//! a step is thousands of small operations (elementwise, reductions, the
//! attention's per-head products), each too small to split across cores
//! with profit, so one rank's operations mostly run on one core. Given each
//! a part of the batch, every core runs its own operations back to back.
//!
//! The arithmetic is DDP's, without the copies: the loss is the mean over
//! every row, so it is the parts' losses weighted by their rows, and its
//! gradient the sum of the parts' gradients of their weighted losses. The
//! parameters' gradients are summed in memory where DDP all-reduces them.

use std::panic::resume_unwind;

use candle_core::{bail, Result, Tensor};

use crate::autograd::Recompute;
use crate::model::{ForwardPass, Gpt, GptConfig};

/// A [`Gpt`] whose forward splits each batch's rows across up to `threads`
/// threads; its [`ForwardPass::backward`] then takes each part's backward on
/// a thread of its own. With one thread it is the model itself.
#[derive(Debug, Clone)]
pub struct ThreadedGpt {
    gpt: Gpt,
    threads: usize,
}

impl ThreadedGpt {
    /// `gpt`, running each batch whole on the calling thread.
    pub fn new(gpt: Gpt) -> Self {
        Self { gpt, threads: 1 }
    }

    /// Splits each batch's rows across up to `threads` threads: fewer when
    /// the batch has fewer rows. On a CPU only: candle gives each thread its
    /// own CUDA stream, and nothing would order one part's kernels before
    /// the reads of another's results.
    pub fn split_across(self, threads: usize) -> Result<Self> {
        if threads > 1 && !self.gpt.embed_tokens.embeddings().device().is_cpu() {
            bail!(
                "a batch split across threads runs on the CPU only: on a GPU each thread has its own stream, and \
                 nothing orders one thread's kernels before another reads their results"
            );
        }
        Ok(Self { threads: threads.max(1), ..self })
    }

    /// The threads each batch is split across, at most.
    pub fn threads(&self) -> usize {
        self.threads
    }

    pub fn config(&self) -> &GptConfig {
        self.gpt.config()
    }

    /// Exercise 7's forward of `idx` (B, T) with `labels`, as
    /// [`Gpt::forward`]: on a split model, each part of the rows on a thread
    /// of its own. The logits are the parts' in order, and the loss is their
    /// losses weighted by their rows: the mean over the whole batch.
    pub fn forward(&self, idx: &Tensor, labels: Option<&Tensor>) -> Result<ForwardPass> {
        let rows = idx.dim(0)?;
        let parts = self.threads.min(rows);
        if parts <= 1 {
            return self.gpt.forward(idx, labels);
        }
        let jobs = part_rows(rows, parts)
            .map(|(start, len)| {
                move || -> Result<(ForwardPass, f64)> {
                    let labels = labels.map(|l| l.narrow(0, start, len)).transpose()?;
                    let pass = self.gpt.forward(&idx.narrow(0, start, len)?, labels.as_ref())?;
                    Ok((pass, len as f64 / rows as f64))
                }
            })
            .collect();
        let passes = on_threads(jobs)?;
        let logits = Tensor::cat(&passes.iter().map(|(pass, _)| &pass.logits).collect::<Vec<_>>(), 0)?;
        if labels.is_none() {
            return Ok(ForwardPass { logits, loss: None, recompute: Recompute::default() });
        }
        let mut tapes = Vec::with_capacity(parts);
        for (pass, share) in passes {
            let Some(part_loss) = pass.loss else { bail!("the forward with labels returned no loss") };
            tapes.push(((part_loss * share)?, pass.recompute));
        }
        let loss = tapes[1..].iter().try_fold(tapes[0].0.clone(), |sum, (scaled, _)| sum + scaled)?;
        Ok(ForwardPass { logits, loss: Some(loss), recompute: Recompute::of_parts(tapes) })
    }
}

/// `(first row, rows)` of each of `parts` near-equal parts of `rows` rows.
fn part_rows(rows: usize, parts: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..parts).map(move |i| (i * rows / parts, (i + 1) * rows / parts - i * rows / parts))
}

/// Runs each job on a thread of its own (`batch part i`, its track in a
/// `--trace` timeline) and returns their results in order, or the first
/// job's error. A job that panics (an exercise's `todo!()`) panics this
/// thread with its own message.
pub(crate) fn on_threads<T: Send>(jobs: Vec<impl FnOnce() -> Result<T> + Send>) -> Result<Vec<T>> {
    let results = std::thread::scope(|scope| {
        let handles = jobs
            .into_iter()
            .enumerate()
            .map(|(i, job)| std::thread::Builder::new().name(format!("batch part {i}")).spawn_scoped(scope, job))
            .collect::<std::io::Result<Vec<_>>>()?;
        Ok::<_, std::io::Error>(
            handles
                .into_iter()
                .map(|handle| handle.join().unwrap_or_else(|panic| resume_unwind(panic)))
                .collect::<Vec<_>>(),
        )
    })?;
    results.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_cover_the_rows_in_order_and_differ_by_at_most_one() {
        let parts: Vec<_> = part_rows(7, 3).collect();
        assert_eq!(parts, [(0, 2), (2, 2), (4, 3)]);
        let parts: Vec<_> = part_rows(16, 2).collect();
        assert_eq!(parts, [(0, 8), (8, 8)]);
    }
}
