//! The rotary cache: the cosines and sines of every position's angles.

use candle_core::{bail, DType, Device, Result, Tensor};

/// Precomputed `cos` and `sin` tables for rotary position embeddings.
///
/// For head dimension D, pair i of each vector turns at frequency
/// `inv_freq[i] = theta^(-2i/D)`; position t turns it by `t * inv_freq[i]`.
/// Each table is (max_seq_len, D): the D/2 angles repeated for both halves,
/// the layout `rotate_half` (exercise 2) expects.
#[derive(Debug, Clone)]
pub struct RotaryCache {
    cos: Tensor,
    sin: Tensor,
}

impl RotaryCache {
    pub fn new(head_dim: usize, max_seq_len: usize, theta: f64, device: &Device) -> Result<Self> {
        let inv_freq: Vec<f32> =
            (0..head_dim / 2).map(|i| (1.0 / theta.powf(2.0 * i as f64 / head_dim as f64)) as f32).collect();
        let inv_freq = Tensor::from_vec(inv_freq, (1, head_dim / 2), device)?;
        let positions =
            Tensor::arange(0u32, max_seq_len as u32, device)?.to_dtype(DType::F32)?.reshape((max_seq_len, 1))?;
        let angles = positions.broadcast_mul(&inv_freq)?; // (T, D/2)
        let angles = Tensor::cat(&[&angles, &angles], 1)?; // (T, D)
        Ok(Self { cos: angles.cos()?, sin: angles.sin()? })
    }

    /// The tables stored in `dtype` (FSDP's buffer dtype).
    pub fn to_dtype(&self, dtype: DType) -> Result<Self> {
        Ok(Self { cos: self.cos.to_dtype(dtype)?, sin: self.sin.to_dtype(dtype)? })
    }

    /// The (T, D) cosine and sine tables of the first `seq_len` positions, in `dtype`.
    pub fn get(&self, seq_len: usize, dtype: DType) -> Result<(Tensor, Tensor)> {
        let max = self.cos.dim(0)?;
        if seq_len > max {
            bail!("sequence of {seq_len} tokens is longer than the model's max_seq_len {max}");
        }
        let cos = self.cos.narrow(0, 0, seq_len)?.to_dtype(dtype)?;
        let sin = self.sin.narrow(0, 0, seq_len)?.to_dtype(dtype)?;
        Ok((cos, sin))
    }
}
