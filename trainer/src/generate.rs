//! Text generation from a trained model: sample one token at a time.

use candle_core::{DType, Device, Result, Tensor, D};
use rand::distr::{weighted::WeightedIndex, Distribution};
use rand_chacha::ChaCha8Rng;
use workbook::Gpt;

/// How to pick each next token.
#[derive(Debug, Clone, Copy)]
pub struct Sampling {
    /// 0 picks the most likely token (greedy); higher flattens the distribution.
    pub temperature: f64,
    /// Sample only among the `top_k` most likely tokens (0: all).
    pub top_k: usize,
}

/// Extends `prompt` by up to `max_new_tokens` tokens, stopping early at `stop`
/// (which is not returned). The model sees at most the last `context_len`
/// tokens: positions beyond those it was trained on have rotary angles it never learned.
pub fn generate(
    model: &Gpt,
    prompt: &[u32],
    max_new_tokens: usize,
    context_len: usize,
    sampling: Sampling,
    stop: Option<u32>,
    rng: &mut ChaCha8Rng,
) -> Result<Vec<u32>> {
    let context_len = context_len.clamp(1, model.config().max_seq_len);
    let mut tokens = prompt.to_vec();
    for _ in 0..max_new_tokens {
        let start = tokens.len().saturating_sub(context_len);
        let idx = Tensor::new(&tokens[start..], &Device::Cpu)?.unsqueeze(0)?; // (1, T)
        let logits = model.forward(&idx, None)?.logits; // (1, T, V)
        let last = logits.squeeze(0)?.get(tokens.len() - start - 1)?.to_dtype(DType::F32)?; // (V)
        if last.to_vec1::<f32>()?.iter().any(|l| !l.is_finite()) {
            // argmax would pick token 0 and sampling would fail on the weights: say why instead.
            candle_core::bail!(
                "the model's scores for the next token are not finite (NaN or infinity): its weights are broken, \
                 from a training run that diverged; use an earlier checkpoint"
            );
        }
        let next = pick(&last, sampling, rng)?;
        if Some(next) == stop {
            break;
        }
        tokens.push(next);
    }
    Ok(tokens[prompt.len()..].to_vec())
}

fn pick(logits: &Tensor, sampling: Sampling, rng: &mut ChaCha8Rng) -> Result<u32> {
    if sampling.temperature <= 0.0 {
        return logits.argmax(D::Minus1)?.to_scalar::<u32>();
    }
    let probs = candle_nn_softmax(&(logits / sampling.temperature)?)?;
    let mut weights = probs.to_vec1::<f32>()?;
    if sampling.top_k > 0 && sampling.top_k < weights.len() {
        let mut sorted = weights.clone();
        sorted.sort_by(|a, b| b.total_cmp(a));
        let threshold = sorted[sampling.top_k - 1];
        weights.iter_mut().filter(|w| **w < threshold).for_each(|w| *w = 0.0);
    }
    let dist = WeightedIndex::new(&weights).map_err(candle_core::Error::wrap)?;
    Ok(dist.sample(rng) as u32)
}

/// Softmax of a 1-D tensor, in f32.
fn candle_nn_softmax(x: &Tensor) -> Result<Tensor> {
    let shifted = x.broadcast_sub(&x.max_keepdim(D::Minus1)?)?;
    let exp = shifted.exp()?;
    exp.broadcast_div(&exp.sum_keepdim(D::Minus1)?)
}
