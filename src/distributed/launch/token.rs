//! The job's secret, which every process of the job proves it knows (see
//! [`auth`](crate::distributed::auth)) before the store or another rank
//! serves it.
//!
//! On one machine the launcher makes a fresh random token and hands it to its
//! ranks in their environment. A job that spans machines needs the same token
//! on every node, and one that anybody could guess would let any process that
//! reaches the port steer the job: so it comes from the user, either
//! `WORKBOOK_JOB_TOKEN` on every node or `--token-file PATH`, which node 0
//! fills with a fresh token (readable by its owner only) when the file does
//! not exist yet, for the other nodes to read (a shared filesystem, or a copy).

use std::fs;
use std::io::{ErrorKind, Write};
use std::path::Path;
use std::thread;
use std::time::{Duration, Instant};

use candle_core::{bail, Result};

use super::LaunchConfig;
use crate::error::io_path;

/// The variable that carries the token to a process of the job.
pub const TOKEN_VARIABLE: &str = "WORKBOOK_JOB_TOKEN";

/// The job's token for this node's launcher, from the environment, the
/// token file, or (on one machine) made afresh.
pub(super) fn job_token(config: &LaunchConfig) -> Result<String> {
    if let Ok(token) = std::env::var(TOKEN_VARIABLE) {
        return checked(token, TOKEN_VARIABLE);
    }
    if let Some(path) = &config.token_file {
        return match config.node_rank {
            0 => read_or_create(path),
            _ => read_when_there(path, config.timeout()),
        };
    }
    if config.nnodes == 1 {
        return Ok(fresh());
    }
    bail!(
        "launch: a job on up to {} machines needs a secret that only its nodes know, or any process that reaches \
         port {} could join or steer it: pass --token-file PATH on every node (node 0 writes a fresh token there, \
         readable only by you; give the other nodes the same file, on a shared filesystem or by copying it), or \
         set {TOKEN_VARIABLE} to the same random value on every node",
        config.nnodes,
        config.master_port.map_or("MASTER_PORT".to_string(), |p| p.to_string())
    )
}

/// 256 random bits, as hex.
fn fresh() -> String {
    rand::random::<[u8; 32]>().iter().map(|b| format!("{b:02x}")).collect()
}

/// The fewest characters a token the user gives may have: a short one can
/// be guessed by whoever reaches the port.
const SHORTEST_TOKEN: usize = 16;

fn checked(token: String, from: &str) -> Result<String> {
    match token.trim() {
        "" => bail!("launch: {from} holds no token: it is empty"),
        token if token.chars().count() < SHORTEST_TOKEN => bail!(
            "launch: {from} holds a token of {} characters, which could be guessed: use at least {SHORTEST_TOKEN} \
             random ones, e.g. the output of `openssl rand -hex 32` (or pass --token-file PATH on node 0, which \
             writes a fresh one there)",
            token.chars().count()
        ),
        token => Ok(token.to_string()),
    }
}

/// Node 0: the token in `path`, or a fresh one written there first.
fn read_or_create(path: &Path) -> Result<String> {
    let mut options = fs::File::options();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    match options.open(path) {
        Ok(mut file) => {
            let token = fresh();
            file.write_all(token.as_bytes()).and_then(|()| file.sync_all()).map_err(|e| io_path("write", path, e))?;
            eprintln!(
                "launch: wrote a new job token to {} (readable only by you): give every other node the same file \
                 with --token-file",
                path.display()
            );
            Ok(token)
        }
        Err(e) if e.kind() == ErrorKind::AlreadyExists => read(path),
        Err(e) => Err(io_path("create", path, e)),
    }
}

/// The other nodes: the token in `path`, waiting up to `timeout` for node 0
/// to write it (on a filesystem the nodes share).
fn read_when_there(path: &Path, timeout: Duration) -> Result<String> {
    let started = Instant::now();
    // Node 0 writes the token with one write, just after creating the file.
    while !fs::metadata(path).is_ok_and(|m| m.len() > 0) {
        if started.elapsed() >= timeout {
            bail!(
                "launch: no token file at {} after {timeout:?}: copy node 0's (it writes one when it starts with \
                 --token-file), or share the directory between the nodes",
                path.display()
            );
        }
        thread::sleep(Duration::from_millis(100));
    }
    read(path)
}

/// The token in `path`, refused if other users can read it.
fn read(path: &Path) -> Result<String> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = fs::metadata(path).map_err(|e| io_path("read", path, e))?.permissions().mode();
        if mode & 0o077 != 0 {
            bail!(
                "launch: {} can be read by other users (mode {:o}): a job token must be yours alone; run \
                 `chmod 600 {}`",
                path.display(),
                mode & 0o777,
                path.display()
            );
        }
    }
    let text = fs::read_to_string(path).map_err(|e| io_path("read", path, e))?;
    checked(text, &path.display().to_string())
}
