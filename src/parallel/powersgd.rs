//! PowerSGD's state for one gradient matrix (Vogels et al. 2019): the
//! low-rank factor kept from the last step and the error the compression
//! left. Its all-reduce is exercise 18
//! (`exercises/phase4_under_the_hood/ex18_powersgd.rs`).

use std::collections::BTreeMap;

use candle_core::{bail, Device, Result, Tensor};

use crate::autograd::Gradients;
use crate::distributed::ProcessGroup;
use crate::model::InitRng;
use crate::parallel::ddp::average_in_buckets;

/// One rank's PowerSGD state for one (n, m) gradient, compressed to rank r.
#[derive(Debug, Clone)]
pub struct PowerSgd {
    /// r: the rank of the approximation. Each all-reduce sends (n + m)·r
    /// numbers instead of n·m.
    pub approx_rank: usize,
    /// Seeds the first Q, the same on every rank.
    seed: u64,
    /// Q (m, r) from the last step, the start of the next power iteration;
    /// `None` before the first step.
    pub(crate) q: Option<Tensor>,
    /// This rank's error feedback (n, m): what compression left out of its
    /// gradient last step; `None` before the first step.
    pub(crate) error: Option<Tensor>,
}

impl PowerSgd {
    pub fn new(approx_rank: usize, seed: u64) -> Self {
        Self { approx_rank, seed, q: None, error: None }
    }

    /// The first Q for a gradient of `m` columns: (m, r), normal noise from
    /// the seed, so every rank starts the power iteration from the same matrix.
    pub fn initial_q(&self, m: usize, device: &Device) -> Result<Tensor> {
        InitRng::from_seed(self.seed).normal(&(m, self.approx_rank).into(), 1.0, device)
    }

    /// The Q (m, r) this rank carries into its next step: the warm start.
    pub fn q(&self) -> Option<&Tensor> {
        self.q.as_ref()
    }

    /// The error feedback this rank carries into its next step.
    pub fn error(&self) -> Option<&Tensor> {
        self.error.as_ref()
    }
}

/// The columns of `p` (n, r), made orthonormal by Gram-Schmidt, in order:
/// column j minus its projections on the columns before it, divided by its
/// length. A column that vanishes (p has rank below r) stays zero.
pub fn orthonormal_columns(p: &Tensor) -> Result<Tensor> {
    let (_, r) = p.dims2()?;
    if r == 0 {
        bail!("orthonormal_columns: no columns");
    }
    let mut columns: Vec<Tensor> = Vec::with_capacity(r);
    for j in 0..r {
        let mut column = p.narrow(1, j, 1)?; // (n, 1)
        for earlier in &columns {
            let projection = (earlier * &column)?.sum_all()?;
            column = (column - earlier.broadcast_mul(&projection)?)?;
        }
        let length = column.sqr()?.sum_all()?.sqrt()?.to_scalar::<f32>()?;
        columns.push(if length > 1e-12 { (column / length as f64)? } else { column.zeros_like()? });
    }
    Tensor::cat(&columns, 1)
}

/// PowerSGD as DDP's gradient average (PyTorch's `powerSGD_hook`): every
/// matrix gradient that rank-r factors make smaller goes through its own
/// [`PowerSgd`] (exercise 18); the others (norm weights, small matrices) are
/// averaged whole, in buckets. Each rank's error feedback lives here, for the
/// run: it is not part of a checkpoint, so a resumed run starts it afresh.
#[derive(Debug, Clone)]
pub struct PowerSgdHook {
    approx_rank: usize,
    states: BTreeMap<String, PowerSgd>,
}

impl PowerSgdHook {
    pub fn new(approx_rank: usize) -> Self {
        Self { approx_rank, states: BTreeMap::new() }
    }

    pub fn approx_rank(&self) -> usize {
        self.approx_rank
    }

    /// Whether a gradient of `dims` is compressed: a matrix whose factors,
    /// (n + m)·r numbers, are fewer than its n·m.
    pub fn compresses(&self, dims: &[usize]) -> bool {
        matches!(dims, [n, m] if (n + m) * self.approx_rank < n * m)
    }

    /// Replaces `grads` by their average over the ranks of `pg`: the
    /// compressed ones by their rank-r estimate, the rest exactly.
    pub fn average(&mut self, pg: &dyn ProcessGroup, grads: &mut Gradients, bucket_bytes: usize) -> Result<()> {
        if pg.world_size() == 1 {
            return Ok(());
        }
        let mut whole = Gradients::default();
        let mut estimates = vec![];
        // Name order: the same on every rank.
        for (name, grad) in grads.iter() {
            if !self.compresses(grad.dims()) {
                whole.insert(name, grad.clone());
                continue;
            }
            let state =
                self.states.entry(name.to_string()).or_insert_with(|| PowerSgd::new(self.approx_rank, seed_of(name)));
            estimates.push((name.to_string(), state.all_reduce(pg, grad)?));
        }
        average_in_buckets(pg, &mut whole, bucket_bytes)?;
        for (name, grad) in whole.iter().map(|(n, g)| (n.to_string(), g.clone())).chain(estimates) {
            grads.insert(&name, grad);
        }
        Ok(())
    }
}

/// The seed of a parameter's first Q, from its name (64-bit FNV-1a): the
/// same on every rank, and the same whatever else the rank holds, so that
/// a pipeline stage starts each of its matrices where the whole model would.
fn seed_of(name: &str) -> u64 {
    name.bytes().fold(0xcbf2_9ce4_8422_2325, |hash, byte| (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3))
}
