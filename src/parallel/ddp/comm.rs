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

/// Averages `grads` across the ranks of `pg`, one all-reduce per bucket of at
/// most `bucket_bytes`.
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

/// Consecutive gradients, in name order, grouped into buckets of at most `bucket_bytes`
/// (a single gradient larger than that gets a bucket of its own).
fn buckets(grads: &Gradients, bucket_bytes: usize) -> Vec<Vec<(String, Tensor)>> {
    let mut buckets: Vec<Vec<(String, Tensor)>> = vec![];
    let mut filled = 0;
    for (name, grad) in grads.iter() {
        let bytes = grad.elem_count() * grad.dtype().size_in_bytes();
        if buckets.is_empty() || filled + bytes > bucket_bytes {
            buckets.push(vec![]);
            filled = 0;
        }
        buckets.last_mut().expect("a bucket was just pushed").push((name.to_string(), grad.clone()));
        filled += bytes;
    }
    buckets
}
