//! I/O errors that keep their cause.
//!
//! candle's [`Error`] has an `Io` variant; an `io::Error` put there with words
//! that say what was being done keeps its [`io::ErrorKind`] (so a caller can
//! still tell "not found" from "permission denied") and its source (so
//! `anyhow`'s `{:#}` and `Error::source` reach it), where formatting it into
//! a message string would lose both.

use std::fmt;
use std::io;
use std::path::Path;

use candle_core::Error;

/// `source`, described by `context`: displays as `{context}: {source}`.
pub fn io_context(context: impl Into<String>, source: io::Error) -> Error {
    Error::Io(io::Error::new(source.kind(), Described { context: context.into(), source }))
}

/// `cannot {action} {path}: {source}`, e.g. `cannot open data/x.bin: No such file or directory`.
pub fn io_path(action: &str, path: &Path, source: io::Error) -> Error {
    io_context(format!("cannot {action} {}", path.display()), source)
}

#[derive(Debug)]
struct Described {
    context: String,
    source: io::Error,
}

impl fmt::Display for Described {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.context, self.source)
    }
}

impl std::error::Error for Described {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
    }
}
