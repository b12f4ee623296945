//! Reference solution of exercise 17: AdamW with its state sharded (ZeRO-1/2).

use candle_core::{Result, Tensor};

use crate::distributed::{ProcessGroup, ReduceOp};
use crate::parallel::zero::ShardedAdamW;
use crate::train::Moments;

impl ShardedAdamW {
    pub fn update_shard(&mut self, param_shard: &Tensor, grad_shard: &Tensor, lr: f64) -> Result<Tensor> {
        let moments = match self.moments.take() {
            Some(moments) => moments,
            None => Moments::zeros_like(param_shard)?,
        };
        self.steps += 1;
        let decayed = (param_shard * (1.0 - lr * self.weight_decay))?;
        let (new_shard, moments) = self.config.update(self.steps, lr, &decayed, grad_shard, moments)?;
        self.moments = Some(moments);
        Ok(new_shard)
    }

    pub fn step(&mut self, pg: &dyn ProcessGroup, params: &Tensor, grad: &Tensor, lr: f64) -> Result<Tensor> {
        let (rank, n, len) = (pg.rank(), pg.world_size(), params.elem_count());
        let shard = len.div_ceil(n);
        let pad = shard * n - len;
        // Each rank receives the average gradient of its shard only (Ψ sent, not 2Ψ).
        let grad_shard = pg.reduce_scatter(&grad.pad_with_zeros(0, 0, pad)?, ReduceOp::Avg)?;
        let param_shard = params.pad_with_zeros(0, 0, pad)?.narrow(0, rank * shard, shard)?;
        let new_shard = self.update_shard(&param_shard, &grad_shard, lr)?;
        // Every rank gets every updated shard back (Ψ more): the whole parameters again.
        pg.all_gather(&new_shard)?.narrow(0, 0, len)
    }
}
