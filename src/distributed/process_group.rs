//! The one interface between a trainer and its ranks.

use candle_core::{Device, Result, Tensor};

use super::{CommStats, ReduceOp, Work};

/// What a backend guarantees beyond the contract every backend keeps.
/// Tests read these to choose between a bit-exact comparison and a tolerance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Properties {
    /// Reductions add the ranks' tensors in rank order 0, 1, ..., N−1, so a
    /// result is bit-identical to one process adding them in that order. A
    /// ring adds each chunk starting from a different rank: its results are
    /// the same on every rank and in every run, but may differ from rank
    /// order in the last bits (from three ranks on: a + b = b + a exactly).
    pub rank_order_reduction: bool,
    /// A peer that dies turns this rank's pending and next collectives into
    /// errors naming it, instead of a hang (NCCL hangs until its watchdog).
    pub detects_dead_peers: bool,
    /// The `_async` calls run while the caller goes on computing; without
    /// it they are done by the time they return.
    pub overlaps: bool,
    /// `send` returns before `dst` receives: the message waits at the
    /// receiver, so two ranks may both send before either receives (a ring
    /// step, a pipeline stage sending on while it waits for a gradient).
    /// Without it (NCCL) a send completes only once its receive is posted,
    /// and code written that way deadlocks.
    pub buffered_sends: bool,
}

/// A group of ranks that exchange tensors through collectives.
///
/// Each rank holds its own `ProcessGroup` handle and calls the same
/// collectives in the same order as every other rank; a call returns once all
/// ranks have made it. Each method is one NCCL call, so a GPU backend maps onto
/// it one to one.
///
/// Results follow the same rules on every backend: the input's shape, dtype
/// and device, a fresh untracked tensor, and every rank gets bit-identical
/// numbers. Reductions are computed in the dtype they are handed, as NCCL
/// computes them: a bf16 all-reduce rounds to bf16 as it adds, which is what
/// a mixed-precision policy's `reduce_dtype` chooses. What only some
/// backends give is in [`ProcessGroup::properties`].
///
/// The pictures below show 3 ranks; each row is one rank's tensor.
pub trait ProcessGroup: Send {
    /// This rank's number, in `0..world_size()`.
    fn rank(&self) -> usize;

    /// How many ranks the group has.
    fn world_size(&self) -> usize;

    /// What this backend guarantees beyond the common contract.
    fn properties(&self) -> Properties;

    /// Combines every rank's tensor and gives each rank the result
    /// (NCCL: `ncclAllReduce`). Every rank passes the same shape and dtype.
    ///
    /// ```text
    ///            before         after (Sum)        after (Avg)
    ///   rank 0   [1, 2]         [111, 222]         [37, 74]
    ///   rank 1   [10, 20]   ->  [111, 222]         [37, 74]
    ///   rank 2   [100, 200]     [111, 222]         [37, 74]
    /// ```
    ///
    /// DDP calls it on the gradients after backward, with `Avg`, so that every
    /// replica takes the same optimizer step.
    fn all_reduce(&self, t: &Tensor, op: ReduceOp) -> Result<Tensor>;

    /// Gives every rank a copy of the `root` rank's tensor (NCCL:
    /// `ncclBroadcast`). Every rank passes a tensor of the same shape and
    /// dtype; only the root's values matter.
    ///
    /// ```text
    ///            before          after (root = 1)
    ///   rank 0   [0, 0]          [7, 8]
    ///   rank 1   [7, 8]     ->   [7, 8]
    ///   rank 2   [0, 0]          [7, 8]
    /// ```
    ///
    /// Used once at start-up so that every replica begins from rank 0's weights.
    fn broadcast(&self, t: &Tensor, root: usize) -> Result<Tensor>;

    /// Concatenates every rank's tensor along dim 0, in rank order, and gives
    /// each rank the whole (NCCL: `ncclAllGather`). Every rank passes the same
    /// shape and dtype; the result's dim 0 is `world_size` times the input's
    /// (a scalar counts as shape `[1]`).
    ///
    /// ```text
    ///            before       after
    ///   rank 0   [a0, a1]     [a0, a1, b0, b1, c0, c1]
    ///   rank 1   [b0, b1] ->  [a0, a1, b0, b1, c0, c1]
    ///   rank 2   [c0, c1]     [a0, a1, b0, b1, c0, c1]
    /// ```
    ///
    /// FSDP calls it to rebuild a full parameter from its shards just before
    /// the parameter is used.
    fn all_gather(&self, t: &Tensor) -> Result<Tensor>;

