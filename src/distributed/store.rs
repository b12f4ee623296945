//! The store: a small TCP key-value server where the ranks of a multi-process
//! job find each other, PyTorch's c10d `TCPStore` behind `init_method="env://"`.
//!
//! Rank 0 hosts a [`StoreServer`] at `MASTER_ADDR:MASTER_PORT`; every rank,
//! rank 0 included, connects a [`StoreClient`] to it. Through the store the
//! ranks publish their addresses, rank 0 hands the NCCL unique id to the
//! others, and all of them meet in barriers. It carries a few hundred bytes
//! per job, never tensors.
//!
//! ```no_run
//! use std::time::Duration;
//! use workbook::distributed::store::{StoreClient, StoreServer};
//!
//! let server = StoreServer::bind("127.0.0.1:0", "secret")?; // on rank 0 only
//! let addr = server.local_addr().to_string();
//! let store = StoreClient::connect(&addr, "secret", Duration::from_secs(30))?;
//! store.set("nccl_id", &[7; 128])?; // rank 0 publishes...
//! let id = store.get("nccl_id", Duration::from_secs(30))?; // ...every rank reads
//! store.barrier("init", 1, Duration::from_secs(30))?;
//! # Ok::<(), std::io::Error>(())
//! ```
//!
//! ## Protocol
//!
//! Every message is a frame: a `u32` little-endian length, then that many
//! bytes. A connection opens with the [handshake](super::auth) in which each
//! side proves it knows the job token without sending it; the server closes
//! a connection that fails it. Then each request frame is an opcode byte and
//! its fields, each reply frame a status byte and its payload:
//!
//! | request                                  | reply                                |
//! |------------------------------------------|--------------------------------------|
//! | `SET` (1), key, value bytes              | `OK`                                 |
//! | `GET` (2), timeout ms (u64), key         | `OK` + value, or `NOT_FOUND` on timeout |
//! | `ADD` (3), delta (i64), key              | `OK` + new value (i64), or `ERROR` + message |
//!
//! A key is a `u32` length and UTF-8 bytes; integers are little-endian. `ADD`
//! stores its count as decimal text, as c10d does, so `get` can read it.

