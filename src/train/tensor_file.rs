//! A safetensors file written a tensor at a time, and read a tensor at a
//! time.
//!
//! The format is an 8-byte little-endian header length, a JSON header that
//! gives each tensor's dtype, shape and byte range, then the tensors' bytes
//! back to back. Knowing every tensor's name, shape and dtype up front fixes
//! the header, so each tensor can be written to its place whenever it is at
//! hand, in any order, and let go: a writer holds one tensor at a time, not
//! the whole file's worth (an FSDP rank saving a model it holds 1/N of).
//! Reading is the same the other way round: the header says where each
//! tensor lies, so a rank reads the tensors it keeps (a pipeline stage's)
//! and none of the others.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use candle_core::{bail, DType, Device, Result, Shape, Tensor};

use crate::error::io_path;

/// A tensor the file will hold.
#[derive(Debug, Clone)]
pub struct TensorSpec {
    pub name: String,
    pub shape: Shape,
    pub dtype: DType,
}

/// One tensor's place in the file.
#[derive(Debug)]
struct Slot {
    shape: Shape,
    dtype: DType,
    /// Where its bytes start, from the start of the file.
    at: u64,
}

/// The file being written.
#[derive(Debug)]
pub struct TensorFile {
    path: PathBuf,
    file: File,
    slots: BTreeMap<String, Slot>,
    /// The tensors written so far, by name.
    written: BTreeSet<String>,
}

impl TensorFile {
    /// Creates `path` with room for `specs`, in name order, none written yet.
    pub fn create(path: &Path, specs: impl IntoIterator<Item = TensorSpec>) -> Result<Self> {
        let mut specs: Vec<TensorSpec> = specs.into_iter().collect();
        specs.sort_by(|a, b| a.name.cmp(&b.name));
        let mut header = serde_json::Map::new();
        let mut end = 0u64;
        for spec in &specs {
            let begin = end;
            end += (spec.shape.elem_count() * spec.dtype.size_in_bytes()) as u64;
            let info = serde_json::json!({
                "dtype": dtype_name(spec.dtype)?,
                "shape": spec.shape.dims(),
                "data_offsets": [begin, end],
            });
            if header.insert(spec.name.clone(), info).is_some() {
                bail!("two tensors named `{}` in one file", spec.name);
            }
        }
        let mut json = serde_json::Value::Object(header).to_string().into_bytes();
        // Padded with spaces so that the tensors' bytes start 8-aligned.
        json.resize(json.len().div_ceil(8) * 8, b' ');
        let data_start = 8 + json.len() as u64;
        let mut file = File::create(path).map_err(|e| io_path("create", path, e))?;
        file.write_all(&(json.len() as u64).to_le_bytes())
            .and_then(|()| file.write_all(&json))
            .and_then(|()| file.set_len(data_start + end))
            .map_err(|e| io_path("write", path, e))?;
        let mut slots = BTreeMap::new();
        let mut at = data_start;
        for TensorSpec { name, shape, dtype } in specs {
            let len = (shape.elem_count() * dtype.size_in_bytes()) as u64;
            slots.insert(name, Slot { shape, dtype, at });
            at += len;
        }
        Ok(Self { path: path.to_path_buf(), file, slots, written: BTreeSet::new() })
    }

    /// Writes `t` as the tensor named `name`, which must have the shape and
    /// dtype it was announced with.
    pub fn put(&mut self, name: &str, t: &Tensor) -> Result<()> {
        let Some(slot) = self.slots.get(name) else {
            bail!("{} has no tensor `{name}`: it holds {}", self.path.display(), names_sample(&self.slots));
        };
        if t.shape() != &slot.shape || t.dtype() != slot.dtype {
            bail!(
                "`{name}` is {:?} {:?}, but {} holds it as {:?} {:?}",
                t.dtype(),
                t.dims(),
                self.path.display(),
                slot.dtype,
                slot.shape.dims()
            );
        }
        // One copy on the host, written as it lies (safetensors is little-endian, as the hosts here are).
        let host = t.to_device(&Device::Cpu)?.flatten_all()?;
        let written = self.file.seek(SeekFrom::Start(slot.at)).and_then(|_| match slot.dtype {
            DType::BF16 => self.file.write_all(bytemuck::cast_slice(&host.to_vec1::<half::bf16>().map_err(other)?)),
            DType::F16 => self.file.write_all(bytemuck::cast_slice(&host.to_vec1::<half::f16>().map_err(other)?)),
            _ => self.file.write_all(bytemuck::cast_slice(&host.to_vec1::<f32>().map_err(other)?)),
        });
        written.map_err(|e| io_path("write", &self.path, e))?;
        self.written.insert(name.to_string());
        Ok(())
    }

