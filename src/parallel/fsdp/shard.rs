//! One FSDP unit on one rank: what it keeps of the parameters, gradients and
//! optimizer state, and the collectives that move them.

use std::ops::Range;

use candle_core::{DType, Device, Result, Tensor, Var};

use super::{comm, FlatLayout, MixedPrecisionPolicy, ShardingPlan};
use crate::distributed::ProcessGroup;
use crate::train::{AdamWConfig, Moments};

/// A unit's state on this rank. Flat buffers throughout, laid out by `layout`.
pub struct ShardedUnit {
    pub name: String,
    pub layout: FlatLayout,
    /// The elements this rank's optimizer updates: its shard, or all of them.
    local: Range<usize>,
    /// The whole buffer in the param dtype, kept between steps when parameters
    /// are not sharded. A variable, so compute can use it without a copy.
    replica: Option<Var>,
    /// f32 master weights over `local`, unless an f32 replica already holds them.
    master: Option<Tensor>,
    /// This step's gradient so far, in the reduce dtype: over `local` once
    /// reduce-scattered, the whole buffer while it is not.
    grad: Option<Tensor>,
    /// AdamW's moments over `local`, f32.
    moments: Moments,
    /// Per weight-decay value, a 0/1 mask over `local` of the elements it applies to.
    decay_masks: Vec<(f64, Tensor)>,
}

/// What a rank holds of a unit's f32 state over its local range: the master
/// weights and AdamW's two moments. The unit of exercise 15's checkpoints.
#[derive(Debug, Clone)]
pub struct LocalState {
    pub params: Tensor,
    pub exp_avg: Tensor,
    pub exp_avg_sq: Tensor,
}

impl ShardedUnit {
    /// Shards `full`, the unit's whole padded f32 buffer (the same on every rank).
    pub(crate) fn new(
        name: String,
        layout: FlatLayout,
        full: &Tensor,
        plan: &ShardingPlan,
        policy: &MixedPrecisionPolicy,
        pg: &dyn ProcessGroup,
        weight_decay_of: impl Fn(&str) -> f64,
    ) -> Result<Self> {
        let local = match plan.optimizer_state {
            true => layout.shard_range(pg.rank(), pg.world_size()),
            false => 0..layout.padded_len(),
        };
        let replica = match plan.params {
            true => None,
            false => Some(Var::from_tensor(&full.to_dtype(policy.param_dtype)?)?),
        };
        let master_in_replica = replica.is_some() && policy.param_dtype == DType::F32;
        let master = match master_in_replica {
            true => None,
            false => Some(full.narrow(0, local.start, local.len())?.force_contiguous()?),
        };
        let decay_masks = layout.masks_by(local.clone(), full.device(), weight_decay_of)?;
        let moments = Moments::zeros_like(&Tensor::zeros(local.len(), DType::F32, full.device())?)?;
        Ok(Self { name, layout, local, replica, master, grad: None, moments, decay_masks })
    }

    /// Whether this rank updates only a shard of the unit (so a full view needs an all-gather).
    pub fn is_sharded(&self) -> bool {
        self.local.len() != self.layout.padded_len()
    }

    /// The elements of the flat buffer this rank updates.
    pub fn local_range(&self) -> Range<usize> {
        self.local.clone()
    }

    /// Whether computing with the unit needs an all-gather first.
    pub fn gathers(&self) -> bool {
        self.replica.is_none()
    }

    /// The whole buffer in the param dtype, as a variable modules can be built
    /// on: the replica, or (one all-gather) every rank's shard put together.
    pub(crate) fn materialize(&self, pg: &dyn ProcessGroup, policy: &MixedPrecisionPolicy) -> Result<Var> {
        match &self.replica {
            Some(replica) => Ok(replica.clone()),
            None => Var::from_tensor(&comm::gather_unit(pg, &self.master_params()?.to_dtype(policy.param_dtype)?)?),
        }
    }

    /// Adds one micro-batch's gradient of the whole buffer (in the reduce
    /// dtype). With sharded gradients it is reduce-scattered at once, so the
    /// whole buffer is never kept.
    pub(crate) fn add_grad(&mut self, flat: Tensor, pg: &dyn ProcessGroup, plan: &ShardingPlan) -> Result<()> {
        let grad = comm::reduce_micro_batch(pg, flat, plan)?;
        self.grad = Some(match self.grad.take() {
            Some(sum) => (sum + grad)?,
            None => grad,
        });
        Ok(())
    }

