//! A dataset as the trainer sees it: numbered windows of `seq_len` tokens.
//!
//! The token stream is cut into non-overlapping windows, window `i` being
//! `tokens[i*T .. (i+1)*T]`; the tail shorter than a window is never read. A
//! batch is a list of window numbers (chosen by the
//! [`DistributedSampler`](super::DistributedSampler)) turned into a `(B, T)`
//! tensor of `u32` ids. Inputs and labels are the same window: the model's
//! loss predicts position `t+1` from positions `..=t`, so it shifts inside.

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use candle_core::{bail, Device, Error, Result, Tensor};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use super::token_file::{Progress, TokenFile};
use super::tokenizer::Tokenizer;
use crate::words::count;

/// The bundled stories, relative to the workbook's root: `--dataset tinystories`
/// reads them until the real file is downloaded. `cargo xtask sample-stories`
/// writes them.
pub const SAMPLE_PATH: &str = "datasets/tinystories_sample.txt";

/// What to tell a learner whose data file `path` is not there yet: where
/// the download commands are, by a path that works from anywhere.
fn download_hint(path: &Path) -> String {
    let readme = path.parent().map(|dir| dir.join("README.md")).filter(|readme| readme.is_file());
    match readme {
        Some(readme) => format!("download it with the commands in {}, or use --dataset dummy", readme.display()),
        None => "check the path given to --data-path, or download the dataset with the commands in the workbook's \
                 datasets/README.md, or use --dataset dummy"
            .to_string(),
    }
}

/// Which data to train on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DatasetKind {
    /// Seeded random tokens: no file, nothing to learn; for checking that a
    /// run works and measuring its speed.
    Dummy,
    /// Children's stories separated by `<|endoftext|>` lines (TinyStories V2).
    TinyStories,
    /// Web text (the OpenWebText sample); `<|endoftext|>` separates documents
    /// if the file has it, otherwise the file is one stream.
    OpenWebText,
}

impl DatasetKind {
    /// Every dataset, in the order the error messages list them.
    pub const ALL: [DatasetKind; 3] = [DatasetKind::Dummy, DatasetKind::TinyStories, DatasetKind::OpenWebText];

    /// The name used on the command line.
    pub fn name(self) -> &'static str {
        match self {
            DatasetKind::Dummy => "dummy",
            DatasetKind::TinyStories => "tinystories",
            DatasetKind::OpenWebText => "openwebtext",
        }
    }

    /// Where the downloaded text file is expected, relative to the workbook's
    /// root (`datasets/README.md` has the download commands); `None` for `dummy`.
    pub fn default_path(self) -> Option<&'static str> {
        match self {
            DatasetKind::Dummy => None,
            DatasetKind::TinyStories => Some("datasets/TinyStoriesV2-GPT4-train.txt"),
            DatasetKind::OpenWebText => Some("datasets/owt_train.txt"),
        }
    }
}

impl FromStr for DatasetKind {
    type Err = Error;

    /// Parses `dummy`, `tinystories` or `openwebtext`.
    fn from_str(s: &str) -> Result<Self> {
        DatasetKind::ALL
            .into_iter()
            .find(|k| k.name() == s)
            // A flag's value: the message alone, no backtrace.
            .ok_or_else(|| Error::Msg(format!("unknown dataset `{s}`: choose dummy, tinystories or openwebtext")))
    }
}

impl fmt::Display for DatasetKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Everything that picks a dataset: what a training config or command line says.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DataConfig {
    pub kind: DatasetKind,
    /// The text file; `None` means [`DatasetKind::default_path`]. Ignored by `dummy`.
    pub path: Option<PathBuf>,
    pub tokenizer: Tokenizer,
    /// T, the tokens per window.
    pub seq_len: usize,
    /// Seeds the random tokens of `dummy`.
    pub seed: u64,
}

/// How many windows the `dummy` dataset has when opened through [`Dataset::open`].
pub const DUMMY_WINDOWS: usize = 1024;

/// Where the tokens come from.
enum Tokens {
    /// Generated in memory (`dummy`).
    Memory(Vec<u32>),
    /// Mapped from a token file.
    File(TokenFile),
}

/// A token stream cut into windows of `seq_len` tokens.
pub struct Dataset {
    tokens: Tokens,
    tokenizer: Tokenizer,
    seq_len: usize,
    num_windows: usize,
}

/// Where the tokens come from and how they are cut, as the run's banner says it.
impl fmt::Display for Dataset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let source = match &self.tokens {
            Tokens::Memory(_) => "random tokens".to_string(),
            Tokens::File(file) => file.path().display().to_string(),
        };
        let (windows, tokens) = (count(self.num_windows, "window"), count(self.seq_len, "token"));
        write!(f, "{source}: {windows} of {tokens}, tokenizer {}", self.tokenizer)?;
        if let Tokens::Memory(_) = &self.tokens {
            // Uniform over the vocabulary: no model does better than ln V.
            let vocab = self.tokenizer.vocab_size();
            write!(f, "; nothing to learn: the loss cannot fall below ln {vocab} = {:.2}", (vocab as f64).ln())?;
        }
        Ok(())
    }
}