    /// Fails unless every tensor was written; flushes the file to the disk.
    pub fn finish(self) -> Result<()> {
        let missing: Vec<&str> = self.slots.keys().filter(|n| !self.written.contains(*n)).map(String::as_str).collect();
        if let Some(first) = missing.first() {
            bail!("{} was not given {} of its tensors, `{first}` among them", self.path.display(), missing.len());
        }
        self.file.sync_all().map_err(|e| io_path("flush to disk", &self.path, e))
    }
}

/// A safetensors file open for reading: its header read, its tensors not.
#[derive(Debug)]
pub struct TensorFileReader {
    path: PathBuf,
    file: File,
    slots: BTreeMap<String, Slot>,
}

impl TensorFileReader {
    /// Opens `path` and reads where each of its tensors lies.
    pub fn open(path: &Path) -> Result<Self> {
        let corrupt =
            |why: &str| candle_core::Error::Msg(format!("{} is not a safetensors file: {why}", path.display()));
        let mut file = File::open(path).map_err(|e| io_path("open", path, e))?;
        let file_len = file.metadata().map_err(|e| io_path("read", path, e))?.len();
        let mut len = [0u8; 8];
        file.read_exact(&mut len).map_err(|_| corrupt("shorter than its header's length"))?;
        let header_len = u64::from_le_bytes(len);
        if header_len > file_len - 8 {
            return Err(corrupt("its header's length runs past its end"));
        }
        let mut json = vec![0u8; header_len as usize];
        file.read_exact(&mut json).map_err(|e| io_path("read", path, e))?;
        let header: BTreeMap<String, serde_json::Value> =
            serde_json::from_slice(&json).map_err(|e| corrupt(&format!("its header is not JSON ({e})")))?;
        let data_start = 8 + header_len;
        let mut slots = BTreeMap::new();
        for (name, info) in header.into_iter().filter(|(name, _)| name != "__metadata__") {
            let entry: HeaderEntry = serde_json::from_value(info)
                .map_err(|e| corrupt(&format!("`{name}` has no dtype, shape and offsets ({e})")))?;
            let dtype = dtype_of(&entry.dtype)?;
            let shape = Shape::from(entry.shape);
            let [begin, end] = entry.data_offsets;
            let len = (shape.elem_count() * dtype.size_in_bytes()) as u64;
            if end.checked_sub(begin) != Some(len) || data_start + end > file_len {
                return Err(corrupt(&format!("`{name}`'s bytes do not match its shape or lie past the end")));
            }
            slots.insert(name, Slot { shape, dtype, at: data_start + begin });
        }
        Ok(Self { path: path.to_path_buf(), file, slots })
    }

    /// The names of the file's tensors, in order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.slots.keys().map(String::as_str)
    }

    /// The tensor named `name`, read from the file onto `device`.
    pub fn read(&mut self, name: &str, device: &Device) -> Result<Tensor> {
        let Some(slot) = self.slots.get(name) else {
            bail!("{} has no tensor `{name}`: it holds {}", self.path.display(), names_sample(&self.slots));
        };
        let mut bytes = vec![0u8; slot.shape.elem_count() * slot.dtype.size_in_bytes()];
        self.file
            .seek(SeekFrom::Start(slot.at))
            .and_then(|_| self.file.read_exact(&mut bytes))
            .map_err(|e| io_path("read", &self.path, e))?;
        Tensor::from_raw_buffer(&bytes, slot.dtype, slot.shape.dims(), device)
    }
}

