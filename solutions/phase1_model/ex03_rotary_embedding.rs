//! Reference solution of exercise 3: rotary position embedding.

use candle_core::{Result, Tensor};

use crate::rotate_half;

pub fn apply_rotary_pos_emb(q: &Tensor, k: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<(Tensor, Tensor)> {
    let rotate = |x: &Tensor| x.broadcast_mul(cos)? + rotate_half(x)?.broadcast_mul(sin)?;
    Ok((rotate(q)?, rotate(k)?))
}