    /// Reduces every rank's tensor, then gives rank `r` only the `r`-th of
    /// `world_size` equal chunks along dim 0 (NCCL: `ncclReduceScatter`).
    /// Dim 0 must be divisible by the world size: pad the tensor if it is not.
    ///
    /// ```text
    ///            before                   after (Sum)
    ///   rank 0   [1, 2, 3, 4, 5, 6]       [111, 222]
    ///   rank 1   [10, 20, 30, ...]   ->   [333, 444]
    ///   rank 2   [100, 200, 300, ...]     [555, 666]
    /// ```
    ///
    /// It is an all-reduce in which each rank keeps only its own part, for the
    /// same traffic: FSDP calls it on the gradients, so that each rank ends up
    /// with exactly the gradient of the parameter shard it updates.
    fn reduce_scatter(&self, t: &Tensor, op: ReduceOp) -> Result<Tensor>;

    /// Sends `t` to rank `dst`, which must call [`recv`](Self::recv) with
    /// `src` = this rank (NCCL: `ncclSend`). Messages between two ranks
    /// arrive in the order they were sent. Ring algorithms and pipeline
    /// parallelism are built from this pair.
    ///
    /// ```text
    ///   rank 0: send([1, 2], dst 2)  ─────────────┐
    ///   rank 2: recv(like [0, 0], src 0)  ->  [1, 2]
    /// ```
    ///
    /// A backend may return before `dst` has received the tensor; whether it
    /// always does is [`Properties::buffered_sends`].
    fn send(&self, t: &Tensor, dst: usize) -> Result<()>;

    /// Receives the tensor rank `src` sends to this rank, of `like`'s shape
    /// and dtype, on `like`'s device (NCCL: `ncclRecv` into a buffer like it).
    /// Only the shape, dtype and device of `like` matter.
    fn recv(&self, like: &Tensor, src: usize) -> Result<Tensor>;

    /// Sends `t` to rank `dst` and receives from rank `src` a tensor of
    /// `like`'s shape and dtype, as one exchange (NCCL: an `ncclSend` and an
    /// `ncclRecv` between `ncclGroupStart` and `ncclGroupEnd`; PyTorch:
    /// `batch_isend_irecv`). Neither half waits for the other, so every rank
    /// of a ring may send to its successor while it receives from its
    /// predecessor, on every backend, [`Properties::buffered_sends`] or not.
    ///
    /// ```text
    ///   rank 0: send_recv([1, 2], dst 1, src 2)  ->  [5, 6]
    ///   rank 1: send_recv([3, 4], dst 2, src 0)  ->  [1, 2]
    ///   rank 2: send_recv([5, 6], dst 0, src 1)  ->  [3, 4]
    /// ```
    ///
    /// By default it is a `send` then a `recv`, which is one exchange only
    /// where sends are buffered; a backend without buffered sends overrides it.
    fn send_recv(&self, t: &Tensor, dst: usize, like: &Tensor, src: usize) -> Result<Tensor> {
        if !self.properties().buffered_sends {
            candle_core::bail!(
                "send_recv: this backend's sends wait for their receive, and it has no grouped exchange"
            );
        }
        self.send(t, dst)?;
        self.recv(like, src)
    }

    /// Returns once every rank has called it; moves no data. Useful to line
    /// the ranks up, e.g. before timing a step or after rank 0 writes a file.
    fn barrier(&self) -> Result<()>;

    /// [`all_reduce`](Self::all_reduce) started without waiting for it
    /// (PyTorch: `async_op=True`): the returned [`Work`]'s `wait` gives the
    /// result. Calls still run in the order they were issued, so every rank
    /// must issue the same ones in the same order as ever. DDP uses it to
    /// all-reduce a bucket of gradients while backward computes the next.
    fn all_reduce_async(&self, t: &Tensor, op: ReduceOp) -> Result<Work> {
        Ok(Work::done(self.all_reduce(t, op)))
    }