use std::collections::HashMap;
use std::io::{self, ErrorKind, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use super::auth::{self, Purpose};

/// The longest frame either side accepts. Store values are small (addresses,
/// a 128-byte NCCL id); the bound keeps a stray connection from making the
/// host allocate without limit.
const MAX_FRAME: usize = 16 << 20;
/// The longest job token.
const MAX_TOKEN: usize = 64 << 10;
/// How long a new connection may take to prove it knows the token, so a
/// silent stray connection holds only its own thread, and not for long.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How much longer than a request's own timeout a client waits for the reply
/// before it concludes the server is gone.
const REPLY_MARGIN: Duration = Duration::from_secs(5);
const RETRY_EVERY: Duration = Duration::from_millis(50);

const SET: u8 = 1;
const GET: u8 = 2;
const ADD: u8 = 3;

const OK: u8 = 0;
const NOT_FOUND: u8 = 1;
const ERROR: u8 = 3;

/// The `host:port` a store listens on, with brackets around an IPv6 host.
pub fn address(host: &str, port: u16) -> String {
    match host.contains(':') {
        true => format!("[{host}]:{port}"),
        false => format!("{host}:{port}"),
    }
}

/// Hosts the store: accepts clients on its own threads until dropped.
///
/// Dropping it closes every connection, as the exit of rank 0 would, so the
/// clients' requests fail instead of hanging.
pub struct StoreServer {
    addr: SocketAddr,
    shared: Arc<Shared>,
    accept: Option<JoinHandle<()>>,
}

struct Shared {
    token: String,
    state: Mutex<State>,
    /// Signalled when a key is set or the server closes, for blocked `GET`s.
    changed: Condvar,
}

#[derive(Default)]
struct State {
    data: HashMap<String, Vec<u8>>,
    /// A handle on every open connection, so that dropping the server can close them.
    open: HashMap<u64, TcpStream>,
    next_id: u64,
    closed: bool,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl StoreServer {
    /// Binds exactly `addr` (e.g. `"127.0.0.1:29500"`, or port 0 for any free
    /// port); it listens on all interfaces only if `addr` says `0.0.0.0`.
    /// Only clients presenting `token` are served.
    pub fn bind(addr: &str, token: &str) -> io::Result<StoreServer> {
        let listener = TcpListener::bind(addr).map_err(|e| {
            let hint = "is another job using MASTER_PORT? pick a free port";
            io::Error::new(e.kind(), format!("cannot host the store at {addr}: {e}; {hint}"))
        })?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared { token: token.to_string(), state: Mutex::default(), changed: Condvar::new() });
        let accepting = Arc::clone(&shared);
        let accept =
            thread::Builder::new().name("store-accept".into()).spawn(move || accept_loop(listener, accepting))?;
        Ok(StoreServer { addr, shared, accept: Some(accept) })
    }

    /// The address the store listens on, with the real port when bound to port 0.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for StoreServer {
    fn drop(&mut self) {
        {
            let mut state = self.shared.lock();
            state.closed = true;
            for stream in state.open.values() {
                let _ = stream.shutdown(Shutdown::Both);
            }
        }
        self.shared.changed.notify_all();
        // `accept` blocks until someone connects: be that someone, then it sees `closed`.
        let mut wake = self.addr;
        match wake.ip() {
            IpAddr::V4(ip) if ip.is_unspecified() => wake.set_ip(Ipv4Addr::LOCALHOST.into()),
            IpAddr::V6(ip) if ip.is_unspecified() => wake.set_ip(Ipv6Addr::LOCALHOST.into()),
            _ => {}
        }
        if TcpStream::connect_timeout(&wake, Duration::from_secs(1)).is_ok() {
            if let Some(accept) = self.accept.take() {
                let _ = accept.join();
            }
        }
    }
}

fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    for stream in listener.incoming() {
        let Ok(stream) = stream else {
            // Out of file descriptors, or a connection reset before accept: keep serving.
            thread::sleep(RETRY_EVERY);
            continue;
        };
        let id = {
            let mut state = shared.lock();
            if state.closed {
                return;
            }
            let Ok(handle) = stream.try_clone() else {
                continue;
            };
            state.next_id += 1;
            let id = state.next_id;
            state.open.insert(id, handle);
            id
        };
        let serving = Arc::clone(&shared);
        let spawned = thread::Builder::new().name("store-conn".into()).spawn(move || {
            // A stray or misbehaving client only loses its own connection.
            let _ = serve(stream, &serving);
            serving.lock().open.remove(&id);
        });
        if spawned.is_err() {
            shared.lock().open.remove(&id);
        }
    }
}

/// Serves one connection until its client leaves or breaks the protocol.
fn serve(mut stream: TcpStream, shared: &Shared) -> io::Result<()> {
    stream.set_nodelay(true)?;
    stream.set_read_timeout(Some(HANDSHAKE_TIMEOUT))?;
    if !auth::accept(&mut stream, &shared.token, Purpose::Store)? {
        // Drain what the client already sent before closing: closing with
        // unread data sends a reset, which could destroy the refusal in flight.
        stream.shutdown(Shutdown::Write)?;
        io::copy(&mut (&mut stream).take(MAX_FRAME as u64), &mut io::sink())?;
        return Ok(());
    }
    // A rank may stay quiet for a whole training run between two requests.
    stream.set_read_timeout(None)?;
    loop {
        let request = match read_frame(&mut stream, MAX_FRAME) {
            Err(e) if e.kind() == ErrorKind::UnexpectedEof => return Ok(()),
            request => request?,
        };
        let Some(reply) = handle(shared, &request)? else {
            return Ok(());
        };
        write_frame(&mut stream, &reply)?;
    }
}

