//! Tokenising a text file of any size, a chunk at a time.
//!
//! A data file holds documents separated by `<|endoftext|>` markers (TinyStories
//! puts each marker on its own line; a plain text file with no markers is one
//! long document). Each document is trimmed of the whitespace around it,
//! encoded, and followed by the end-of-text id, so the token stream reads
//! `story, eot, story, eot, ...` and a model learns where a story ends.
//!
//! The file is read `chunk_bytes` at a time, so memory stays flat while a
//! multi-gigabyte OpenWebText file goes through. A chunk is cut where a
//! printable ASCII character meets whitespace: GPT-2's pre-tokenizer never puts
//! such a pair inside one piece, so encoding chunk by chunk gives exactly the
//! ids of encoding each whole document at once, whatever the chunk size.

use std::io::Read;

use candle_core::Result;

use super::tokenizer::{Tokenizer, END_OF_TEXT};
use crate::error::io_context;

/// The chunk size [`super::TokenFile`] reads with: large enough that a chunk
/// holds many documents, small enough to leave memory flat.
pub const DEFAULT_CHUNK_BYTES: usize = 4 << 20;

/// Encodes the documents of `reader` with `tokenizer`, reading `chunk_bytes` at
/// a time. `sink` receives the ids of each chunk, in order, with the number of
/// bytes of `reader` consumed so far (for a progress bar).
pub fn encode_documents<R: Read>(
    mut reader: R,
    tokenizer: Tokenizer,
    chunk_bytes: usize,
    mut sink: impl FnMut(&[u32], u64) -> Result<()>,
) -> Result<()> {
    let chunk_bytes = chunk_bytes.max(1);
    let mut splitter = DocumentSplitter::default();
    // Bytes read but not yet encoded: the tail of the last chunk after its cut.
    let mut pending: Vec<u8> = Vec::with_capacity(2 * chunk_bytes);
    let mut consumed = 0u64;
    let mut eof = false;
    let mut ids = Vec::new();
    while !eof {
        let read = read_up_to(&mut reader, &mut pending, chunk_bytes)?;
        eof = read < chunk_bytes;
        let cut = if eof {
            pending.len()
        } else {
            match last_cut(&pending) {
                Some(cut) => cut,
                // No whitespace for megabytes (not text): cut anywhere rather than grow without bound.
                None if pending.len() >= 4 * chunk_bytes.max(1 << 20) => start_of_last_char(&pending),
                None => continue,
            }
        };
        let chunk = String::from_utf8_lossy(&pending[..cut]).into_owned();
        pending.drain(..cut);
        consumed += cut as u64;
        ids.clear();
        splitter.encode(&chunk, eof, tokenizer, &mut ids);
        sink(&ids, consumed)?;
    }
    Ok(())
}

/// Appends up to `n` bytes of `reader` to `buf`; fewer only at the end of the input.
fn read_up_to<R: Read>(reader: &mut R, buf: &mut Vec<u8>, n: usize) -> Result<usize> {
    let before = buf.len();
    reader.take(n as u64).read_to_end(buf).map_err(|e| io_context("reading the text file failed", e))?;
    Ok(buf.len() - before)
}

/// The last position where a printable ASCII byte is followed by whitespace.
fn last_cut(bytes: &[u8]) -> Option<usize> {
    (1..bytes.len()).rev().find(|&i| bytes[i - 1].is_ascii_graphic() && bytes[i].is_ascii_whitespace())
}

/// Where the last (possibly incomplete) UTF-8 character of `bytes` starts.
fn start_of_last_char(bytes: &[u8]) -> usize {
    let mut i = bytes.len() - 1;
    // Continuation bytes look like 0b10xx_xxxx.
    while i > 0 && bytes[i] & 0xC0 == 0x80 {
        i -= 1;
    }
    if i == 0 {
        bytes.len()
    } else {
        i
    }
}

/// Where the stream stands between chunks: inside a document or at the start of one.
#[derive(Default)]
struct DocumentSplitter {
    /// Whether the current document already has text (and so gets an end-of-text id).
    document_has_text: bool,
}

impl DocumentSplitter {
    /// Encodes one chunk into `ids`. The chunk ends at a cut, so a document
    /// split across chunks has no whitespace at the split to trim.
    fn encode(&mut self, chunk: &str, last: bool, tokenizer: Tokenizer, ids: &mut Vec<u32>) {
        let mut parts = chunk.split(END_OF_TEXT).peekable();
        while let Some(part) = parts.next() {
            let ends_document = parts.peek().is_some();
            let mut text = part;
            if !self.document_has_text {
                text = text.trim_start();
            }
            if ends_document || last {
                text = text.trim_end();
            }
            if !text.is_empty() {
                ids.extend(tokenizer.encode(text));
                self.document_has_text = true;
            }
            if ends_document && self.document_has_text {
                ids.push(tokenizer.eot());
                self.document_has_text = false;
            }
        }
    }
}
