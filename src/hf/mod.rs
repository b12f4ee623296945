//! Hugging Face model directories: every checkpoint is one, and one written
//! by `transformers` loads as a model.
//!
//! A Hugging Face Llama directory holds `config.json` (the shape, as
//! `LlamaConfig`), `generation_config.json`, the weights in
//! `model.safetensors` (or shards listed in `model.safetensors.index.json`)
//! under the same names as [`param_specs`](crate::param_specs), and the
//! tokenizer (`tokenizer.json`, read by `AutoTokenizer`). The workbook's
//! checkpoints add these files beside their own, so
//! `AutoModelForCausalLM.from_pretrained(step_dir)` needs no code.

mod config;
mod tokenizer;
mod weights;

pub use config::{read_config, write_config};
pub use tokenizer::{read_tokenizer, write_tokenizer};
pub use weights::read_weights;

use std::collections::HashMap;
use std::path::Path;

use candle_core::{Result, Tensor};

use crate::data::Tokenizer;
use crate::model::{param_specs, GptConfig};

/// The file that marks a Hugging Face model directory.
pub const CONFIG_FILE: &str = "config.json";

/// Every file [`write_model_files`] may write.
pub const MODEL_DIR_FILES: [&str; 5] = [
    CONFIG_FILE,
    config::GENERATION_CONFIG_FILE,
    tokenizer::TOKENIZER_FILE,
    tokenizer::TOKENIZER_CONFIG_FILE,
    tokenizer::SPECIAL_TOKENS_FILE,
];

/// A model read from a Hugging Face directory.
#[derive(Debug, Clone)]
pub struct Pretrained {
    pub config: GptConfig,
    /// Parameters by name, in f32, exactly those of `config`.
    pub params: HashMap<String, Tensor>,
    /// The tokenizer when its files are one of the workbook's two; `None`
    /// for another vocabulary (a SentencePiece Llama, say).
    pub tokenizer: Option<Tokenizer>,
}

impl Pretrained {
    /// Reads the model in `dir`, refusing variants this model does not implement.
    pub fn read(dir: &Path) -> Result<Self> {
        Self::read_where(dir, |_| true)
    }

    /// [`read`](Self::read), keeping only the parameters `keep` names; the
    /// weights are not read at all when it names none of the model's.
    pub fn read_where(dir: &Path, keep: impl Fn(&str) -> bool) -> Result<Self> {
        let config = read_config(dir)?;
        let mut params = match param_specs(&config).iter().any(|spec| keep(&spec.name)) {
            true => read_weights(dir, &config)?,
            false => HashMap::new(),
        };
        params.retain(|name, _| keep(name));
        Ok(Self { config, params, tokenizer: read_tokenizer(dir)? })
    }
}

/// Writes what makes `dir` a Hugging Face model directory besides the
/// weights: the config, the generation config and, given one, the tokenizer.
pub fn write_model_files(
    dir: &Path,
    config: &GptConfig,
    dtype: candle_core::DType,
    tokenizer: Option<Tokenizer>,
) -> Result<()> {
    write_config(dir, config, dtype, tokenizer)?;
    if let Some(tokenizer) = tokenizer {
        write_tokenizer(dir, tokenizer, config.max_seq_len)?;
    }
    Ok(())
}
