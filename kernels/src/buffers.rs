//! Tensors as flat byte buffers, and the elementwise sum a reducing collective
//! applies to them.
//!
//! A communication backend that moves tensors over sockets sends their bytes
//! and adds what it receives into what it holds, chunk by chunk, a few hundred
//! megabytes a step at GPT-2's size. These loops sit here, in the crate that is
//! optimised in every build, rather than in the backend.

use candle_core::{bail, CpuStorage, DType, Device, Layout, Result, Storage, Tensor};
use half::{bf16, f16};

/// A tensor's elements, flat, in a vector of their own type, to be handled as
/// bytes: taken from a tensor with one copy and made a tensor again with none.
#[derive(Debug, Clone, PartialEq)]
pub enum Elements {
    F32(Vec<f32>),
    BF16(Vec<bf16>),
    F16(Vec<f16>),
    U32(Vec<u32>),
    I64(Vec<i64>),
    U8(Vec<u8>),
}

impl Elements {
    /// The tensor's elements in row-major order.
    pub fn of(t: &Tensor) -> Result<Self> {
        let flat = t.flatten_all()?;
        Ok(match t.dtype() {
            DType::F32 => Self::F32(flat.to_vec1()?),
            DType::BF16 => Self::BF16(flat.to_vec1()?),
            DType::F16 => Self::F16(flat.to_vec1()?),
            DType::U32 => Self::U32(flat.to_vec1()?),
            DType::I64 => Self::I64(flat.to_vec1()?),
            DType::U8 => Self::U8(flat.to_vec1()?),
            other => bail!("cannot send a {} tensor: convert it to f32 first", other.as_str()),
        })
    }

    /// `len` zeros of `dtype`.
    pub fn zeros(dtype: DType, len: usize) -> Result<Self> {
        Ok(match dtype {
            DType::F32 => Self::F32(vec![0.0; len]),
            DType::BF16 => Self::BF16(vec![bf16::ZERO; len]),
            DType::F16 => Self::F16(vec![f16::ZERO; len]),
            DType::U32 => Self::U32(vec![0; len]),
            DType::I64 => Self::I64(vec![0; len]),
            DType::U8 => Self::U8(vec![0; len]),
            other => bail!("cannot receive a {} tensor: convert it to f32 first", other.as_str()),
        })
    }

    /// The elements as little-endian bytes (every supported platform is little-endian).
    pub fn bytes(&self) -> &[u8] {
        match self {
            Self::F32(v) => bytemuck::cast_slice(v),
            Self::BF16(v) => bytemuck::cast_slice(v),
            Self::F16(v) => bytemuck::cast_slice(v),
            Self::U32(v) => bytemuck::cast_slice(v),
            Self::I64(v) => bytemuck::cast_slice(v),
            Self::U8(v) => v,
        }
    }

    /// Every element times `mul`, plus 0, in place, each operation rounded
    /// to the dtype as candle's `affine` rounds it: an average taken here
    /// equals the tensor's `sum / n` bit for bit, without a second buffer.
    pub fn scale(&mut self, mul: f64) -> Result<()> {
        match self {
            Self::F32(v) => {
                let (mul, zero) = (mul as f32, 0f32);
                v.iter_mut().for_each(|x| *x = *x * mul + zero);
            }
            Self::BF16(v) => {
                let (mul, zero) = (bf16::from_f64(mul), bf16::from_f64(0.0));
                v.iter_mut().for_each(|x| *x = *x * mul + zero);
            }
            Self::F16(v) => {
                let (mul, zero) = (f16::from_f64(mul), f16::from_f64(0.0));
                v.iter_mut().for_each(|x| *x = *x * mul + zero);
            }
            _ => bail!("reductions scale f32, bf16 or f16 elements"),
        }
        Ok(())
    }

    pub fn bytes_mut(&mut self) -> &mut [u8] {
        match self {
            Self::F32(v) => bytemuck::cast_slice_mut(v),
            Self::BF16(v) => bytemuck::cast_slice_mut(v),
            Self::F16(v) => bytemuck::cast_slice_mut(v),
            Self::U32(v) => bytemuck::cast_slice_mut(v),
            Self::I64(v) => bytemuck::cast_slice_mut(v),
            Self::U8(v) => v,
        }
    }

