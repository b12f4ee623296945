//! Flat parameters: a unit's tensors laid end to end in one 1-D buffer, padded
//! so that it splits into equal shards, one per rank.
//!
//! ```text
//!   [ w_q (C·C) | w_k (C·C) | ... | norm (C) | pad ]   padded length P' = N · S
//!   [ rank 0's shard S | rank 1's shard S | ... ]
//! ```
//!
//! A shard boundary can fall inside a tensor: a rank may own the second half
//! of one weight and the first half of the next. Nothing cares, because every
//! per-element operation (AdamW, gradient averaging) works on the flat buffer.
//!
//! While a unit computes, its gathered buffer is split into one variable per
//! parameter ([`FlatLayout::split`]), and their gradients are laid end to end
//! again in one buffer ([`FlatLayout::concat`]). Parameters that were views
//! of the buffer would cost more: candle's backward of a view pads its
//! gradient to the whole buffer and adds it, a unit's size per parameter.

use std::collections::HashMap;
use std::ops::Range;

use candle_core::{bail, DType, Device, Result, Shape, Tensor, Var};

use crate::model::{param_specs, GptConfig, Weights};

/// Each element's weight decay over a range of a flat buffer: runs of
/// elements of one parameter, from [`FlatLayout::decay_runs`].
#[derive(Debug, Clone, PartialEq)]
pub struct DecayRuns {
    len: usize,
    runs: Vec<(Range<usize>, f64)>,
}

impl DecayRuns {
    /// The decays of `range` of the elements these cover, counted from its start.
    pub fn slice(&self, range: Range<usize>) -> DecayRuns {
        let runs = self
            .runs
            .iter()
            .filter_map(|(run, weight_decay)| {
                let (start, end) = (run.start.max(range.start), run.end.min(range.end));
                (start < end).then(|| (start - range.start..end - range.start, *weight_decay))
            })
            .collect();
        DecayRuns { len: range.len(), runs }
    }
}

/// Where each parameter of a unit sits in its flat buffer.
#[derive(Debug, Clone, PartialEq)]
pub struct FlatLayout {
    entries: Vec<FlatEntry>,
    numel: usize,
    padded: usize,
}

#[derive(Debug, Clone, PartialEq)]
struct FlatEntry {
    name: String,
    shape: Shape,
    offset: usize,
}

impl FlatLayout {
    /// The layout of `names` (parameters of `config`, in this order), padded to
    /// a multiple of `world_size`.
    pub fn new(config: &GptConfig, names: &[String], world_size: usize) -> Result<Self> {
        let specs = param_specs(config);
        let mut shapes = Vec::with_capacity(names.len());
        for name in names {
            let Some(spec) = specs.iter().find(|s| &s.name == name) else {
                bail!("`{name}` is not a parameter of this model");
            };
            shapes.push((name.clone(), spec.shape.clone()));
        }
        Ok(Self::of_shapes(shapes, world_size))
    }

    /// The layout of tensors of these shapes, in this order (a rank's parts
    /// of the model, say, whose shapes are not the whole model's), padded to
    /// a multiple of `world_size`.
    pub fn of_shapes(shapes: impl IntoIterator<Item = (String, Shape)>, world_size: usize) -> Self {
        let mut numel = 0;
        let entries = shapes
            .into_iter()
            .map(|(name, shape)| {
                let offset = numel;
                numel += shape.elem_count();
                FlatEntry { name, shape, offset }
            })
            .collect();
        let padded = numel.div_ceil(world_size) * world_size;
        Self { entries, numel, padded }
    }

    /// Elements of real parameters.
    pub fn numel(&self) -> usize {
        self.numel
    }

    /// Elements including the padding: a multiple of the world size.
    pub fn padded_len(&self) -> usize {
        self.padded
    }

    /// The elements rank `rank` of `world_size` owns.
    pub fn shard_range(&self, rank: usize, world_size: usize) -> Range<usize> {
        let len = self.padded / world_size;
        rank * len..(rank + 1) * len
    }

