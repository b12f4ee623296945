//! Activation checkpointing for candle, which has none built in.
//!
//! Forward: a checkpointed module runs on a detached input, so no graph (and
//! none of its intermediate activations) is kept; only its input is stored, and
//! its output becomes a fresh leaf variable. Backward: after `loss.backward()`
//! has produced the gradient of each such leaf, each module is run again, in
//! reverse order, with graph, and back-propagated with the surrogate
//! `(y · grad_y).sum()` — candle's `backward` takes no upstream gradient, and the
//! gradient of that sum is exactly the vector-Jacobian product we need.
//!
//! A module may also keep its graph ([`Checkpointed::keeps_graph`]): it is
//! then not recomputed, but backward still visits it alone, module by module
//! ([`Recompute::backward_through`]), which is what DDP needs to start each
//! block's all-reduce as soon as that block's gradients are final.

use candle_core::backprop::GradStore;
use candle_core::{bail, Module, Result, Tensor, TensorId, Var};

use crate::kernels;
use crate::parallel::on_threads;
use crate::timeline;

/// A module that can run under activation checkpointing.
pub trait Checkpointed: Module + Send + Sync {
    /// Keep the forward's graph and back-propagate through it, instead of
    /// recomputing: the graph is still cut at the module's edges.
    fn keeps_graph(&self) -> bool {
        false
    }

    /// The variables whose gradients a replay hands on: the module's
    /// weights. candle's backward also leaves a gradient for every untracked
    /// operand it met (a rotary table, a mask), as large as the activations
    /// they touched, and never removes it; kept, those would pile up module
    /// after module and undo what recomputing saves. `None` hands on every
    /// gradient the replay gives.
    fn variables(&self) -> Option<Vec<Tensor>> {
        None
    }
}

/// What backward must do besides candle's pass over the loss's graph: replay
/// the modules run under activation checkpointing during one forward pass
/// and, when that forward ran the batch in parts on threads of their own
/// ([`crate::model::ThreadedGpt`]), take each part's backward on its thread.
#[derive(Default)]
pub struct Recompute {
    records: Vec<Record>,
    /// Each part's loss, scaled by its share of the batch, and its own tape.
    parts: Vec<(Tensor, Recompute)>,
}

struct Record {
    module: Box<dyn Checkpointed>,
    /// The input as the caller passed it, still attached to the graph before it.
    input: Tensor,
    /// The output handed downstream: a leaf, so backward stops (and reports) here.
    output: Var,
    /// The forward's own graph when the module keeps it.
    kept: Option<Replay>,
}

/// One forward of a module with its graph: from a leaf input to the output.
struct Replay {
    input: Var,
    output: Tensor,
}

impl std::fmt::Debug for Recompute {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Recompute({} checkpointed modules, {} parts)", self.records.len(), self.parts.len())
    }
}

impl Recompute {
    /// The tape of a forward that ran its batch in parts: each part's loss,
    /// already scaled by its share of the batch, and that part's tape.
    pub fn of_parts(parts: Vec<(Tensor, Recompute)>) -> Self {
        Self { records: vec![], parts }
    }

    /// Whether the forward ran its batch in parts.
    pub fn is_split(&self) -> bool {
        !self.parts.is_empty()
    }

    /// The gradients of `loss` (the forward's): candle's `loss.backward()`
    /// completed by [`Recompute::backward`]; for a forward run in parts, each
    /// part's on a thread of its own, then summed, which is the gradient of
    /// the sum of the scaled losses, `loss` itself.
    pub fn gradients_of(&self, loss: &Tensor) -> Result<GradStore> {
        if !self.is_split() {
            let mut grads = loss.backward()?;
            self.backward(&mut grads)?;
            return Ok(grads);
        }
        let jobs = self.parts.iter().map(|(part_loss, tape)| move || tape.gradients_of(part_loss)).collect();
        let mut stores = on_threads(jobs)?.into_iter();
        let mut total = stores.next().expect("a split forward has parts");
        stores.try_for_each(|part| add_into(&mut total, &part))?;
        Ok(total)
    }

