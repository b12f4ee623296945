//! The workbook's tokenizers as Hugging Face `tokenizers` files, so that
//! `AutoTokenizer.from_pretrained(dir)` encodes and decodes as they do.
//!
//! Both are byte-level BPE in `tokenizers`' terms: every byte is first
//! spelled as one printable character (GPT-2's byte-to-unicode table), then
//! merged by rank. GPT-2's merges are recovered from its ranks; the bytes
//! tokenizer has none, so every byte stays one token. `<|endoftext|>` is an
//! added special token with the workbook's id.

use std::collections::HashMap;
use std::fs;
use std::path::Path;

use candle_core::{bail, Result};
use serde_json::{json, Map, Value};

use super::config::write_json;
use crate::data::{Tokenizer, END_OF_TEXT};
use crate::error::io_path;

pub(super) const TOKENIZER_FILE: &str = "tokenizer.json";
pub(super) const TOKENIZER_CONFIG_FILE: &str = "tokenizer_config.json";
pub(super) const SPECIAL_TOKENS_FILE: &str = "special_tokens_map.json";

/// Writes `tokenizer.json`, `tokenizer_config.json` and `special_tokens_map.json`.
pub fn write_tokenizer(dir: &Path, tokenizer: Tokenizer, max_len: usize) -> Result<()> {
    let (vocab, merges) = vocab_and_merges(tokenizer);
    let byte_level = json!({ "type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true });
    let file = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": [{
            "id": tokenizer.eot(), "content": END_OF_TEXT, "single_word": false, "lstrip": false,
            "rstrip": false, "normalized": false, "special": true,
        }],
        "normalizer": null,
        "pre_tokenizer": byte_level,
        "post_processor": byte_level,
        "decoder": byte_level,
        "model": {
            "type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": "",
            "end_of_word_suffix": "", "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
            "vocab": Value::Object(vocab),
            "merges": merges,
        },
    });
    let config = json!({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": max_len,
        "bos_token": END_OF_TEXT,
        "eos_token": END_OF_TEXT,
        "unk_token": END_OF_TEXT,
        "add_bos_token": false,
        "add_eos_token": false,
        // The workbook decodes bytes as they are; cleaning up would drop spaces before punctuation.
        "clean_up_tokenization_spaces": false,
    });
    let special = json!({ "bos_token": END_OF_TEXT, "eos_token": END_OF_TEXT, "unk_token": END_OF_TEXT });
    fs::write(dir.join(TOKENIZER_FILE), serde_json::to_string(&file).map_err(candle_core::Error::wrap)?)
        .map_err(|e| io_path("write", &dir.join(TOKENIZER_FILE), e))?;
    write_json(&dir.join(TOKENIZER_CONFIG_FILE), &config)?;
    write_json(&dir.join(SPECIAL_TOKENS_FILE), &special)
}

/// Which of the workbook's tokenizers `dir/tokenizer.json` is: `None` when
/// there is none or its vocabulary is another one.
pub fn read_tokenizer(dir: &Path) -> Result<Option<Tokenizer>> {
    let path = dir.join(TOKENIZER_FILE);
    if !path.is_file() {
        return Ok(None);
    }
    let text = fs::read_to_string(&path).map_err(|e| io_path("read", &path, e))?;
    let file: Value = match serde_json::from_str(&text) {
        Ok(file) => file,
        Err(e) => bail!("{} is not a tokenizer file: {e}", path.display()),
    };
    let eot_id =
        |file: &Value| file["added_tokens"].as_array()?.iter().find(|t| t["content"] == END_OF_TEXT)?["id"].as_u64();
    Ok(Tokenizer::ALL.into_iter().find(|&tokenizer| {
        eot_id(&file) == Some(u64::from(tokenizer.eot()))
            && file["model"]["vocab"].as_object() == Some(&vocab_and_merges(tokenizer).0)
    }))
}

/// The BPE vocabulary (token spelled in byte-level characters → id) and the
/// merges ("left right", in the order BPE applies them) of `tokenizer`.
fn vocab_and_merges(tokenizer: Tokenizer) -> (Map<String, Value>, Vec<String>) {
    let byte_char = byte_chars();
    let spell = |bytes: &[u8]| bytes.iter().map(|&b| byte_char[b as usize]).collect::<String>();
    // Every id but `<|endoftext|>` (an added token) stands for bytes.
    let pieces: Vec<Vec<u8>> = (0..tokenizer.eot())
        .map(|id| match tokenizer {
            Tokenizer::Bytes => vec![id as u8],
            Tokenizer::Gpt2 => tiktoken_rs::r50k_base_singleton().decode_bytes(&[id]).unwrap_or_default(),
        })
        .collect();
    let vocab = pieces.iter().enumerate().map(|(id, piece)| (spell(piece), json!(id))).collect();
    let ranks: HashMap<&[u8], usize> = pieces.iter().enumerate().map(|(id, p)| (p.as_slice(), id)).collect();
    let merges = pieces
        .iter()
        .enumerate()
        .filter(|(_, piece)| piece.len() > 1)
        .filter_map(|(rank, piece)| last_merge(piece, rank, &ranks))
        .map(|(left, right)| format!("{} {}", spell(left), spell(right)))
        .collect();
    (vocab, merges)
}

/// The two parts that BPE joins last when it builds `piece` (whose rank is
/// `rank`) from single bytes, merging the lowest-ranked adjacent pair each time.
fn last_merge<'a>(piece: &'a [u8], rank: usize, ranks: &HashMap<&[u8], usize>) -> Option<(&'a [u8], &'a [u8])> {
    // Part boundaries as offsets into `piece`.
    let mut bounds: Vec<usize> = (0..=piece.len()).collect();
    while bounds.len() > 3 {
        let best = (0..bounds.len() - 2)
            .filter_map(|i| ranks.get(&piece[bounds[i]..bounds[i + 2]]).map(|&r| (r, i)))
            .filter(|&(r, _)| r < rank)
            .min()?;
        bounds.remove(best.1 + 1);
    }
    Some((&piece[..bounds[1]], &piece[bounds[1]..]))
}

/// GPT-2's byte-to-unicode table: printable bytes stand for themselves, the
/// rest take the characters from U+0100 on, in byte order.
fn byte_chars() -> [char; 256] {
    let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    let mut chars = ['\0'; 256];
    let mut next = 256u32;
    for b in 0..=255u8 {
        chars[b as usize] = if printable(b) {
            char::from(b)
        } else {
            next += 1;
            char::from_u32(next - 1).expect("U+0100..U+0143 are characters")
        };
    }
    chars
}
