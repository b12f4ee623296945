//! The data pipeline: from a text file to the `(B, T)` batches each rank trains on.
//!
//! ```text
//! text file ──tokenizer──▶ token file (once) ──mmap──▶ Dataset: windows of T tokens
//!                                                         │
//!        DistributedSampler (rank r of W): window numbers ┘──▶ batch: (B, T) u32
//! ```
//!
//! - [`tokenizer`]: GPT-2's BPE, or one id per byte for the tiny configs.
//! - [`documents`]: tokenising a file of any size a chunk at a time.
//! - [`token_file`]: the tokens saved beside the text and memory-mapped.
//! - [`dataset`]: `dummy`, `tinystories` or `openwebtext`, as numbered windows.
//! - [`sampler`]: which windows each rank reads, epoch after epoch, resumable.
//!
//! ```no_run
//! use std::path::Path;
//! use candle_core::Device;
//! use workbook::data::{Dataset, DistributedSampler, Tokenizer};
//!
//! # fn main() -> candle_core::Result<()> {
//! let data = Dataset::from_text(Path::new("datasets/tinystories_sample.txt"), Tokenizer::Bytes, 128, None)?;
//! let mut sampler = DistributedSampler::new(data.num_windows(), 2, 0, 1337)?; // rank 0 of 2
//! let batch = data.batch(&sampler.next_batch(8), &Device::Cpu)?; // (8, 128)
//! # Ok(()) }
//! ```

pub mod dataset;
pub mod documents;
pub mod sampler;
pub mod token_file;
pub mod tokenizer;

pub use dataset::{DataConfig, Dataset, DatasetKind, DUMMY_WINDOWS, SAMPLE_PATH};
pub use documents::{encode_documents, DEFAULT_CHUNK_BYTES};
pub use sampler::{DistributedSampler, SamplerState};
pub use token_file::{Progress, TokenFile};
pub use tokenizer::{Tokenizer, END_OF_TEXT};