    /// [`all_gather`](Self::all_gather), started without waiting for it
    /// (FSDP prefetches the next unit's parameters with it).
    fn all_gather_async(&self, t: &Tensor) -> Result<Work> {
        Ok(Work::done(self.all_gather(t)))
    }

    /// [`reduce_scatter`](Self::reduce_scatter), started without waiting for it.
    fn reduce_scatter_async(&self, t: &Tensor, op: ReduceOp) -> Result<Work> {
        Ok(Work::done(self.reduce_scatter(t, op)))
    }

    /// Splits this group into subgroups (NCCL: `ncclCommSplit`; PyTorch:
    /// `dist.split_group`): every rank calls it at the same point of its
    /// calls, and the ranks that pass the same `color` form one new group,
    /// numbered in this group's rank order. It is itself a collective (an
    /// all-gather of the colours).
    ///
    /// ```text
    ///            color   new group   rank in it
    ///   rank 0   0       {0, 2}      0
    ///   rank 1   1       {1, 3}      0
    ///   rank 2   0       {0, 2}      1
    ///   rank 3   1       {1, 3}      1
    /// ```
    ///
    /// A subgroup numbers its calls, counts its stats and reports its
    /// failures on its own; a dead peer still ends every group it is in.
    /// Groups of one rank share its connections (and, on TCP, its
    /// communication thread), so every rank must issue the calls of all its
    /// groups in one order that agrees where two ranks share more than one
    /// group, as NCCL requires of communicators on one stream. A
    /// [`DeviceMesh`](super::DeviceMesh) makes the groups along each axis of
    /// a grid of ranks this way.
    fn split(&self, _color: usize) -> Result<Box<dyn ProcessGroup>> {
        candle_core::bail!("this process group cannot be split into subgroups")
    }

    /// Tells the other ranks that this one is busy with long work outside
    /// the collectives, such as writing a checkpoint (`None`: no longer). A
    /// rank that waits for this one meanwhile keeps waiting past its timeout
    /// instead of calling it stuck; a dead or stopped process is still
    /// noticed. Wrap the work in [`while_busy`]. Backends without a liveness
    /// signal (NCCL has its own watchdog) ignore it.
    fn set_busy(&self, _what: Option<&str>) {}

    /// What this rank has sent through the group so far: the calls and
    /// payload bytes of each collective. Take a snapshot before a step and
    /// compare with [`CommStats::since`].
    fn stats(&self) -> CommStats;
}

/// `value` reduced over the ranks of `pg` with `op`, carried as one f32 on
/// `device` (the one the group's tensors live on): a loss to log, the parts
/// of a gradient norm that ranks holding different parameters add up.
pub fn all_reduce_scalar(pg: &dyn ProcessGroup, value: f64, op: ReduceOp, device: &Device) -> Result<f64> {
    let mine = Tensor::new(&[value as f32], device)?;
    Ok(pg.all_reduce(&mine, op)?.to_vec1::<f32>()?[0] as f64)
}

/// The ranks of `pg` that passed the same `color` as this one to
/// [`ProcessGroup::split`], in rank order, with this rank's place among
/// them: every rank's colour, all-gathered as one f32 (exact below 2²⁴) on
/// `device`, the one the group's tensors live on.
pub(crate) fn members_of_color(pg: &dyn ProcessGroup, color: usize, device: &Device) -> Result<(Vec<usize>, usize)> {
    const MOST: usize = 1 << 24;
    if color >= MOST {
        candle_core::bail!("split: colour {color} is too large: use a colour below {MOST}, such as a group's index");
    }
    let colors = pg.all_gather(&Tensor::new(&[color as f32], device)?)?.to_vec1::<f32>()?;
    let members: Vec<usize> = (0..colors.len()).filter(|&r| colors[r] as usize == color).collect();
    let place = members.iter().position(|&r| r == pg.rank()).expect("a rank passes its own colour");
    Ok((members, place))
}

/// Runs `work` with `pg` marked busy with `what` (see [`ProcessGroup::set_busy`]).
pub fn while_busy<R>(pg: &dyn ProcessGroup, what: &str, work: impl FnOnce() -> R) -> R {
    pg.set_busy(Some(what));
    let result = work();
    pg.set_busy(None);
    result
}
