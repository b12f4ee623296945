//! Offloading: what only the optimizer step reads (AdamW's moments, and f32
//! master weights the all-gathers do not read) waits in a file between steps
//! and is read back for the step alone, so that forward and backward run
//! without it in memory. PyTorch's `CPUOffload` moves a GPU's state to host
//! memory; a CPU rank's next level down is the disk, as DeepSpeed's
//! ZeRO-Infinity offloads to NVMe.
//!
//! Plain reads and writes rather than a memory map: candle copies a tensor's
//! data into memory it owns either way, and a file the process does not map
//! never counts in its resident memory.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use candle_core::{bail, DType, Device, Result, Tensor};

use super::shard::bytes;

/// One rank's offload file: regions appended as tensors are offloaded.
#[derive(Debug)]
pub struct OffloadFile {
    /// The file and the length handed out so far.
    file: Mutex<(File, u64)>,
    /// Where it was made, for messages (its name is gone, see [`create`](Self::create)).
    path: PathBuf,
}

impl OffloadFile {
    /// Makes a new file for rank `rank` in `dir` and removes its name at
    /// once: the data lives until the file is closed, and a crash leaves
    /// nothing behind. Never opens a file that was already there.
    pub fn create(dir: &Path, rank: usize) -> Result<Arc<Self>> {
        let path = dir.join(format!(".offload-rank{rank}-{}", std::process::id()));
        let mut options = OpenOptions::new();
        options.read(true).write(true).create_new(true);
        // The optimizer's state is the owner's alone, for the moment its name exists.
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
        let file = options.open(&path).map_err(|e| {
            candle_core::Error::msg(format!(
                "cannot create the offload file {}: {e}; --offload needs a directory it may write to",
                path.display()
            ))
        })?;
        // Unlinking an open file is how a scratch file outlives nobody on Unix;
        // where the OS refuses, the name stays and says what it is.
        let _ = std::fs::remove_file(&path);
        Ok(Arc::new(Self { file: Mutex::new((file, 0)), path }))
    }

    /// Writes `t` (flat, f32) into a new region of the file.
    pub fn offload(self: &Arc<Self>, t: &Tensor) -> Result<Offloaded> {
        let len = t.elem_count();
        let offset = {
            let mut file = self.lock()?;
            let offset = file.1;
            file.1 += (len * DType::F32.size_in_bytes()) as u64;
            offset
        };
        let offloaded = Offloaded { file: self.clone(), offset, len, device: t.device().clone() };
        offloaded.store(0, t)?;
        Ok(offloaded)
    }

    fn lock(&self) -> Result<std::sync::MutexGuard<'_, (File, u64)>> {
        self.file.lock().map_err(|_| candle_core::Error::msg("the offload file's lock was poisoned by a panic"))
    }

    fn io_error(&self, what: &str, e: std::io::Error) -> candle_core::Error {
        candle_core::Error::msg(format!("{what} the offload file {}: {e}", self.path.display()))
    }
}

/// A flat f32 tensor of `len` elements kept in a region of an offload file.
#[derive(Debug, Clone)]
pub struct Offloaded {
    file: Arc<OffloadFile>,
    offset: u64,
    len: usize,
    /// Where [`load`](Self::load) puts it back.
    device: Device,
}

impl Offloaded {
    /// Reads elements `range` of the tensor back onto its device.
    pub fn load(&self, range: Range<usize>) -> Result<Tensor> {
        if range.end > self.len {
            bail!("elements {range:?} of an offloaded tensor of {} elements", self.len);
        }
        let mut values = vec![0f32; range.len()];
        {
            let mut guard = self.file.lock()?;
            let file = &mut guard.0;
            file.seek(SeekFrom::Start(self.byte_offset(range.start)))
                .and_then(|_| file.read_exact(bytemuck::cast_slice_mut(&mut values)))
                .map_err(|e| self.file.io_error("reading", e))?;
        }
        Tensor::from_vec(values, range.len(), &self.device)
    }

    /// Overwrites the tensor from element `start` on with `t`'s elements.
    pub fn store(&self, start: usize, t: &Tensor) -> Result<()> {
        if t.rank() != 1 || start + t.elem_count() > self.len {
            bail!(
                "an offloaded tensor of {} elements cannot take one of shape {:?} at element {start}",
                self.len,
                t.dims()
            );
        }
        let values = t.to_dtype(DType::F32)?.to_vec1::<f32>()?;
        let mut guard = self.file.lock()?;
        let file = &mut guard.0;
        file.seek(SeekFrom::Start(self.byte_offset(start)))
            .and_then(|_| file.write_all(bytemuck::cast_slice(&values)))
            .map_err(|e| self.file.io_error("writing", e))
    }

