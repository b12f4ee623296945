//! Tensors as flat byte buffers, and the elementwise sum a reducing collective
//! applies to them.
//!
//! A communication backend that moves tensors over sockets sends their bytes
//! and adds what it receives into what it holds, chunk by chunk, a few hundred
//! megabytes a step at GPT-2's size. These loops sit here, in the crate that is
//! optimised in every build, rather than in the backend.

use candle_core::{bail, CpuStorage, DType, Device, Result, Storage, Tensor};
use half::{bf16, f16};

/// The tensor's elements in row-major order, as little-endian bytes.
pub fn to_bytes(t: &Tensor) -> Result<Vec<u8>> {
    let t = t.contiguous()?; // no copy when it already is
    let (storage, layout) = t.storage_and_layout();
    if let (Storage::Cpu(cpu), Some((start, end))) = (&*storage, layout.contiguous_offsets()) {
        // One copy, straight from the storage.
        match cpu {
            CpuStorage::F32(v) => return Ok(bytemuck::cast_slice(&v[start..end]).to_vec()),
            CpuStorage::U32(v) => return Ok(bytemuck::cast_slice(&v[start..end]).to_vec()),
            CpuStorage::U8(v) => return Ok(v[start..end].to_vec()),
            _ => {}
        }
    }
    drop(storage);
    let flat = t.flatten_all()?;
    Ok(match t.dtype() {
        DType::F32 => bytemuck::cast_slice(&flat.to_vec1::<f32>()?).to_vec(),
        DType::BF16 => bytemuck::cast_slice(&bits(&flat.to_vec1::<bf16>()?, bf16::to_bits)).to_vec(),
        DType::F16 => bytemuck::cast_slice(&bits(&flat.to_vec1::<f16>()?, f16::to_bits)).to_vec(),
        DType::U32 => bytemuck::cast_slice(&flat.to_vec1::<u32>()?).to_vec(),
        DType::I64 => bytemuck::cast_slice(&flat.to_vec1::<i64>()?).to_vec(),
        DType::U8 => flat.to_vec1::<u8>()?,
        other => bail!("cannot send a {} tensor: convert it to f32 first", other.as_str()),
    })
}

/// The tensor of `shape` and `dtype` whose bytes are `bytes` (as [`to_bytes`] wrote them).
pub fn from_bytes(bytes: &[u8], dtype: DType, shape: &[usize], device: &Device) -> Result<Tensor> {
    Tensor::from_raw_buffer(bytes, dtype, shape, device)
}

/// `acc[i] += other[i]` for every element, in `dtype`: bf16 and f16 sums are
/// rounded back to their dtype after every addition, as NCCL rounds at every
/// hop of its ring.
pub fn add_assign(dtype: DType, acc: &mut [u8], other: &[u8]) -> Result<()> {
    if acc.len() != other.len() {
        bail!("add_assign: buffers of {} and {} bytes", acc.len(), other.len());
    }
    match dtype {
        DType::F32 => add_each::<4>(acc, other, |a, b| {
            (f32::from_le_bytes(a) + f32::from_le_bytes(b)).to_le_bytes()
        }),
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

fn bits<T: Copy>(values: &[T], to_bits: fn(T) -> u16) -> Vec<u16> {
    values.iter().map(|&v| to_bits(v)).collect()
}

fn add_each<const N: usize>(acc: &mut [u8], other: &[u8], add: impl Fn([u8; N], [u8; N]) -> [u8; N]) {
    for (a, b) in acc.chunks_exact_mut(N).zip(other.chunks_exact(N)) {
        let sum = add(a.try_into().expect("chunks of N"), b.try_into().expect("chunks of N"));
        a.copy_from_slice(&sum);
    }
}
