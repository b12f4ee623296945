//! A text file tokenised once, then memory-mapped.
//!
//! Tokenising OpenWebText takes minutes; a training run should not pay that
//! every start. So the tokens of `data.txt` are written once to
//! `data.txt.<tokenizer>.tokens` beside it, and later runs map that file into
//! memory: opening is instant, the OS pages in only the windows a batch reads,
//! and every rank on a machine shares the same pages.
//!
//! Layout: a 64-byte header, then the ids as little-endian `u16` (when the
//! vocabulary fits, halving the file) or `u32`.
//!
//! | bytes  | field |
//! |--------|-------|
//! | 0..8   | magic `WBTOKENS` |
//! | 8..12  | format version (`u32`) |
//! | 12..16 | bytes per token, 2 or 4 (`u32`) |
//! | 16..24 | number of tokens (`u64`) |
//! | 24..32 | length of the source text in bytes (`u64`) |
//! | 32..40 | the source text's modification time, seconds since 1970 (`u64`) |
//! | 40..44 | ... and its nanoseconds (`u32`) |
//! | 44..48 | reserved, zero |
//! | 48..64 | tokenizer name, ASCII, zero-padded |
//!
//! The source's length and modification time let a changed text be noticed
//! and tokenised again. The file is written under a temporary name and renamed
//! into place at the end, so a run interrupted half-way leaves no token file
//! at all rather than a broken one.

use std::fs::{self, File};
use std::io::{BufWriter, Read, Seek, SeekFrom, Write};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::UNIX_EPOCH;

use candle_core::{bail, Error, Result};
use memmap2::Mmap;

use super::documents::{encode_documents, DEFAULT_CHUNK_BYTES};
use super::tokenizer::Tokenizer;
use crate::error::io_path;
use crate::words::count;

const MAGIC: &[u8; 8] = b"WBTOKENS";
const VERSION: u32 = 1;
const HEADER_BYTES: usize = 64;
const NAME_BYTES: usize = 16;

/// How far tokenising a text file has got, for a progress bar.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Progress {
    /// Bytes of the text tokenised so far.
    pub bytes_done: u64,
    /// Bytes in the whole text.
    pub bytes_total: u64,
    /// Tokens written so far.
    pub tokens: u64,
}

/// The tokens of one text file under one tokenizer, memory-mapped.
pub struct TokenFile {
    path: PathBuf,
    map: Mmap,
    tokenizer: Tokenizer,
    token_bytes: usize,
    len: usize,
    tokenised_now: bool,
}

impl std::fmt::Debug for TokenFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TokenFile({}: {}, tokenizer {})", self.path.display(), count(self.len, "token"), self.tokenizer)
    }
}

impl TokenFile {
    /// Where the tokens of `text` live: `<text>.<tokenizer>.tokens`.
    pub fn path_for(text: &Path, tokenizer: Tokenizer) -> PathBuf {
        let mut name = text.as_os_str().to_owned();
        name.push(format!(".{}.tokens", tokenizer.name()));
        PathBuf::from(name)
    }

    /// The tokens of `text`: read from its token file when that file is up to
    /// date, otherwise tokenised now (reporting to `progress`) and saved.
    pub fn open_or_create(
        text: &Path,
        tokenizer: Tokenizer,
        progress: Option<&mut dyn FnMut(Progress)>,
    ) -> Result<Self> {
        let source = SourceStamp::of(text)?;
        let path = Self::path_for(text, tokenizer);
        if path.exists() {
            let header = read_header(&path)?;
            if header.tokenizer != tokenizer.name() {
                bail!(
                    "token file {} holds `{}` tokens, not `{}`: it was renamed or is corrupt; delete it and run again",
                    path.display(),
                    header.tokenizer,
                    tokenizer
                );
            }
            if header.version == VERSION && header.source == source {
                return Self::map(&path, header, tokenizer, false);
            }
        }
        write_token_file(text, &path, tokenizer, source, progress)?;
        let header = read_header(&path)?;
        Self::map(&path, header, tokenizer, true)
    }