/// The reply to one request; `None` once the server is closing.
fn handle(shared: &Shared, request: &[u8]) -> io::Result<Option<Vec<u8>>> {
    let (&opcode, mut fields) = request.split_first().ok_or_else(|| invalid("empty request"))?;
    match opcode {
        SET => {
            let key = take_key(&mut fields)?;
            shared.lock().data.insert(key, fields.to_vec());
            shared.changed.notify_all();
            Ok(Some(vec![OK]))
        }
        GET => {
            let millis = u64::from_le_bytes(take8(&mut fields)?);
            let key = take_key(&mut fields)?;
            let wait = Duration::from_millis(millis);
            let state = shared.lock();
            let (state, _) = shared
                .changed
                .wait_timeout_while(state, wait, |s| !s.closed && !s.data.contains_key(&key))
                .unwrap_or_else(PoisonError::into_inner);
            Ok(match state.data.get(&key) {
                _ if state.closed => None,
                Some(value) => Some([&[OK], &value[..]].concat()),
                None => Some(vec![NOT_FOUND]),
            })
        }
        ADD => {
            let delta = i64::from_le_bytes(take8(&mut fields)?);
            let key = take_key(&mut fields)?;
            let mut state = shared.lock();
            let old = match state.data.get(&key) {
                None => Some(0),
                Some(text) => std::str::from_utf8(text).ok().and_then(|t| t.parse::<i64>().ok()),
            };
            let Some(new) = old.and_then(|old| old.checked_add(delta)) else {
                let message = format!("key {key:?} does not hold an integer that can take {delta:+}");
                return Ok(Some([&[ERROR], message.as_bytes()].concat()));
            };
            state.data.insert(key, new.to_string().into_bytes());
            shared.changed.notify_all();
            Ok(Some([&[OK][..], &new.to_le_bytes()].concat()))
        }
        _ => Err(invalid(&format!("unknown opcode {opcode}"))),
    }
}

/// One connection to the store. Its methods take `&self`, so the threads of a
/// rank can share it; their requests take turns on the one connection.
pub struct StoreClient {
    addr: String,
    conn: Mutex<Conn>,
}

struct Conn {
    stream: TcpStream,
    /// The error that broke this connection: after a lost reply, the next one
    /// read could belong to the wrong request, so every later request fails too.
    broken: Option<(ErrorKind, String)>,
}

