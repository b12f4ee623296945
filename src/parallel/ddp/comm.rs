//! DDP's communication: the start-up broadcast and the bucketed gradient all-reduce.

use candle_core::{Result, Tensor};

use crate::autograd::Gradients;
use crate::distributed::{ProcessGroup, ReduceOp};
use crate::model::ParamStore;

/// Copies rank 0's parameters to every rank of `pg` (DDP and FSDP both start so).
pub fn broadcast_parameters(pg: &dyn ProcessGroup, params: &ParamStore) -> Result<()> {
    for (_, var) in params.iter() {
        var.set(&pg.broadcast(var.as_tensor(), 0)?)?;
    }
    Ok(())
}

/// Averages `grads` across the ranks of `pg`, one all-reduce per bucket (see [`buckets`]).
pub fn average_in_buckets(pg: &dyn ProcessGroup, grads: &mut Gradients, bucket_bytes: usize) -> Result<()> {
    if pg.world_size() == 1 {
        return Ok(());
    }
    for bucket in buckets(grads, bucket_bytes) {
        let flat: Vec<Tensor> = bucket.iter().map(|(_, g)| g.flatten_all()).collect::<Result<_>>()?;
        let averaged = pg.all_reduce(&Tensor::cat(&flat, 0)?, ReduceOp::Avg)?;
        let mut offset = 0;
        for (name, grad) in bucket {
            let n = grad.elem_count();
            grads.insert(&name, averaged.narrow(0, offset, n)?.reshape(grad.shape())?);
            offset += n;
        }
    }
    Ok(())
}

/// Consecutive gradients, in name order, grouped into buckets: a bucket closes
/// once it holds `bucket_bytes` or more, the rule of PyTorch's DDP and of
/// exercise 19's overlapped buckets, so both cut a model the same way.
fn buckets(grads: &Gradients, bucket_bytes: usize) -> Vec<Vec<(String, Tensor)>> {
    let mut buckets: Vec<Vec<(String, Tensor)>> = vec![vec![]];
    let mut filled = 0;
    for (name, grad) in grads.iter() {
        buckets.last_mut().expect("there is always an open bucket").push((name.to_string(), grad.clone()));
        filled += grad.elem_count() * grad.dtype().size_in_bytes();
        if filled >= bucket_bytes {
            buckets.push(vec![]);
            filled = 0;
        }
    }
    buckets.retain(|bucket| !bucket.is_empty());
    buckets
}
