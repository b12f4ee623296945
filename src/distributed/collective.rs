//! What each collective computes, whatever carries the data: the argument
//! checks, the payload size and the arithmetic that every backend shares.

use std::fmt;
use std::ops::Range;

use candle_core::{bail, Result, Tensor};

use super::reduce_op::{check_reducible, reduce};
use super::ReduceOp;

/// The kinds of collective, as counted in [`CommStats`](super::CommStats).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Collective {
    AllReduce,
    Broadcast,
    AllGather,
    ReduceScatter,
    Barrier,
    /// Point-to-point: this rank sent a tensor to one peer.
    Send,
    /// Point-to-point: this rank received a tensor from one peer.
    Recv,
}

impl Collective {
    /// Every kind, in the order the stats list them.
    pub const ALL: [Collective; 7] = [
        Collective::AllReduce,
        Collective::Broadcast,
        Collective::AllGather,
        Collective::ReduceScatter,
        Collective::Barrier,
        Collective::Send,
        Collective::Recv,
    ];

    /// The method's name: `all_reduce`, `broadcast`, ...
    pub fn name(self) -> &'static str {
        match self {
            Collective::AllReduce => "all_reduce",
            Collective::Broadcast => "broadcast",
            Collective::AllGather => "all_gather",
            Collective::ReduceScatter => "reduce_scatter",
            Collective::Barrier => "barrier",
            Collective::Send => "send",
            Collective::Recv => "recv",
        }
    }
}

impl fmt::Display for Collective {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One rank's call of a collective with its arguments (the tensor aside).
/// Every rank must make the same call for a collective to proceed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Call {
    AllReduce(ReduceOp),
    Broadcast { root: usize },
    AllGather,
    ReduceScatter(ReduceOp),
    Barrier,
}

impl fmt::Display for Call {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Call::AllReduce(op) | Call::ReduceScatter(op) => write!(f, "{}({op})", self.kind()),
            Call::Broadcast { root } => write!(f, "broadcast(root {root})"),
            Call::AllGather | Call::Barrier => write!(f, "{}", self.kind()),
        }
    }
}

impl Call {
    pub(crate) fn kind(self) -> Collective {
        match self {
            Call::AllReduce(_) => Collective::AllReduce,
            Call::Broadcast { .. } => Collective::Broadcast,
            Call::AllGather => Collective::AllGather,
            Call::ReduceScatter(_) => Collective::ReduceScatter,
            Call::Barrier => Collective::Barrier,
        }
    }

    /// The checks one rank can make alone, before meeting the others.
    pub(crate) fn check(self, input: Option<&Tensor>, world_size: usize) -> Result<()> {
        let name = self.kind().name();
        match (self, input) {
            (Call::Barrier, None) => Ok(()),
            (Call::Barrier, Some(_)) | (_, None) => {
                bail!("{name}: a backend passed the wrong arguments (a bug in the backend)")
            }
            (Call::AllReduce(_), Some(t)) => check_reducible(name, t.dtype()),
            (Call::Broadcast { root }, Some(_)) => {
                if root >= world_size {
                    bail!("broadcast: root {root} is not a rank of this group (ranks 0..{world_size})");
                }
                Ok(())
            }
            (Call::AllGather, Some(_)) => Ok(()),
            (Call::ReduceScatter(_), Some(t)) => {
                check_reducible(name, t.dtype())?;
                let Some(&rows) = t.dims().first() else {
                    bail!("reduce_scatter: a scalar cannot be split across ranks; pass a tensor with at least one dimension");
                };
                if rows % world_size != 0 {
                    bail!("reduce_scatter: dim 0 of size {rows} does not divide across {world_size} ranks; pad it to a multiple of the world size");
                }
                Ok(())
            }
        }
    }

    /// The bytes of the NCCL buffer this call hands over: the tensor for
    /// all-reduce and broadcast, the (world_size times larger) output for
    /// all-gather, the full input for reduce-scatter.
    pub(crate) fn payload_bytes(self, input: Option<&Tensor>, world_size: usize) -> u64 {
        let bytes = input.map_or(0, |t| t.elem_count() * t.dtype().size_in_bytes()) as u64;
        match self {
            Call::AllGather => bytes * world_size as u64,
            _ => bytes,
        }
    }
}