impl fmt::Debug for Dataset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Dataset({self})")
    }
}

impl Dataset {
    /// The dataset `config` describes. A text file is tokenised on first use
    /// (reporting to `progress`) and its token file reused afterwards.
    pub fn open(config: &DataConfig, progress: Option<&mut dyn FnMut(Progress)>) -> Result<Self> {
        let DataConfig { kind, path, tokenizer, seq_len, seed } = config;
        match kind.default_path() {
            None => Self::dummy(DUMMY_WINDOWS, *seq_len, *tokenizer, *seed),
            Some(default) => {
                let path = path.clone().unwrap_or_else(|| PathBuf::from(default));
                Self::from_text(&path, *tokenizer, *seq_len, progress)
            }
        }
    }

    /// `num_windows` windows of random ids in `0..tokenizer.vocab_size()`, fixed by `seed`.
    pub fn dummy(num_windows: usize, seq_len: usize, tokenizer: Tokenizer, seed: u64) -> Result<Self> {
        check_seq_len(seq_len)?;
        if num_windows == 0 {
            bail!("the dummy dataset needs at least one window");
        }
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let vocab = tokenizer.vocab_size() as u32;
        let tokens = (0..num_windows * seq_len).map(|_| rng.random_range(0..vocab)).collect();
        Ok(Self { tokens: Tokens::Memory(tokens), tokenizer, seq_len, num_windows })
    }

    /// The windows of the text file at `path`, tokenised with `tokenizer`.
    pub fn from_text(
        path: &Path,
        tokenizer: Tokenizer,
        seq_len: usize,
        progress: Option<&mut dyn FnMut(Progress)>,
    ) -> Result<Self> {
        check_seq_len(seq_len)?;
        match std::fs::metadata(path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                bail!("dataset file `{}` not found: {}", path.display(), download_hint(path))
            }
            Err(e) => bail!("cannot read dataset file `{}`: {e}", path.display()),
            Ok(meta) if meta.is_dir() => {
                bail!("dataset path `{}` is a folder; give the text file", path.display())
            }
            Ok(meta) if meta.len() == 0 => {
                bail!("dataset file `{}` is empty: {}", path.display(), download_hint(path))
            }
            Ok(_) => {}
        }
        let file = TokenFile::open_or_create(path, tokenizer, progress)?;
        let num_windows = file.len() / seq_len;
        if num_windows == 0 {
            bail!(
                "dataset file `{}` has {} (tokenizer {tokenizer}), fewer than one window of seq_len {seq_len}: \
                 use a longer text or a smaller seq_len",
                path.display(),
                count(file.len(), "token")
            );
        }
        Ok(Self { tokens: Tokens::File(file), tokenizer, seq_len, num_windows })
    }

    /// How many whole windows the tokens make.
    pub fn num_windows(&self) -> usize {
        self.num_windows
    }

    /// T, the tokens per window.
    pub fn seq_len(&self) -> usize {
        self.seq_len
    }

    /// All tokens, including the tail too short to make a window.
    pub fn num_tokens(&self) -> usize {
        match &self.tokens {
            Tokens::Memory(tokens) => tokens.len(),
            Tokens::File(file) => file.len(),
        }
    }

    /// The tokenizer the ids belong to (decode a window with it).
    pub fn tokenizer(&self) -> Tokenizer {
        self.tokenizer
    }

    /// The token file behind the dataset; `None` for `dummy`.
    pub fn token_file(&self) -> Option<&TokenFile> {
        match &self.tokens {
            Tokens::Memory(_) => None,
            Tokens::File(file) => Some(file),
        }
    }

    /// The `seq_len` ids of window `index`.
    pub fn window(&self, index: usize) -> Result<Vec<u32>> {
        let mut out = Vec::with_capacity(self.seq_len);
        self.push_window(index, &mut out)?;
        Ok(out)
    }

    /// The windows `window_indices` as one batch: a `(B, T)` tensor of `u32` ids on `device`.
    pub fn batch(&self, window_indices: &[usize], device: &Device) -> Result<Tensor> {
        if window_indices.is_empty() {
            bail!("a batch needs at least one window");
        }
        let mut ids = Vec::with_capacity(window_indices.len() * self.seq_len);
        for &index in window_indices {
            self.push_window(index, &mut ids)?;
        }
        Tensor::from_vec(ids, (window_indices.len(), self.seq_len), device) // (B, T)
    }

    fn push_window(&self, index: usize, out: &mut Vec<u32>) -> Result<()> {
        if index >= self.num_windows {
            bail!("window {index} does not exist: the dataset has {} windows", self.num_windows);
        }
        let range = index * self.seq_len..(index + 1) * self.seq_len;
        match &self.tokens {
            Tokens::Memory(tokens) => out.extend_from_slice(&tokens[range]),
            Tokens::File(file) => file.read_into(range, out),
        }
        Ok(())
    }
}

fn check_seq_len(seq_len: usize) -> Result<()> {
    if seq_len == 0 {
        bail!("seq_len must be at least 1");
    }
    Ok(())
}
