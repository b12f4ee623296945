//! Reference solution of exercise 19: DDP's buckets, all-reduced while backward runs.

use candle_core::{Result, Tensor};

use crate::distributed::{ProcessGroup, ReduceOp, Work};

pub fn overlapped_all_reduce(
    pg: &dyn ProcessGroup,
    grads: impl Iterator<Item = (String, Tensor)>,
    bucket_cap_bytes: usize,
) -> Result<Vec<(String, Tensor)>> {
    let mut in_flight: Vec<(Vec<(String, Tensor)>, Work)> = vec![];
    let mut bucket: Vec<(String, Tensor)> = vec![];
    let mut bytes = 0;
    for (name, grad) in grads {
        bytes += grad.elem_count() * grad.dtype().size_in_bytes();
        bucket.push((name, grad));
        if bytes >= bucket_cap_bytes {
            // Full: start its all-reduce now, while backward computes the next gradients.
            in_flight.push(launch(pg, std::mem::take(&mut bucket))?);
            bytes = 0;
        }
    }
    if !bucket.is_empty() {
        in_flight.push(launch(pg, bucket)?);
    }
    // Only now, with backward done, wait for the buckets, and cut each back into gradients.
    let mut averaged = vec![];
    for (bucket, work) in in_flight {
        let flat = work.wait()?;
        let mut offset = 0;
        for (name, grad) in bucket {
            averaged.push((name, flat.narrow(0, offset, grad.elem_count())?.reshape(grad.shape())?));
            offset += grad.elem_count();
        }
    }
    Ok(averaged)
}

/// Starts the average over ranks of a bucket's gradients, flattened into one tensor.
fn launch(pg: &dyn ProcessGroup, bucket: Vec<(String, Tensor)>) -> Result<(Vec<(String, Tensor)>, Work)> {
    let flat = Tensor::cat(&bucket.iter().map(|(_, g)| g.flatten_all()).collect::<Result<Vec<_>>>()?, 0)?;
    let work = pg.all_reduce_async(&flat, ReduceOp::Avg)?;
    Ok((bucket, work))
}