    /// After the last micro-batch: the step's gradient averaged over ranks,
    /// over `local`, in f32. Gradients not yet reduced are reduced now, once,
    /// over the shard group `pg` and then the `replicas`, if any.
    pub(crate) fn take_reduced_grad(
        &mut self,
        pg: &dyn ProcessGroup,
        replicas: Option<&dyn ProcessGroup>,
        plan: &ShardingPlan,
    ) -> Result<Tensor> {
        let grad = match self.grad.take() {
            Some(g) => g,
            None => candle_core::bail!("unit `{}` has no gradient: run a micro-batch before the step", self.name),
        };
        comm::reduce_step(pg, replicas, grad, plan)?.to_dtype(DType::F32)
    }

    /// Bytes of the gradient buffer right now.
    pub(crate) fn grad_bytes(&self) -> u64 {
        self.grad.as_ref().map_or(0, bytes)
    }

    /// One AdamW step of the local range with `grad` (f32 over `local`), then
    /// the replica refreshed (an all-gather when the optimizer is sharded).
    pub(crate) fn step(
        &mut self,
        grad: &Tensor,
        lr: f64,
        t: u64,
        adamw: &AdamWConfig,
        pg: &dyn ProcessGroup,
        policy: &MixedPrecisionPolicy,
    ) -> Result<()> {
        let p = self.master_params()?;
        let mut factor = p.zeros_like()?;
        for (weight_decay, mask) in &self.decay_masks {
            factor = (factor + (mask * (1.0 - lr * weight_decay))?)?;
        }
        let moments = Moments { exp_avg: self.moments.exp_avg.clone(), exp_avg_sq: self.moments.exp_avg_sq.clone() };
        let (new_p, moments) = adamw.update(t, lr, &(p * factor)?, grad, moments)?;
        self.moments = moments;
        self.set_master_params(new_p, pg, policy)
    }

    /// The f32 state over the local range.
    pub fn local_state(&self) -> Result<LocalState> {
        Ok(LocalState {
            params: self.master_params()?,
            exp_avg: self.moments.exp_avg.clone(),
            exp_avg_sq: self.moments.exp_avg_sq.clone(),
        })
    }

    /// Replaces the f32 state over the local range (each tensor `local_range().len()` long).
    pub(crate) fn set_local_state(
        &mut self,
        state: LocalState,
        pg: &dyn ProcessGroup,
        policy: &MixedPrecisionPolicy,
    ) -> Result<()> {
        for (what, t) in [("params", &state.params), ("exp_avg", &state.exp_avg), ("exp_avg_sq", &state.exp_avg_sq)] {
            if t.dims() != [self.local.len()] {
                candle_core::bail!(
                    "unit `{}`: {what} of shape {:?} does not fit this rank's range of {} elements ({}..{} of {})",
                    self.name,
                    t.dims(),
                    self.local.len(),
                    self.local.start,
                    self.local.end,
                    self.layout.padded_len()
                );
            }
        }
        let f32 = |t: &Tensor| t.to_dtype(DType::F32)?.force_contiguous();
        self.moments = Moments { exp_avg: f32(&state.exp_avg)?, exp_avg_sq: f32(&state.exp_avg_sq)? };
        self.set_master_params(f32(&state.params)?, pg, policy)
    }

    /// Bytes held between steps: (params in the compute dtype, f32 master, moments).
    pub(crate) fn held_bytes(&self) -> (u64, u64, u64) {
        let replica = self.replica.as_ref().map_or(0, |v| bytes(v.as_tensor()));
        let master = self.master.as_ref().map_or(0, bytes);
        (replica, master, bytes(&self.moments.exp_avg) + bytes(&self.moments.exp_avg_sq))
    }

    fn master_params(&self) -> Result<Tensor> {
        match (&self.master, &self.replica) {
            (Some(master), _) => Ok(master.clone()),
            (None, Some(replica)) => replica.as_tensor().narrow(0, self.local.start, self.local.len()),
            (None, None) => unreachable!("a unit without a replica keeps f32 master weights"),
        }
    }

    fn set_master_params(&mut self, p: Tensor, pg: &dyn ProcessGroup, policy: &MixedPrecisionPolicy) -> Result<()> {
        if let Some(replica) = &self.replica {
            let low = p.to_dtype(policy.param_dtype)?;
            let whole = if self.is_sharded() { comm::gather_unit(pg, &low)? } else { low };
            replica.set(&whole)?;
        }
        if self.master.is_some() {
            self.master = Some(p);
        }
        Ok(())
    }

    /// Where the unit's tensors live.
    pub fn device(&self) -> &Device {
        self.moments.exp_avg.device()
    }
}

pub(crate) fn bytes(t: &Tensor) -> u64 {
    (t.elem_count() * t.dtype().size_in_bytes()) as u64
}