    /// The parameters' shapes, in layout order.
    pub fn shapes(&self) -> impl Iterator<Item = &Shape> {
        self.entries.iter().map(|e| &e.shape)
    }

    /// Each parameter's name and its elements in the flat vector, in layout order.
    pub fn spans(&self) -> impl Iterator<Item = (&str, Range<usize>)> {
        self.entries.iter().map(|e| (e.name.as_str(), e.offset..e.offset + e.shape.elem_count()))
    }

    /// The parameter names, in layout order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.entries.iter().map(|e| e.name.as_str())
    }

    /// One padded f32 buffer from full tensors by name (e.g. a checkpoint's),
    /// a copy outside autograd: FSDP keeps it as master weights for the whole
    /// run, and a buffer that still recorded the variables it was made from
    /// would chain every later update to the one before, keeping them all.
    pub fn flatten(&self, tensors: &HashMap<String, Tensor>, device: &Device) -> Result<Tensor> {
        self.part(tensors, 0..self.padded, device)
    }

    /// One padded buffer of `dtype` on `device` holding `parts`, this
    /// layout's tensors in its order, each cast to `dtype`; a part that is
    /// `None`, and the padding, stay zero. Each part is copied into place
    /// and let go before the next, so the buffer and all the parts are never
    /// held at once (at the root unit, the gradients of the vocabulary's
    /// embedding and head). The buffer records no graph, whatever the parts
    /// carry.
    pub fn concat(
        &self,
        parts: impl IntoIterator<Item = Option<Tensor>>,
        dtype: DType,
        device: &Device,
    ) -> Result<Tensor> {
        let flat = Tensor::zeros(self.padded, dtype, device)?;
        let mut parts = parts.into_iter();
        for (i, entry) in self.entries.iter().enumerate() {
            let Some(part) = parts.next() else {
                bail!("{i} tensors for a layout of {} parameters", self.entries.len());
            };
            let Some(part) = part else { continue };
            if part.shape() != &entry.shape {
                bail!("`{}` has shape {:?}; the layout needs {:?}", entry.name, part.shape(), entry.shape);
            }
            flat.slice_set(&part.to_dtype(dtype)?.flatten_all()?.contiguous()?, 0, entry.offset)?;
        }
        let extra = parts.count();
        if extra > 0 {
            bail!("{} tensors for a layout of {} parameters", self.entries.len() + extra, self.entries.len());
        }
        Ok(flat)
    }

    /// Each parameter of a whole padded buffer as a variable of its own, in
    /// layout order, padding dropped: copies, so the buffer can be freed.
    pub fn split(&self, flat: &Tensor) -> Result<Vec<Var>> {
        self.check_len(flat)?;
        self.entries.iter().map(|e| Var::from_tensor(&self.view(flat, e)?)).collect()
    }

    /// Elements `range` of the buffer [`flatten`](Self::flatten) makes of
    /// `tensors`: a copy, not a view that would keep the whole buffer alive.
    pub fn part(&self, tensors: &HashMap<String, Tensor>, range: Range<usize>, device: &Device) -> Result<Tensor> {
        self.part_scaled(tensors, range, |_| 1.0, device)
    }

    /// [`part`](Self::part) with each parameter's elements times
    /// `factor(name)` (AdamW's decoupled weight decay, `1 − lr · wd`). Built
    /// from the parameters that overlap `range` alone, one at a time: the
    /// whole buffer is never made, and no more than one parameter's copy is
    /// held beside the part.
    pub fn part_scaled(
        &self,
        tensors: &HashMap<String, Tensor>,
        range: Range<usize>,
        factor: impl Fn(&str) -> f64,
        device: &Device,
    ) -> Result<Tensor> {
        if range.end > self.padded {
            bail!("elements {range:?} of a flat buffer of {}", self.padded);
        }
        let part = Tensor::zeros(range.len(), DType::F32, device)?;
        for entry in &self.entries {
            let span = entry.offset..entry.offset + entry.shape.elem_count();
            let (start, end) = (span.start.max(range.start), span.end.min(range.end));
            if start >= end {
                continue;
            }
            let Some(t) = tensors.get(&entry.name) else {
                bail!("no tensor `{}` to flatten", entry.name);
            };
            if t.shape() != &entry.shape {
                bail!("`{}` has shape {:?}; the layout needs {:?}", entry.name, t.shape(), entry.shape);
            }
            let piece =
                t.to_device(device)?.to_dtype(DType::F32)?.flatten_all()?.narrow(0, start - span.start, end - start)?;
            let piece = match factor(&entry.name) {
                1.0 => piece,
                times => (piece * times)?,
            };
            part.slice_set(&piece.contiguous()?, 0, start - range.start)?;
        }
        Ok(part)
    }

    /// The named tensors of a whole padded buffer, padding dropped: views, no copy.
    pub fn unflatten(&self, flat: &Tensor) -> Result<Vec<(String, Tensor)>> {
        self.check_len(flat)?;
        self.entries.iter().map(|e| Ok((e.name.clone(), self.view(flat, e)?))).collect()
    }

    /// The weight decay of every element of `range` of the buffer, as runs
    /// of one parameter's `weight_decay_of(name)`; padding has none.
    pub fn decay_runs(&self, range: Range<usize>, weight_decay_of: impl Fn(&str) -> f64) -> DecayRuns {
        let runs = self.entries.iter().map(|e| (e.offset..e.offset + e.shape.elem_count(), weight_decay_of(&e.name)));
        DecayRuns { len: self.padded, runs: runs.collect() }.slice(range)
    }

    /// `flat` (over the range `decays` were made for) with AdamW's decoupled
    /// weight decay applied, `p · (1 − lr · wd)`, each element with its own
    /// parameter's `wd`; padding becomes zero.
    pub fn decayed(flat: &Tensor, decays: &DecayRuns, lr: f64) -> Result<Tensor> {
        if flat.dims() != [decays.len] {
            bail!("a flat buffer of shape {:?} does not fit the {} elements its decays cover", flat.dims(), decays.len);
        }
        // Built for the step and dropped after it: a factor kept per element
        // would cost as much memory as one of AdamW's moments.
        let mut factor = vec![0f32; decays.len];
        for (run, weight_decay) in &decays.runs {
            factor[run.clone()].fill((1.0 - lr * weight_decay) as f32);
        }
        flat * Tensor::from_vec(factor, decays.len, flat.device())?
    }

    fn view(&self, flat: &Tensor, entry: &FlatEntry) -> Result<Tensor> {
        flat.narrow(0, entry.offset, entry.shape.elem_count())?.reshape(entry.shape.clone())
    }

    fn check_len(&self, flat: &Tensor) -> Result<()> {
        if flat.dims() != [self.padded] {
            bail!(
                "a flat buffer of shape {:?} does not fit this unit's layout ({} elements)",
                flat.dims(),
                self.padded
            );
        }
        Ok(())
    }
}

/// A gathered unit's parameters, one variable each in layout order (from
/// [`FlatLayout::split`]): modules built from them send each parameter's
/// gradient to its own variable.
pub struct UnitParams<'a> {
    pub params: &'a [Var],
    pub layout: &'a FlatLayout,
}

impl Weights for UnitParams<'_> {
    fn tensor(&self, name: &str) -> Result<Tensor> {
        let Some(index) = self.layout.entries.iter().position(|e| e.name == name) else {
            bail!("parameter `{name}` is not in this FSDP unit");
        };
        match self.params.get(index) {
            Some(param) => Ok(param.as_tensor().clone()),
            None => bail!("{} variables for a layout of {} parameters", self.params.len(), self.layout.entries.len()),
        }
    }
}