impl StoreClient {
    /// Connects to `addr` (`"host:port"`), retrying every 50 ms until
    /// `timeout` passes, because rank 0 may start hosting later than this
    /// rank starts. Then each side proves it knows `token` (without sending
    /// it): a wrong one, or a server that is not of this job, fails with
    /// [`ErrorKind::PermissionDenied`].
    pub fn connect(addr: &str, token: &str, timeout: Duration) -> io::Result<StoreClient> {
        if token.len() > MAX_TOKEN {
            return Err(io::Error::new(ErrorKind::InvalidInput, "job token over 64 KiB"));
        }
        let started = Instant::now();
        let mut stream = loop {
            // Short attempts: a lost SYN to a host still booting should be retried soon.
            let left = timeout.saturating_sub(started.elapsed()).clamp(RETRY_EVERY, Duration::from_secs(2));
            let attempt = addr.to_socket_addrs().and_then(|mut candidates| {
                let target = candidates.next().ok_or(ErrorKind::NotFound)?;
                TcpStream::connect_timeout(&target, left)
            });
            match attempt {
                Ok(stream) => break stream,
                Err(e) if started.elapsed() >= timeout => {
                    let hint = "check MASTER_ADDR and MASTER_PORT, and that rank 0 is running";
                    let message = format!("no store at {addr} after {timeout:?} ({e}): {hint}");
                    return Err(io::Error::new(ErrorKind::TimedOut, message));
                }
                Err(_) => thread::sleep(RETRY_EVERY),
            }
        };
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(timeout.max(HANDSHAKE_TIMEOUT)))?;
        let peer = format!("the store at {addr}");
        auth::dial(&mut stream, token, Purpose::Store, &peer).map_err(|e| match e.kind() {
            ErrorKind::PermissionDenied => e,
            _ => io::Error::new(
                e.kind(),
                format!("{peer} broke off the handshake ({e}): is MASTER_PORT another program's?"),
            ),
        })?;
        Ok(StoreClient { addr: addr.to_string(), conn: Mutex::new(Conn { stream, broken: None }) })
    }

    /// Sets `key` to `value`, waking every client waiting for it in [`get`](Self::get).
    pub fn set(&self, key: &str, value: &[u8]) -> io::Result<()> {
        let request = [&[SET], &key_field(key)[..], value].concat();
        self.request(&request, Duration::ZERO).map(drop)
    }

    /// Waits until `key` is set (by any client), up to `timeout`, and returns its value.
    pub fn get(&self, key: &str, timeout: Duration) -> io::Result<Vec<u8>> {
        let millis = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX);
        let request = [&[GET], &millis.to_le_bytes()[..], &key_field(key)].concat();
        match self.request(&request, timeout)? {
            (OK, value) => Ok(value),
            _ => {
                let message = format!("key {key:?} was not set within {timeout:?}");
                let hint = "did the rank that sets it fail?";
                Err(io::Error::new(ErrorKind::TimedOut, format!("{message}: {hint}")))
            }
        }
    }

    /// Atomically adds `delta` to the integer stored at `key` (absent counts
    /// as 0) and returns the new value.
    pub fn add(&self, key: &str, delta: i64) -> io::Result<i64> {
        let request = [&[ADD], &delta.to_le_bytes()[..], &key_field(key)].concat();
        match self.request(&request, Duration::ZERO)? {
            (OK, value) => Ok(i64::from_le_bytes(take8(&mut &value[..])?)),
            (_, message) => {
                let message = format!("the store at {}: {}", self.addr, String::from_utf8_lossy(&message));
                Err(io::Error::new(ErrorKind::InvalidInput, message))
            }
        }
    }

    /// Returns once `world_size` clients have called `barrier` with the same
    /// `name`, or fails after `timeout`. Use each name once per job: the count
    /// of arrivals at `barrier/{name}` is never reset.
    pub fn barrier(&self, name: &str, world_size: usize, timeout: Duration) -> io::Result<()> {
        let started = Instant::now();
        self.arrive(name, world_size)?;
        self.released(name, world_size, timeout.saturating_sub(started.elapsed()))
    }

    /// The first half of [`barrier`](Self::barrier): counts this client in
    /// at barrier `name`, releasing the others if it is the last of `world_size`.
    pub fn arrive(&self, name: &str, world_size: usize) -> io::Result<()> {
        let arrivals = format!("barrier/{name}");
        let arrived = self.add(&arrivals, 1)?;
        if arrived > world_size as i64 {
            let message = format!(
                "barrier {name:?} saw {arrived} arrivals for world size {world_size}: \
                 use each barrier name once, and the same world size on every rank"
            );
            return Err(io::Error::new(ErrorKind::InvalidInput, message));
        }
        if arrived == world_size as i64 {
            self.set(&format!("{arrivals}/done"), b"1")?; // the last to arrive releases the others
        }
        Ok(())
    }

    /// The second half of [`barrier`](Self::barrier): waits up to `timeout`
    /// for the last of `world_size` to arrive at barrier `name`. It may be
    /// called again after a timeout, to wait longer.
    pub fn released(&self, name: &str, world_size: usize, timeout: Duration) -> io::Result<()> {
        let arrivals = format!("barrier/{name}");
        match self.get(&format!("{arrivals}/done"), timeout) {
            Err(e) if e.kind() == ErrorKind::TimedOut => {
                let arrived = self.add(&arrivals, 0)?;
                if arrived == world_size as i64 {
                    return Ok(()); // the last arrived as the wait ran out, before it set `done`
                }
                let message = format!(
                    "barrier {name:?} timed out after {timeout:?}: \
                     {arrived} of {world_size} ranks arrived; a missing rank may have failed"
                );
                Err(io::Error::new(ErrorKind::TimedOut, message))
            }
            result => result.map(drop),
        }
    }

    /// Sends one request and returns the reply's status and payload; a request
    /// the server may hold for `wait` gets that long plus a margin.
    fn request(&self, request: &[u8], wait: Duration) -> io::Result<(u8, Vec<u8>)> {
        if request.len() > MAX_FRAME {
            let message = format!("a store request of {} bytes is over 16 MiB", request.len());
            return Err(io::Error::new(ErrorKind::InvalidInput, message));
        }
        let mut conn = self.conn.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((kind, message)) = &conn.broken {
            return Err(io::Error::new(*kind, message.clone()));
        }
        let limit = wait.saturating_add(REPLY_MARGIN);
        let stream = &mut conn.stream;
        let reply = stream
            .set_read_timeout(Some(limit))
            .and_then(|()| write_frame(stream, request))
            .and_then(|()| read_frame(stream, MAX_FRAME))
            .map_err(|e| self.explain(e, limit))
            .and_then(|mut reply| match reply.first() {
                Some(_) => Ok((reply.remove(0), reply)),
                None => Err(invalid("empty reply")),
            });
        if let Err(e) = &reply {
            conn.broken = Some((e.kind(), e.to_string()));
        }
        reply
    }

    /// Turns a socket error into what it most likely means for the job.
    fn explain(&self, e: io::Error, limit: Duration) -> io::Error {
        let addr = &self.addr;
        let (kind, message) = match e.kind() {
            ErrorKind::UnexpectedEof
            | ErrorKind::ConnectionReset
            | ErrorKind::ConnectionAborted
            | ErrorKind::BrokenPipe => (
                ErrorKind::ConnectionAborted,
                "closed the connection: rank 0 (which hosts it) may have exited".to_string(),
            ),
            ErrorKind::WouldBlock | ErrorKind::TimedOut => {
                (ErrorKind::TimedOut, format!("did not answer within {limit:?}: is rank 0 alive?"))
            }
            kind => (kind, format!("failed: {e}")),
        };
        io::Error::new(kind, format!("the store at {addr} {message}"))
    }
}