    /// Opens an existing token file, checking that it is whole.
    pub fn open(path: &Path) -> Result<Self> {
        let header = read_header(path)?;
        let tokenizer: Tokenizer =
            header.tokenizer.parse().map_err(|e| corrupt(path, &format!("its header names {e}")))?;
        Self::map(path, header, tokenizer, false)
    }

    fn map(path: &Path, header: Header, tokenizer: Tokenizer, tokenised_now: bool) -> Result<Self> {
        let file = File::open(path).map_err(|e| io_path("open", path, e))?;
        // SAFETY: the map is read-only and the file is ours; a token file is
        // only ever replaced by renaming a new one over it, which leaves this
        // mapping on the old contents.
        let map = unsafe { Mmap::map(&file) }.map_err(|e| io_path("memory-map", path, e))?;
        let expected = (HEADER_BYTES as u64).checked_add(header.len.saturating_mul(header.token_bytes as u64));
        if expected != Some(map.len() as u64) {
            return Err(corrupt(
                path,
                &format!(
                    "its header promises {} tokens of {} bytes but it holds {} bytes: it is truncated",
                    header.len,
                    header.token_bytes,
                    map.len()
                ),
            ));
        }
        let len = usize::try_from(header.len).map_err(|_| corrupt(path, "too many tokens for this machine"))?;
        Ok(Self { path: path.to_owned(), map, tokenizer, token_bytes: header.token_bytes, len, tokenised_now })
    }

    /// Where the token file is.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The tokenizer that made the tokens.
    pub fn tokenizer(&self) -> Tokenizer {
        self.tokenizer
    }

    /// Number of tokens.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the file holds no tokens.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// True when this open tokenised the text; false when it reused the token file.
    pub fn tokenised_now(&self) -> bool {
        self.tokenised_now
    }

    /// Appends the tokens at positions `range` to `out`. Panics if the range is out of bounds.
    pub fn read_into(&self, range: Range<usize>, out: &mut Vec<u32>) {
        assert!(range.end <= self.len, "token range {range:?} past the end of {} tokens", self.len);
        let w = self.token_bytes;
        let bytes = &self.map[HEADER_BYTES + range.start * w..HEADER_BYTES + range.end * w];
        match w {
            2 => out.extend(bytes.chunks_exact(2).map(|b| u32::from(u16::from_le_bytes([b[0], b[1]])))),
            _ => out.extend(bytes.chunks_exact(4).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))),
        }
    }
}

/// The token file is damaged: say so, and what to do.
fn corrupt(path: &Path, why: &str) -> Error {
    Error::msg(format!(
        "token file {} is corrupt: {why}. Delete it and run again; it is re-made from its text file",
        path.display()
    ))
}

/// The length and modification time of a source text: when either changes, its tokens are stale.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct SourceStamp {
    len: u64,
    mtime_secs: u64,
    mtime_nanos: u32,
}

impl SourceStamp {
    fn of(text: &Path) -> Result<Self> {
        let meta = fs::metadata(text).map_err(|e| io_path("read", text, e))?;
        // A platform without modification times falls back to the length alone.
        let mtime = meta.modified().ok().and_then(|t| t.duration_since(UNIX_EPOCH).ok()).unwrap_or_default();
        Ok(Self { len: meta.len(), mtime_secs: mtime.as_secs(), mtime_nanos: mtime.subsec_nanos() })
    }
}

/// The header of a token file.
#[derive(Debug)]
struct Header {
    version: u32,
    token_bytes: usize,
    len: u64,
    source: SourceStamp,
    tokenizer: String,
}

impl Header {
    fn to_bytes(&self) -> [u8; HEADER_BYTES] {
        let mut b = [0u8; HEADER_BYTES];
        b[0..8].copy_from_slice(MAGIC);
        b[8..12].copy_from_slice(&self.version.to_le_bytes());
        b[12..16].copy_from_slice(&(self.token_bytes as u32).to_le_bytes());
        b[16..24].copy_from_slice(&self.len.to_le_bytes());
        b[24..32].copy_from_slice(&self.source.len.to_le_bytes());
        b[32..40].copy_from_slice(&self.source.mtime_secs.to_le_bytes());
        b[40..44].copy_from_slice(&self.source.mtime_nanos.to_le_bytes());
        let name = self.tokenizer.as_bytes();
        b[48..48 + name.len()].copy_from_slice(name);
        b
    }