/// One tensor's entry in a safetensors header.
#[derive(serde::Deserialize)]
struct HeaderEntry {
    dtype: String,
    shape: Vec<usize>,
    data_offsets: [u64; 2],
}

/// A tensor error as an I/O error of the write it stopped.
fn other(e: candle_core::Error) -> std::io::Error {
    std::io::Error::other(e.to_string())
}

/// The dtypes a checkpoint holds, by safetensors' names for them.
const DTYPES: [(DType, &str); 3] = [(DType::F32, "F32"), (DType::BF16, "BF16"), (DType::F16, "F16")];

/// Safetensors' name of `dtype`.
fn dtype_name(dtype: DType) -> Result<&'static str> {
    match DTYPES.iter().find(|(known, _)| *known == dtype) {
        Some((_, name)) => Ok(name),
        None => bail!("a checkpoint holds f32, bf16 or f16 tensors, not {dtype:?}"),
    }
}

/// The dtype safetensors calls `name`, one a checkpoint holds.
fn dtype_of(name: &str) -> Result<DType> {
    match DTYPES.iter().find(|(_, known)| *known == name) {
        Some((dtype, _)) => Ok(*dtype),
        None => bail!("a checkpoint holds F32, BF16 or F16 tensors, not {name}"),
    }
}

/// A few of the slots' names, to say what a file holds.
fn names_sample(slots: &BTreeMap<String, Slot>) -> String {
    let names: Vec<&str> = slots.keys().take(3).map(String::as_str).collect();
    match slots.len() {
        0 => "no tensors".to_string(),
        n if n > names.len() => format!("{}, … ({n} in all)", names.join(", ")),
        _ => names.join(", "),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Written in another order than the header's, the file reads back as
    /// candle writes it.
    #[test]
    fn tensors_put_in_any_order_read_back() -> Result<()> {
        let dir = std::env::temp_dir().join(format!("tensor-file-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let a = Tensor::arange(0f32, 6.0, &Device::Cpu)?.reshape((2, 3))?;
        let b = Tensor::new(&[1.5f32, -2.0], &Device::Cpu)?.to_dtype(DType::BF16)?;
        let spec =
            |name: &str, t: &Tensor| TensorSpec { name: name.into(), shape: t.shape().clone(), dtype: t.dtype() };
        let path = dir.join("t.safetensors");
        let mut file = TensorFile::create(&path, [spec("z.a", &a), spec("b", &b)])?;
        file.put("z.a", &a)?;
        assert!(file.put("b", &a).is_err(), "a tensor of another shape is refused");
        file.put("b", &b)?;
        file.finish()?;
        let read = candle_core::safetensors::load(&path, &Device::Cpu)?;
        assert_eq!(read["z.a"].to_vec2::<f32>()?, a.to_vec2::<f32>()?);
        assert_eq!(read["b"].to_dtype(DType::F32)?.to_vec1::<f32>()?, vec![1.5, -2.0]);
        let mut reader = TensorFileReader::open(&path)?;
        assert_eq!(reader.names().collect::<Vec<_>>(), ["b", "z.a"]);
        assert_eq!(reader.read("z.a", &Device::Cpu)?.to_vec2::<f32>()?, a.to_vec2::<f32>()?);
        assert_eq!(reader.read("b", &Device::Cpu)?.to_dtype(DType::F32)?.to_vec1::<f32>()?, vec![1.5, -2.0]);
        assert!(reader.read("c", &Device::Cpu).is_err(), "a tensor the file lacks is an error");
        let unfinished = TensorFile::create(&dir.join("u.safetensors"), [spec("b", &b)])?;
        assert!(unfinished.finish().is_err(), "a tensor never written is an error");
        std::fs::remove_dir_all(&dir).ok();
        Ok(())
    }
}