fn invalid(what: &str) -> io::Error {
    io::Error::new(ErrorKind::InvalidData, format!("store protocol violation: {what}"))
}

/// Writes one frame; `body` is at most `MAX_FRAME`, which the callers ensure.
fn write_frame(stream: &mut TcpStream, body: &[u8]) -> io::Result<()> {
    // One write, so a frame never leaves as two small packets.
    stream.write_all(&[&(body.len() as u32).to_le_bytes()[..], body].concat())
}

/// Reads one frame of at most `max` bytes. The buffer grows with the bytes
/// that actually arrive, so a lying length prefix allocates nothing.
fn read_frame(stream: &mut TcpStream, max: usize) -> io::Result<Vec<u8>> {
    let mut prefix = [0; 4];
    stream.read_exact(&mut prefix)?;
    let len = u32::from_le_bytes(prefix) as usize;
    if len > max {
        return Err(invalid(&format!("a frame of {len} bytes is over the limit of {max}")));
    }
    let mut body = Vec::new();
    stream.take(len as u64).read_to_end(&mut body)?;
    if body.len() < len {
        return Err(ErrorKind::UnexpectedEof.into());
    }
    Ok(body)
}

fn key_field(key: &str) -> Vec<u8> {
    [&(key.len() as u32).to_le_bytes()[..], key.as_bytes()].concat()
}

/// Splits the first `n` bytes off `fields`.
fn take<'a>(fields: &mut &'a [u8], n: usize) -> io::Result<&'a [u8]> {
    if fields.len() < n {
        return Err(invalid("a message shorter than its fields"));
    }
    let (head, rest) = fields.split_at(n);
    *fields = rest;
    Ok(head)
}

fn take8(fields: &mut &[u8]) -> io::Result<[u8; 8]> {
    Ok(take(fields, 8)?.try_into().unwrap()) // `take` returned exactly 8 bytes
}

fn take_key(fields: &mut &[u8]) -> io::Result<String> {
    let len = u32::from_le_bytes(take(fields, 4)?.try_into().unwrap()) as usize;
    let bytes = take(fields, len)?;
    String::from_utf8(bytes.to_vec()).map_err(|_| invalid("key is not UTF-8"))
}
