//! # Exercise 26: your own DDP
//!
//! Until now every exercise was one function inside a type the workbook
//! designed. This one is a type: a data-parallel wrapper around a model,
//! what PyTorch's `DistributedDataParallel` is, designed by you. What it
//! keeps, how it groups gradients and when it talks to the other ranks are
//! your choices; the tests only look at what comes out and at what crosses
//! the process group.
//!
//! The requirements, the ones a production DDP meets:
//!
//! 1. **Same start.** After `new` returns, every rank's parameters are rank
//!    0's, whatever each rank initialised; they stay the variables the
//!    caller gave, which an optimizer outside the wrapper steps.
//! 2. **Same gradients as one process.** After the step's last micro-batch,
//!    every rank holds the gradient one process would compute on all ranks'
//!    data: the mean over ranks of each rank's gradient, summed over the
//!    step's micro-batches (the trainer around the wrapper divides the sum
//!    by the micro-batch count, not the wrapper).
//! 3. **No communication while accumulating.** A micro-batch that is not the
//!    step's last (`sync == false`, PyTorch's `no_sync()`) sends nothing.
//!    The last one sends every gradient exactly once.
//! 4. **Buckets.** Gradients travel in buckets: consecutive gradients in the
//!    order backward finishes them, a bucket closing once it holds
//!    `bucket_cap_bytes` or more, what is left a last smaller bucket. One
//!    average all-reduce per bucket.
//! 5. **Overlap.** A bucket's all-reduce starts as soon as the bucket is
//!    full, while backward goes on, and nothing is waited for before
//!    backward has handed over its last gradient.
//!
//! candle computes every gradient in one call and has no per-parameter
//! hooks. The workbook's stand-in is `ForwardPass::backward_as_ready`:
//! backward taken one block at a time (the model must be built with
//! `Gpt::with_blockwise_backward`), calling you back with each parameter's
//! gradient the moment it is final, the head's first and the embedding's
//! last. Exercise 19 bucketed such a stream; here you also decide what the
//! wrapper owns and how accumulation and the last micro-batch differ.
//!
//! A worked example, 2 ranks, 2 micro-batches per step. The rank-local
//! gradient of one weight element is 0.5 then 1.5 on rank 0 and 2.5 then
//! 3.5 on rank 1. After the first micro-batch nothing has crossed the group;
//! after the second both ranks hold ((0.5 + 1.5) + (2.5 + 3.5)) / 2 = 4.0.
//! The model has gradients of 4 096, 1 024 and 8 192 bytes in backward's
//! order, and a 4 096-byte cap: two buckets, {4 096} and {1 024, 8 192}; the
//! first starts before backward has computed the other two.
//!
//! Pieces: `Gpt::new`, `Gpt::with_blockwise_backward`, `Gpt::forward(batch,
//! Some(batch))`, `ForwardPass::loss_value`, `ForwardPass::backward`,
//! `ForwardPass::backward_as_ready`, `ParamStore::iter`, `Var::set`,
//! `ProcessGroup::broadcast`, `ProcessGroup::all_reduce_async` with
//! `ReduceOp::Avg`, `Work::wait`, `Gradients` (`from_store`, `get`,
//! `insert`, `accumulate`), `Tensor::flatten_all`, `Tensor::cat`,
//! `Tensor::narrow`, `reshape`. `t.elem_count() * t.dtype().size_in_bytes()`
//! is a tensor's size in bytes.
//!
//! Read first: Li et al. 2020, "PyTorch Distributed: Experiences on
//! Accelerating Data Parallel Training" (all of section 3); PyTorch's DDP
//! notes ("Internal Design").
//! Guide: `guide/src/phase4/26-data-parallel.md`. Test: `cargo test exercise_26`.

use candle_core::{Result, Tensor};

use crate::autograd::Gradients;
use crate::distributed::ProcessGroup;
use crate::model::{GptConfig, ParamStore};

/// One rank's data-parallel replica. Its fields are yours to choose.
pub struct DataParallel {}

impl DataParallel {
    /// Wraps this rank's replica of a model of `config` with `params`, its
    /// gradients to be averaged over `pg` in buckets of `bucket_cap_bytes`.
    /// On return every rank's `params` hold rank 0's values. The wrapper
    /// trains those variables themselves, not copies: an optimizer outside it
    /// steps `params`, and the next `forward_backward` sees the step.
    pub fn new(
        config: &GptConfig,
        params: ParamStore,
        pg: Box<dyn ProcessGroup>,
        bucket_cap_bytes: usize,
    ) -> Result<Self> {
        let _ = (&config, &params, &pg, &bucket_cap_bytes);
        todo!("Exercise 26: Your own DDP; run `cargo xtask hint 26`")
    }

    /// Forward and backward of the next-token loss on `batch` (B, T) token
    /// ids, its gradients added to the ones accumulated since the last
    /// `take_gradients`. With `sync`, this is the step's last micro-batch: the
    /// accumulated gradients end averaged over the ranks, in buckets
    /// overlapping backward; without it, nothing is sent. Returns the loss.
    pub fn forward_backward(&mut self, batch: &Tensor, sync: bool) -> Result<f64> {
        let _ = (&batch, &sync);
        todo!("Exercise 26: Your own DDP; run `cargo xtask hint 26`")
    }

    /// The gradients accumulated so far, every parameter's (f32, its shape),
    /// handed over; the next micro-batch starts from none.
    pub fn take_gradients(&mut self) -> Result<Gradients> {
        todo!("Exercise 26: Your own DDP; run `cargo xtask hint 26`")
    }
}
