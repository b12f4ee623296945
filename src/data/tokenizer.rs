//! Text to token ids and back.
//!
//! Two tokenizers, one interface:
//!
//! - [`Tokenizer::Gpt2`]: GPT-2's byte-level BPE (`r50k_base`, 50257 ids), the
//!   vocabulary of the 124M-and-up configs. Its merge ranks are compiled into
//!   `tiktoken-rs`, so it works offline.
//! - [`Tokenizer::Bytes`]: one id per UTF-8 byte (0..=255) plus 256 for
//!   `<|endoftext|>`: 257 ids, so the tiny configs keep a tiny embedding table
//!   and a laptop can train them in minutes.
//!
//! Both read the literal text `<|endoftext|>` as the end-of-text token, the
//! marker that separates documents in the data files, and both decode lossily:
//! a window that cuts a character in half still prints.

use std::fmt;
use std::str::FromStr;

use candle_core::{Error, Result};
use serde::{Deserialize, Serialize};
use tiktoken_rs::CoreBPE;

/// The marker between documents, in text form.
pub const END_OF_TEXT: &str = "<|endoftext|>";

/// A tokenizer: `encode` text to ids in `0..vocab_size()`, `decode` them back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Tokenizer {
    /// GPT-2's BPE: 50257 ids, `<|endoftext|>` = 50256.
    Gpt2,
    /// Bytes 0..=255, `<|endoftext|>` = 256: 257 ids.
    Bytes,
}

impl Tokenizer {
    /// Every tokenizer, in the order the error messages list them.
    pub const ALL: [Tokenizer; 2] = [Tokenizer::Gpt2, Tokenizer::Bytes];

    /// The stable name used on the command line and in token file names.
    pub fn name(self) -> &'static str {
        match self {
            Tokenizer::Gpt2 => "gpt2",
            Tokenizer::Bytes => "bytes",
        }
    }

    /// How many ids the tokenizer produces; the model's `vocab_size` must be at least this.
    pub fn vocab_size(self) -> usize {
        match self {
            Tokenizer::Gpt2 => 50257,
            Tokenizer::Bytes => 257,
        }
    }

    /// The id of `<|endoftext|>`, the last id of both vocabularies.
    pub fn eot(self) -> u32 {
        match self {
            Tokenizer::Gpt2 => 50256,
            Tokenizer::Bytes => 256,
        }
    }

    /// The ids of `text`; each literal `<|endoftext|>` becomes [`Tokenizer::eot`].
    pub fn encode(self, text: &str) -> Vec<u32> {
        match self {
            Tokenizer::Gpt2 => gpt2().encode_with_special_tokens(text),
            Tokenizer::Bytes => {
                let mut ids = Vec::with_capacity(text.len());
                for (i, piece) in text.split(END_OF_TEXT).enumerate() {
                    if i > 0 {
                        ids.push(self.eot());
                    }
                    ids.extend(piece.bytes().map(u32::from));
                }
                ids
            }
        }
    }

    /// The text of `ids`. Bytes that do not form valid UTF-8 (a character cut
    /// at a window edge) and ids outside the vocabulary become U+FFFD `�`.
    pub fn decode(self, ids: &[u32]) -> String {
        let mut bytes = Vec::with_capacity(ids.len() * 2);
        for &id in ids {
            match self {
                Tokenizer::Gpt2 => match gpt2().decode_bytes(&[id]) {
                    Ok(piece) => bytes.extend(piece),
                    Err(_) => bytes.extend("\u{FFFD}".as_bytes()),
                },
                Tokenizer::Bytes => match id {
                    0..=255 => bytes.push(id as u8),
                    256 => bytes.extend(END_OF_TEXT.as_bytes()),
                    _ => bytes.extend("\u{FFFD}".as_bytes()),
                },
            }
        }
        String::from_utf8_lossy(&bytes).into_owned()
    }
}

/// GPT-2's BPE, built once per process from the ranks inside `tiktoken-rs`.
fn gpt2() -> &'static CoreBPE {
    tiktoken_rs::r50k_base_singleton()
}

impl FromStr for Tokenizer {
    type Err = Error;

    /// Parses `gpt2` or `bytes`.
    fn from_str(s: &str) -> Result<Self> {
        Tokenizer::ALL.into_iter().find(|t| t.name() == s).ok_or_else(|| {
            // A flag's value: the message alone, no backtrace.
            Error::Msg(format!("unknown tokenizer `{s}`: choose gpt2 (GPT-2 BPE, 50257 ids) or bytes (257 ids)"))
        })
    }
}

impl fmt::Display for Tokenizer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
