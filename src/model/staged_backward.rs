//! Backward one stage at a time, each gradient handed over the moment it is
//! final: the workbook's stand-in for PyTorch's per-parameter gradient hooks,
//! which candle does not have (its `backward` computes every gradient in one
//! call). DDP starts a bucket's all-reduce from here while backward goes on.
//!
//! The stages, in the order backward finishes them: the loss's own backward
//! (the head's and the final norm's gradients are then final), each block,
//! last first (its gradients are final), and the embedding's with the first
//! block. The blocks must have run through the recompute engine with their
//! graphs kept ([`Gpt::with_blockwise_backward`](super::Gpt::with_blockwise_backward)).

use std::sync::atomic::{AtomicU64, Ordering};

use candle_core::backprop::GradStore;
use candle_core::{bail, Result, Tensor};

use super::{layer_of, param_specs, ForwardPass, GptConfig, ParamStore};
use crate::autograd::take_gradient_of;

/// Every gradient [`ForwardPass::backward_as_ready`] has handed over in this
/// process so far.
static HANDED_OVER: AtomicU64 = AtomicU64::new(0);

/// How many gradients [`ForwardPass::backward_as_ready`] has handed over in
/// this process so far: what a check reads, as a collective starts or is
/// waited for, to see how far backward had got (one rank per process).
pub fn gradients_handed_over() -> u64 {
    HANDED_OVER.load(Ordering::SeqCst)
}

/// What backward has finished at one point of its course.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// The loss's own backward: the final norm and the head.
    Head,
    /// Block `i`'s backward.
    Block(usize),
    /// The first block's input, pushed through the embedding.
    Embedding,
}

/// The stage after which `name`'s gradient is final.
fn final_after(name: &str) -> Stage {
    match layer_of(name) {
        Some(layer) => Stage::Block(layer),
        None if name == "model.embed_tokens.weight" => Stage::Embedding,
        None => Stage::Head,
    }
}

impl ForwardPass {
    /// Runs backward stage by stage and calls `on_final(name, gradient)` for
    /// every parameter of `params` as soon as its gradient is final: each
    /// gradient once, as an f32 tensor of the parameter's shape, parameters in
    /// reverse model order (the head first, the embedding last). A gradient
    /// handed over leaves backward's store, which would otherwise keep a second
    /// copy of every gradient until backward ends. An error from `on_final`
    /// stops backward and is returned.
    pub fn backward_as_ready(
        &self,
        config: &GptConfig,
        params: &ParamStore,
        mut on_final: impl FnMut(&str, Tensor) -> Result<()>,
    ) -> Result<()> {
        let Some(loss) = &self.loss else { bail!("backward needs a loss: call forward with labels") };
        if self.recompute.is_split() {
            bail!("a batch split across threads hands its gradients over when backward ends: run it whole");
        }
        if self.recompute.len() != config.num_layers {
            bail!(
                "backward one block at a time needs every block in the recompute engine, but the forward ran {} of \
                 {} blocks there: build the model with `with_blockwise_backward`",
                self.recompute.len(),
                config.num_layers
            );
        }
        let in_backward_order: Vec<String> = param_specs(config).into_iter().rev().map(|spec| spec.name).collect();
        let mut hand_over = |grads: &mut GradStore, stage: Stage| -> Result<()> {
            for name in in_backward_order.iter().filter(|name| final_after(name) == stage) {
                let gradient = take_gradient_of(params.get(name)?, grads)?;
                HANDED_OVER.fetch_add(1, Ordering::SeqCst);
                on_final(name, gradient)?;
            }
            Ok(())
        };
        let mut grads = loss.backward()?;
        hand_over(&mut grads, Stage::Head)?;
        for layer in (0..config.num_layers).rev() {
            self.recompute.backward_through(layer, &mut grads)?;
            hand_over(&mut grads, Stage::Block(layer))?;
        }
        hand_over(&mut grads, Stage::Embedding)
    }
}
