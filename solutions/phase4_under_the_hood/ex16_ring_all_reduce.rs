//! Reference solution of exercise 16: ring all-reduce from send and recv.

use candle_core::{Result, Tensor};

use crate::distributed::{chunk_ranges, ProcessGroup};

pub fn ring_all_reduce(pg: &dyn ProcessGroup, t: &Tensor) -> Result<Tensor> {
    let (rank, n) = (pg.rank(), pg.world_size());
    let (right, left) = ((rank + 1) % n, (rank + n - 1) % n);
    let flat = t.flatten_all()?;
    let mut chunks = chunk_ranges(flat.elem_count(), n)
        .into_iter()
        .map(|r| flat.narrow(0, r.start, r.len()))
        .collect::<Result<Vec<_>>>()?;
    // Reduce-scatter: the partial sum of chunk c starts at rank c and gains a
    // rank's part at every hop; after N − 1 hops rank r holds chunk r + 1 whole.
    for s in 0..n - 1 {
        let (send, recv) = ((rank + n - s) % n, (rank + 2 * n - s - 1) % n);
        let incoming = pg.send_recv(&chunks[send], right, &chunks[recv], left)?;
        chunks[recv] = (&chunks[recv] + incoming)?;
    }
    // All-gather: the finished chunks go round once more.
    for s in 0..n - 1 {
        let (send, recv) = ((rank + 1 + n - s) % n, (rank + n - s) % n);
        chunks[recv] = pg.send_recv(&chunks[send], right, &chunks[recv], left)?;
    }
    Tensor::cat(&chunks, 0)?.reshape(t.shape())
}