    /// Runs `module` on `x` without keeping its activations; it is recomputed in backward.
    pub fn checkpoint<M: Checkpointed + Clone + 'static>(&mut self, module: &M, x: &Tensor) -> Result<Tensor> {
        let span = timeline::span("compute", format!("forward, module {}", self.records.len()));
        let (output, kept) = if module.keeps_graph() {
            let replay = Replay::run(module, x)?;
            (Var::from_tensor(&replay.output.detach())?, Some(replay))
        } else {
            let y = module.forward(&x.detach())?;
            (Var::from_tensor(&y.detach())?, None)
        };
        drop(span);
        let handed_on = output.as_tensor().clone();
        self.records.push(Record { module: Box::new(module.clone()), input: x.clone(), output, kept });
        Ok(handed_on)
    }

    /// How many modules were checkpointed.
    pub fn len(&self) -> usize {
        self.records.len()
    }

    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// Completes `grads` (from `loss.backward()`) with the gradients that flow
    /// through the checkpointed modules, last module first.
    pub fn backward(&self, grads: &mut GradStore) -> Result<()> {
        (0..self.records.len()).rev().try_for_each(|i| self.backward_through(i, grads))
    }

    /// Back-propagates through module `i` (in the order they were
    /// checkpointed) alone: its parameters' gradients join `grads`, which then
    /// hold their final values, and the gradient of its input goes on to the
    /// module before it. Call it for every module, last first, after
    /// `loss.backward()`; [`Recompute::backward`] does exactly that.
    pub fn backward_through(&self, i: usize, grads: &mut GradStore) -> Result<()> {
        let Some(record) = self.records.get(i) else {
            bail!("module {i} was not checkpointed: this forward checkpointed {}", self.records.len());
        };
        let Some(grad_y) = grads.remove(record.output.as_tensor()) else {
            return Ok(()); // the output did not reach the loss
        };
        let span = timeline::span("compute", format!("backward, module {i}"));
        let mut recomputed = None;
        let replay = match &record.kept {
            Some(kept) => kept,
            None => recomputed.insert(Replay::run(record.module.as_ref(), &record.input)?),
        };
        let mut local = vjp(&replay.output, &grad_y)?;
        let grad_x = local.remove(replay.input.as_tensor());
        drop(recomputed); // its activations are no longer needed
        drop(span);
        match record.module.variables() {
            Some(variables) => {
                for variable in variables {
                    if let Some(grad) = local.remove(&variable) {
                        accumulate(grads, &variable, grad)?;
                    }
                }
            }
            None => grads.extend(local)?,
        }
        // A variable's gradient can still hold graph (e.g. `grad · wᵀ` keeps w):
        // detach it, or pushing it further back would count w's gradient twice.
        let Some(grad_x) = grad_x.map(|g| g.detach()) else { return Ok(()) };
        let fed_by_previous = i > 0 && self.records[i - 1].output.id() == record.input.id();
        if fed_by_previous {
            accumulate(grads, &record.input, grad_x)?;
        } else if record.input.track_op() {
            // The input came from ordinary graph (e.g. the embedding): push the
            // gradient through it the same way.
            grads.extend(vjp(&record.input, &grad_x)?)?;
        }
        Ok(())
    }
}

impl Replay {
    /// `module` on a leaf copy of `x`, keeping the graph in between.
    fn run(module: &(impl Module + ?Sized), x: &Tensor) -> Result<Self> {
        let input = Var::from_tensor(&x.detach())?;
        let output = module.forward(input.as_tensor())?;
        Ok(Self { input, output })
    }
}

/// Back-propagates `grad_y`, the gradient of the loss with respect to `y`,
/// through the graph that produced `y`. candle's `backward` takes no upstream
/// gradient; the gradient of the surrogate `(y · grad_y).sum()` is exactly the
/// vector-Jacobian product wanted.
pub fn vjp(y: &Tensor, grad_y: &Tensor) -> Result<GradStore> {
    (y * grad_y.detach())?.sum_all()?.backward()
}

/// Adds `grad` to the gradient `grads` holds for `tensor`.
pub fn accumulate(grads: &mut GradStore, tensor: &Tensor, grad: Tensor) -> Result<()> {
    add_at(grads, tensor.id(), grad)
}

/// Adds each gradient of `part` to `total`'s for the same tensor. Only the
/// parameters, which every part of a batch shares, meet there; each part's
/// activations have ids of their own.
fn add_into(total: &mut GradStore, part: &GradStore) -> Result<()> {
    for &id in part.get_ids() {
        add_at(total, id, part.get_id(id).expect("the store holds the ids it lists").clone())?;
    }
    Ok(())
}

/// Adds `grad` to the gradient `grads` holds for the tensor with `id`.
fn add_at(grads: &mut GradStore, id: TensorId, grad: Tensor) -> Result<()> {
    let total = match grads.get_id(id) {
        Some(existing) => kernels::add(existing, &grad)?,
        None => grad,
    };
    grads.insert_id(id, total);
    Ok(())
}
