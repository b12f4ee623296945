//! The process group of a run on one device: world size 1.

use std::cell::RefCell;

use candle_core::{Result, Tensor};

use super::collective::{check_peer, combine, Call, Outcome};
use super::{Collective, CommStats, ProcessGroup, Properties, ReduceOp};

/// A group of one rank, so a trainer written for a [`ProcessGroup`] also runs
/// without any distribution. Every collective returns (a copy of) its input;
/// calls are still checked and counted, so a single-process run reports the
/// traffic the same trainer would cause on more ranks.
#[derive(Debug, Default)]
pub struct SingleProcess {
    stats: RefCell<CommStats>,
}

impl SingleProcess {
    pub fn new() -> Self {
        Self::default()
    }

    /// Runs the collective on the one input there is.
    fn run(&self, call: Call, input: Option<&Tensor>) -> Result<Outcome> {
        call.check(input, 1)?;
        self.stats.borrow_mut().record(call.kind(), call.payload_bytes(input, 1));
        let inputs: Vec<Tensor> = input.map(Tensor::detach).into_iter().collect();
        combine(call, &inputs)
    }

    fn exchange(&self, call: Call, t: &Tensor) -> Result<Tensor> {
        self.run(call, Some(t))?.deliver(0, t)
    }
}

impl ProcessGroup for SingleProcess {
    fn rank(&self) -> usize {
        0
    }

    fn world_size(&self) -> usize {
        1
    }

    fn properties(&self) -> Properties {
        Properties { rank_order_reduction: true, detects_dead_peers: true, overlaps: false, buffered_sends: true }
    }

    fn all_reduce(&self, t: &Tensor, op: ReduceOp) -> Result<Tensor> {
        self.exchange(Call::AllReduce(op), t)
    }

    fn broadcast(&self, t: &Tensor, root: usize) -> Result<Tensor> {
        self.exchange(Call::Broadcast { root }, t)
    }

    fn all_gather(&self, t: &Tensor) -> Result<Tensor> {
        self.exchange(Call::AllGather, t)
    }

    fn reduce_scatter(&self, t: &Tensor, op: ReduceOp) -> Result<Tensor> {
        self.exchange(Call::ReduceScatter(op), t)
    }

    /// Always an error: a group of one rank has no peer.
    fn send(&self, _t: &Tensor, dst: usize) -> Result<()> {
        check_peer(Collective::Send, dst, 0, 1)
    }

    /// Always an error: a group of one rank has no peer.
    fn recv(&self, _like: &Tensor, src: usize) -> Result<Tensor> {
        check_peer(Collective::Recv, src, 0, 1)?;
        candle_core::bail!("recv: a group of one rank has no peer")
    }

    fn barrier(&self) -> Result<()> {
        self.run(Call::Barrier, None).map(drop)
    }

    /// A group of one splits into a group of one, whatever the colour.
    fn split(&self, _color: usize) -> Result<Box<dyn ProcessGroup>> {
        self.run(Call::AllGather, Some(&Tensor::zeros(1, candle_core::DType::F32, &candle_core::Device::Cpu)?))?;
        Ok(Box::new(Self::new()))
    }

    fn stats(&self) -> CommStats {
        self.stats.borrow().clone()
    }
}
