//! A trained model to run: a workbook checkpoint, a directory of them, or a
//! Hugging Face Llama directory. Inference reads the weights only, never the
//! optimizer state.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, Result};
use candle_core::Tensor;
use workbook::data::Tokenizer;
use workbook::hf::{Pretrained, CONFIG_FILE};
use workbook::train::Checkpoint;
use workbook::{Gpt, GptConfig, ParamStore};

use crate::checkpoints;

/// A model's shape, weights and what it reads.
pub struct ModelDir {
    pub dir: PathBuf,
    pub config: GptConfig,
    pub params: HashMap<String, Tensor>,
    /// `None` when the directory's tokenizer is not one of the workbook's.
    pub tokenizer: Option<Tokenizer>,
    /// The longest context it was trained on: positions past it have rotary
    /// angles it never saw.
    pub context_len: usize,
}

impl ModelDir {
    /// Opens `path`: a checkpoint, the newest checkpoint under it, or a Hugging Face directory.
    pub fn open(path: &Path) -> Result<Self> {
        Self::open_where(path, |_| true)
    }

    /// [`open`](Self::open), keeping only the parameters `keep` names: a
    /// workbook checkpoint reads none of the others, and neither kind reads
    /// any weights when `keep` names none (the shape and the vocabulary alone).
    pub fn open_where(path: &Path, keep: impl Fn(&str) -> bool) -> Result<Self> {
        let is_checkpoint = path.join("trainer_state.json").is_file();
        if !is_checkpoint && path.join(CONFIG_FILE).is_file() {
            // A checkpoint that lost its state still lists its files' checksums.
            Checkpoint::verify_listed_files(path)?;
            let Pretrained { config, params, tokenizer } = Pretrained::read_where(path, keep)?;
            let context_len = config.max_seq_len;
            return Ok(Self { dir: path.to_path_buf(), config, params, tokenizer, context_len });
        }
        let dir = checkpoints::resolve(path)?;
        let (state, params) = Checkpoint::read_model_where(&dir, keep)?;
        let (tokenizer, context_len) = match &state.data {
            Some(data) => (Some(data.config.tokenizer), data.config.seq_len),
            None => (None, state.model.max_seq_len),
        };
        Ok(Self { dir, config: state.model, params, tokenizer, context_len })
    }

    /// The names of the parameters holding a NaN or an infinity: a model
    /// whose training diverged, whose output means nothing.
    pub fn non_finite_params(&self) -> Result<Vec<String>> {
        let mut names = vec![];
        for (name, tensor) in &self.params {
            let values = tensor.to_dtype(candle_core::DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
            if values.iter().any(|v| !v.is_finite()) {
                names.push(name.clone());
            }
        }
        names.sort();
        Ok(names)
    }

    /// The model, built on its weights.
    pub fn model(&self) -> Result<Gpt> {
        let params = ParamStore::from_tensors(self.params.clone())?;
        Gpt::new(&self.config, &params).map_err(|e| anyhow!("{} does not hold a usable model: {e}", self.dir.display()))
    }

    /// The tokenizer to use: `chosen` if given, else the directory's own.
    pub fn tokenizer(&self, chosen: Option<Tokenizer>) -> Result<Tokenizer> {
        let tokenizer = chosen.or(self.tokenizer).ok_or_else(|| {
            anyhow!(
                "{} has no tokenizer the workbook implements (GPT-2 BPE or bytes): pass --tokenizer gpt2 or \
                 --tokenizer bytes if the model was trained with one of them",
                self.dir.display()
            )
        })?;
        if tokenizer.vocab_size() > self.config.vocab_size {
            anyhow::bail!(
                "the {tokenizer} tokenizer has {} ids but the model's vocabulary has {}: choose the tokenizer it \
                 was trained with",
                tokenizer.vocab_size(),
                self.config.vocab_size
            );
        }
        Ok(tokenizer)
    }
}