/// The check of a point-to-point call's peer: another rank of the group.
pub(crate) fn check_peer(kind: Collective, peer: usize, rank: usize, world_size: usize) -> Result<()> {
    let role = if kind == Collective::Send { "dst" } else { "src" };
    if peer >= world_size {
        bail!("{kind}: {role} {peer} is not a rank of this group (ranks 0..{world_size})");
    }
    if peer == rank {
        bail!("{kind}: rank {rank} named itself as {role}; point-to-point calls go to another rank");
    }
    Ok(())
}

/// What a collective produced, before each rank takes its part.
pub(crate) enum Outcome {
    /// The same tensor for every rank (all-reduce, broadcast, all-gather).
    Everyone(Tensor),
    /// One tensor per rank, in rank order (reduce-scatter).
    PerRank(Vec<Tensor>),
    /// No data (barrier).
    Nothing,
}

/// Runs the collective on every rank's input, given in rank order: all on one
/// device, checked to be of one shape and dtype. The outcome holds none of
/// the other ranks' inputs: a rank is released as soon as it is made, and may
/// update its own tensor in place before the others have taken theirs.
pub(crate) fn combine(call: Call, inputs: &[Tensor]) -> Result<Outcome> {
    Ok(match call {
        Call::AllReduce(op) => Outcome::Everyone(reduce(inputs, op)?),
        // A copy: the root's input may be its variable's own storage.
        Call::Broadcast { root } => Outcome::Everyone(inputs[root].copy()?),
        Call::AllGather => {
            // NCCL gathers flat buffers: a scalar is one element, shape [1].
            let rows = inputs
                .iter()
                .map(|t| if t.rank() == 0 { t.reshape(1) } else { Ok(t.clone()) })
                .collect::<Result<Vec<_>>>()?;
            Outcome::Everyone(Tensor::cat(&rows, 0)?)
        }
        Call::ReduceScatter(op) => {
            let total = reduce(inputs, op)?; // (N * chunk, ...)
            let chunk = total.dim(0)? / inputs.len();
            let parts = (0..inputs.len()).map(|r| total.narrow(0, r * chunk, chunk));
            Outcome::PerRank(parts.collect::<Result<_>>()?) // N × (chunk, ...)
        }
        Call::Barrier => Outcome::Nothing,
    })
}

impl Outcome {
    /// Rank `rank`'s result, in the dtype and on the device of `input`. The
    /// ranks may share the outcome's storage: it holds no rank's input (see
    /// [`combine`]), and a candle tensor changes only through a `Var`, which
    /// copies what it is made from.
    pub(crate) fn deliver(&self, rank: usize, input: &Tensor) -> Result<Tensor> {
        let data = match self {
            Outcome::Everyone(t) => t,
            Outcome::PerRank(parts) => &parts[rank],
            Outcome::Nothing => bail!("a barrier delivers no tensor (a bug in the backend)"),
        };
        let own = if data.dtype() == input.dtype() { data.force_contiguous()? } else { data.to_dtype(input.dtype())? };
        Ok(own.to_device(input.device())?.detach())
    }
}

/// `len` elements cut into `parts` chunks as even as they go, as element
/// ranges in order: the first `len % parts` chunks are one element longer
/// (10 into 4: 3, 3, 2, 2). The ring algorithms cut their buffers this way,
/// so chunk `c` is the same elements on every rank.
pub fn chunk_ranges(len: usize, parts: usize) -> Vec<Range<usize>> {
    let (base, extra) = (len / parts.max(1), len % parts.max(1));
    let mut start = 0;
    (0..parts)
        .map(|i| {
            let n = base + usize::from(i < extra);
            start += n;
            start - n..start
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use candle_core::{Device, Var};

    use super::*;

    /// The root updates its variable in place right after a broadcast (an
    /// optimizer step) while another rank has yet to take its result.
    #[test]
    fn a_broadcast_keeps_the_roots_value_when_the_root_updates_it_afterwards() {
        let root = Var::from_tensor(&Tensor::full(7f32, 4, &Device::Cpu).unwrap()).unwrap();
        let other = Tensor::zeros(4, candle_core::DType::F32, &Device::Cpu).unwrap();
        let outcome = combine(Call::Broadcast { root: 0 }, &[root.as_tensor().clone(), other.clone()]).unwrap();
        root.set(&Tensor::zeros(4, candle_core::DType::F32, &Device::Cpu).unwrap()).unwrap();
        let received = outcome.deliver(1, &other).unwrap();
        assert_eq!(received.to_vec1::<f32>().unwrap(), [7.0; 4]);
    }
}
