//! Reference solution of exercise 18: PowerSGD, a gradient all-reduced at low rank.

use candle_core::{Result, Tensor};

use crate::distributed::{ProcessGroup, ReduceOp};
use crate::parallel::powersgd::{orthonormal_columns, PowerSgd};

impl PowerSgd {
    pub fn all_reduce(&mut self, pg: &dyn ProcessGroup, grad: &Tensor) -> Result<Tensor> {
        // Error feedback: what compression dropped last step is sent this step.
        let m = match &self.error {
            Some(error) => (grad + error)?,
            None => grad.clone(),
        };
        let q = match self.q.take() {
            Some(q) => q, // warm start: last step's Q, one power iteration further
            None => self.initial_q(m.dim(1)?, m.device())?,
        };
        let p = pg.all_reduce(&m.matmul(&q)?, ReduceOp::Avg)?; // (n, r)
        let p = orthonormal_columns(&p)?;
        let q = pg.all_reduce(&m.t()?.matmul(&p)?, ReduceOp::Avg)?; // (m, r)
        let approx = p.matmul(&q.t()?)?; // (n, m)
        self.error = Some((&m - &approx)?);
        self.q = Some(q);
        Ok(approx)
    }
}