    fn from_bytes(b: &[u8; HEADER_BYTES], path: &Path) -> Result<Self> {
        if &b[0..8] != MAGIC {
            return Err(corrupt(path, "it does not start with the token file magic `WBTOKENS`"));
        }
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().unwrap());
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap());
        let token_bytes = u32_at(12) as usize;
        if token_bytes != 2 && token_bytes != 4 {
            return Err(corrupt(path, &format!("its header gives {token_bytes} bytes per token, not 2 or 4")));
        }
        let name = &b[48..48 + NAME_BYTES];
        let name = &name[..name.iter().position(|&c| c == 0).unwrap_or(NAME_BYTES)];
        let tokenizer =
            String::from_utf8(name.to_vec()).map_err(|_| corrupt(path, "its tokenizer name is not text"))?;
        Ok(Self {
            version: u32_at(8),
            token_bytes,
            len: u64_at(16),
            source: SourceStamp { len: u64_at(24), mtime_secs: u64_at(32), mtime_nanos: u32_at(40) },
            tokenizer,
        })
    }
}

fn read_header(path: &Path) -> Result<Header> {
    let bytes = File::open(path).and_then(|mut f| {
        let mut b = [0u8; HEADER_BYTES];
        f.read_exact(&mut b).map(|_| b)
    });
    match bytes {
        Ok(b) => Header::from_bytes(&b, path),
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
            Err(corrupt(path, "it is shorter than its 64-byte header"))
        }
        Err(e) => Err(io_path("read", path, e)),
    }
}

/// Tokenises `text` into a temporary file beside `path`, then renames it to `path`.
fn write_token_file(
    text: &Path,
    path: &Path,
    tokenizer: Tokenizer,
    source: SourceStamp,
    mut progress: Option<&mut dyn FnMut(Progress)>,
) -> Result<()> {
    let token_bytes = if tokenizer.vocab_size() <= 1 << 16 { 2 } else { 4 };
    let tmp = temp_path(path);
    let result = (|| {
        let input = File::open(text).map_err(|e| io_path("read", text, e))?;
        let file = File::create(&tmp).map_err(|e| io_path("create", &tmp, e))?;
        let mut out = BufWriter::new(file);
        let mut header = Header { version: VERSION, token_bytes, len: 0, source, tokenizer: tokenizer.name().into() };
        // A zeroed placeholder: a file left behind half-written has no magic.
        out.write_all(&[0u8; HEADER_BYTES]).map_err(|e| io_path("write", &tmp, e))?;
        let mut bytes = Vec::new();
        encode_documents(input, tokenizer, DEFAULT_CHUNK_BYTES, |ids, bytes_done| {
            bytes.clear();
            for &id in ids {
                match token_bytes {
                    2 => bytes.extend_from_slice(&(id as u16).to_le_bytes()),
                    _ => bytes.extend_from_slice(&id.to_le_bytes()),
                }
            }
            out.write_all(&bytes).map_err(|e| io_path("write", &tmp, e))?;
            header.len += ids.len() as u64;
            if let Some(report) = progress.as_mut() {
                report(Progress { bytes_done, bytes_total: source.len, tokens: header.len });
            }
            Ok(())
        })?;
        let mut file = out.into_inner().map_err(|e| io_path("write", &tmp, e.into_error()))?;
        file.seek(SeekFrom::Start(0)).map_err(|e| io_path("write", &tmp, e))?;
        file.write_all(&header.to_bytes()).map_err(|e| io_path("write", &tmp, e))?;
        file.sync_all().map_err(|e| io_path("write", &tmp, e))?;
        drop(file);
        fs::rename(&tmp, path).map_err(|e| io_path("rename the new token file to", path, e))
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

/// A temporary name beside `path`, unique per process and call, so ranks that
/// tokenise the same text at once never write into each other's file.
fn temp_path(path: &Path) -> PathBuf {
    static CALLS: AtomicU64 = AtomicU64::new(0);
    let mut name = path.as_os_str().to_owned();
    name.push(format!(".tmp-{}-{}", std::process::id(), CALLS.fetch_add(1, Ordering::Relaxed)));
    PathBuf::from(name)
}