    fn byte_offset(&self, element: usize) -> u64 {
        self.offset + (element * DType::F32.size_in_bytes()) as u64
    }

    /// Its size in bytes.
    pub fn bytes(&self) -> u64 {
        (self.len * DType::F32.size_in_bytes()) as u64
    }
}

/// The new value of a [`StepOnly`] so far, put part by part.
#[derive(Debug, Default)]
pub struct Parts {
    written: usize,
    kept: Vec<Tensor>,
}

/// A flat f32 tensor that only the optimizer step reads: in memory, or in an
/// offload file until the step asks for it.
#[derive(Debug, Clone)]
pub enum StepOnly {
    InMemory(Tensor),
    OnDisk(Offloaded),
}

impl StepOnly {
    /// The tensor: itself, or read back from the file.
    pub fn get(&self) -> Result<Tensor> {
        self.get_range(0..self.len())
    }

    /// Elements `range` of the tensor.
    pub fn get_range(&self, range: Range<usize>) -> Result<Tensor> {
        match self {
            Self::InMemory(t) => t.narrow(0, range.start, range.len()),
            Self::OnDisk(offloaded) => offloaded.load(range),
        }
    }

    /// Replaces the tensor, where it lives.
    pub fn set(&mut self, t: Tensor) -> Result<()> {
        let mut parts = Parts::default();
        self.put_part(&mut parts, &t)?;
        self.end_parts(parts)
    }

    /// Hands over the next part of the tensor's new value: written at once
    /// to a file, kept until [`end_parts`](Self::end_parts) in memory, where
    /// the old value is still being read.
    pub fn put_part(&self, parts: &mut Parts, part: &Tensor) -> Result<()> {
        match self {
            Self::InMemory(_) => parts.kept.push(part.clone()),
            Self::OnDisk(offloaded) => offloaded.store(parts.written, part)?,
        }
        parts.written += part.elem_count();
        Ok(())
    }

    /// Takes up the new value once every part has been put.
    pub fn end_parts(&mut self, parts: Parts) -> Result<()> {
        if parts.written != self.len() {
            bail!("a new value of {} elements for a tensor of {}", parts.written, self.len());
        }
        if let Self::InMemory(t) = self {
            *t = match parts.kept.len() {
                1 => parts.kept.into_iter().next().expect("one part"),
                _ => Tensor::cat(&parts.kept, 0)?,
            };
        }
        Ok(())
    }

    fn len(&self) -> usize {
        match self {
            Self::InMemory(t) => t.elem_count(),
            Self::OnDisk(offloaded) => offloaded.len,
        }
    }

    /// Moves the tensor into `file`, if it is not there already.
    pub fn offload_to(&mut self, file: &Arc<OffloadFile>) -> Result<()> {
        if let Self::InMemory(t) = self {
            *self = Self::OnDisk(file.offload(t)?);
        }
        Ok(())
    }

    /// Bytes it holds in memory, and bytes in the offload file.
    pub fn bytes(&self) -> (u64, u64) {
        match self {
            Self::InMemory(t) => (bytes(t), 0),
            Self::OnDisk(offloaded) => (0, offloaded.bytes()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_offloaded_tensor_comes_back_as_it_was_stored_and_leaves_no_file() -> Result<()> {
        let dir = std::env::temp_dir().join(format!("workbook-offload-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let file = OffloadFile::create(&dir, 3)?;
        let a = Tensor::new(&[1.5f32, -2.0, 3.25], &Device::Cpu)?;
        let b = Tensor::new(&[7f32, 8.0], &Device::Cpu)?;
        let (mut kept_a, mut kept_b) = (StepOnly::InMemory(a.clone()), StepOnly::InMemory(b.clone()));
        kept_a.offload_to(&file)?;
        kept_b.offload_to(&file)?;
        assert_eq!((kept_a.bytes(), kept_b.bytes()), ((0, 12), (0, 8)));
        assert_eq!(kept_a.get()?.to_vec1::<f32>()?, a.to_vec1::<f32>()?);
        kept_b.set(Tensor::new(&[9f32, 10.0], &Device::Cpu)?)?;
        assert_eq!(kept_b.get()?.to_vec1::<f32>()?, [9.0, 10.0]);
        assert_eq!(kept_a.get()?.to_vec1::<f32>()?, a.to_vec1::<f32>()?, "a neighbour's write reached it");
        assert!(kept_b.set(a).is_err(), "a tensor of another length overwrote its neighbour");
        assert_eq!(std::fs::read_dir(&dir)?.count(), 0, "the offload file's name is still there");
        std::fs::remove_dir(&dir)?;
        Ok(())
    }
}