    /// A tensor of `shape` on `device` holding these elements (no copy on the CPU).
    pub fn into_tensor(self, shape: &[usize], device: &Device) -> Result<Tensor> {
        match self {
            Self::F32(v) => Tensor::from_vec(v, shape, device),
            Self::BF16(v) => Tensor::from_vec(v, shape, device),
            Self::F16(v) => Tensor::from_vec(v, shape, device),
            Self::U32(v) => Tensor::from_vec(v, shape, device),
            Self::I64(v) => Tensor::from_vec(v, shape, device),
            Self::U8(v) => Tensor::from_vec(v, shape, device),
        }
    }
}

/// The bytes of a contiguous tensor in memory whose dtype collectives sum
/// (f32, bf16, f16), where they lie; `None` for any other tensor.
pub fn reducible_bytes<'a>(storage: &'a Storage, layout: &Layout) -> Option<&'a [u8]> {
    let (start, end) = layout.contiguous_offsets()?;
    match storage {
        Storage::Cpu(CpuStorage::F32(v)) => Some(bytemuck::cast_slice(&v[start..end])),
        Storage::Cpu(CpuStorage::BF16(v)) => Some(bytemuck::cast_slice(&v[start..end])),
        Storage::Cpu(CpuStorage::F16(v)) => Some(bytemuck::cast_slice(&v[start..end])),
        _ => None,
    }
}

/// `acc[i] += other[i]` for every element, in `dtype`: bf16 and f16 sums are
/// rounded back to their dtype after every addition, as NCCL rounds at every
/// hop of its ring.
pub fn add_assign(dtype: DType, acc: &mut [u8], other: &[u8]) -> Result<()> {
    if acc.len() != other.len() {
        bail!("add_assign: buffers of {} and {} bytes", acc.len(), other.len());
    }
    match dtype {
        DType::F32 => add_each::<4>(acc, other, |a, b| (f32::from_le_bytes(a) + f32::from_le_bytes(b)).to_le_bytes()),
        DType::BF16 => add_each::<2>(acc, other, |a, b| {
            let sum = bf16::from_le_bytes(a).to_f32() + bf16::from_le_bytes(b).to_f32();
            bf16::from_f32(sum).to_le_bytes()
        }),
        DType::F16 => add_each::<2>(acc, other, |a, b| {
            let sum = f16::from_le_bytes(a).to_f32() + f16::from_le_bytes(b).to_f32();
            f16::from_f32(sum).to_le_bytes()
        }),
        other => bail!("reductions add f32, bf16 or f16 elements, got {}", other.as_str()),
    }
    Ok(())
}

fn add_each<const N: usize>(acc: &mut [u8], other: &[u8], add: impl Fn([u8; N], [u8; N]) -> [u8; N]) {
    for (a, b) in acc.chunks_exact_mut(N).zip(other.chunks_exact(N)) {
        let sum = add(a.try_into().expect("chunks of N"), b.try_into().expect("chunks of N"));
        a.copy_from_slice(&sum);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The average a collective takes in its own buffer is the one `sum / n`
    /// gives, to the bit, in every dtype it reduces (signed zeros,
    /// subnormals and roundings included).
    #[test]
    fn scale_equals_candles_division_bit_for_bit() -> Result<()> {
        let values: Vec<f32> = [-0.0, 0.0, 1.0, -3.0, 1e-40, 3.3e38, 0.1, 65504.0, -7.77e-5]
            .into_iter()
            .chain((0..200).map(|i| (i as f32 * 0.37).sin() * 10f32.powi(i % 9 - 4)))
            .collect();
        for dtype in [DType::F32, DType::BF16, DType::F16] {
            for n in [2, 3, 4, 7] {
                let sum = Tensor::new(values.as_slice(), &Device::Cpu)?.to_dtype(dtype)?;
                let want = Elements::of(&(&sum / n as f64)?)?;
                let mut got = Elements::of(&sum)?;
                got.scale(1.0 / n as f64)?;
                assert_eq!(got, want, "{dtype:?} divided by {n}");
            }
        }
        Ok(())
    }
}
