//! The root unit's modules (embedding, final norm, head) run so that their
//! whole parameters can be freed as early as the numbers allow, and without
//! the step's largest transients: the embedding keeps no graph (its weight's
//! gradient needs only the token ids), and the head's weight gradient is one
//! matmul. FSDP's trainer and a mesh's FSDP stages both run them.

use candle_core::backprop::GradStore;
use candle_core::{bail, Module, Result, Tensor, Var};

use crate::autograd::{accumulate, vjp};
use crate::model::{Linear, RmsNorm};
use crate::phase1_model::next_token_loss;

/// The final norm, head and loss on the last block's output, as
/// [`head_forward`] leaves them for [`head_backward`].
pub(crate) struct HeadPass {
    /// The last block's output, a leaf the head's backward reports on.
    output: Var,
    /// The final norm of `output`, (B·T, C), with its graph back to it.
    normed: Tensor,
    /// The head's output, (B·T, V): a leaf, since [`head_backward`] works
    /// out the head's weight gradient itself.
    logits: Var,
    /// The mean next-token loss, an f32 scalar.
    pub loss: Tensor,
}

/// The final norm, head and next-token loss of `x` (B, T, C), the last
/// block's output, against `tokens` (B, T).
pub(crate) fn head_forward(norm: &RmsNorm, lm_head: &Linear, x: &Tensor, tokens: &Tensor) -> Result<HeadPass> {
    let output = Var::from_tensor(x)?;
    let normed = norm.forward(output.as_tensor())?;
    let (b, t, c) = normed.dims3()?;
    let normed = normed.reshape((b * t, c))?;
    let logits = Var::from_tensor(&lm_head.forward(&normed.detach())?)?;
    let loss = next_token_loss(&logits.reshape((b, t, ()))?, tokens)?;
    Ok(HeadPass { output, normed, logits, loss })
}

/// The head's backward from the loss, times `seed` (the loss's gradient: a
/// micro-batch's weight, a loss scale): the gradients of the final norm's
/// and the head's weights, keyed by them, and of the last block's output.
/// The head's weight gradient, (V, C), is one matmul here: candle's
/// backward would add it into zeros of its own, for the transposed weight
/// and again for the weight, holding three copies of the vocabulary's
/// matrix at once, the step's largest transient.
pub(crate) fn head_backward(lm_head: &Linear, head: HeadPass, seed: f64) -> Result<(GradStore, Tensor)> {
    let HeadPass { output, normed, logits, loss } = head;
    let loss = match seed {
        1.0 => loss,
        seed => (loss * seed)?,
    };
    let Some(grad_logits) = loss.backward()?.remove(logits.as_tensor()) else {
        bail!("the loss does not depend on the head's output");
    };
    // Detached, so that the weight's gradient does not hold the logits' graph.
    let grad_logits = grad_logits.detach();
    let weight = lm_head.weight();
    // Laid out as the weight, (V, C): a transposed result would be copied
    // again when the root's flat gradient is built.
    let grad_weight = grad_logits.t()?.matmul(&normed.detach())?;
    let grad_normed = grad_logits.matmul(&weight.detach())?;
    drop(grad_logits);
    let mut grads = vjp(&normed, &grad_normed)?;
    accumulate(&mut grads, weight, grad_weight)?;
    let Some(grad_output) = grads.remove(output.as_tensor()) else {
        bail!("the loss does not depend on the last block's output");
    };
    Ok((grads, grad_output))
}

/// The token embedding's weight gradient, (V, C): each position's row of
/// `grad_embedded` (B, T, C) added into the row of its token id in `tokens`.
/// The weight itself is not needed, so the root need not be gathered.
pub(crate) fn embedding_grad(tokens: &Tensor, grad_embedded: &Tensor, vocab_size: usize) -> Result<Tensor> {
    let (b, t, c) = grad_embedded.dims3()?;
    let rows = grad_embedded.detach().reshape((b * t, c))?;
    Tensor::zeros((vocab_size, c), rows.dtype(), rows.device())?.index_add(&tokens.flatten_all()?, &rows, 0)
}
