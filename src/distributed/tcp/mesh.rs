//! A connection from every rank to every other rank, found through the store.
//!
//! Each rank listens on an ephemeral port of its own address and publishes
//! `addr/<rank>` in the store. Rank `r` then connects to every lower rank and
//! accepts a connection from every higher one, so each pair has exactly one
//! socket. A connection opens with the job token and the connecting rank's
//! number; anything else on the port is closed unread.
//!
//! Reading is done by the rank's own thread. Writing goes through one thread
//! per peer, so that a send returns at once: in a ring every rank sends before
//! it receives, and with blocking writes of large chunks all of them would
//! wait for each other forever.

use std::cell::RefCell;
use std::io::{self, ErrorKind, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::sync::mpsc::{self, Sender};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use candle_core::{Error, Result};

use super::wire::{Frame, Header, HEADER_BYTES, MAX_REASON};
use crate::distributed::store::StoreClient;
use crate::error::io_context;

const HELLO: &[u8; 4] = b"WBRK";
/// A stranger's token is read only up to this length.
const MAX_TOKEN: usize = 1024;

/// This rank's connections to the others.
pub(super) struct Mesh {
    rank: usize,
    /// Indexed by rank; `None` at this rank's own index.
    peers: Vec<Option<Peer>>,
    timeout: Duration,
    /// Why this rank gave up, once it has: every later call fails with it.
    failure: RefCell<Option<String>>,
}

struct Peer {
    stream: TcpStream,
    /// Frames for the writer thread; `None` once the mesh is closing.
    outbox: Option<Sender<Vec<u8>>>,
    writer: Option<JoinHandle<()>>,
    /// The first write error, reported by this rank's next call.
    write_error: Arc<Mutex<Option<String>>>,
}

impl Mesh {
    /// Connects rank `rank` of `world_size` to every other rank.
    pub fn connect(
        store: &StoreClient,
        rank: usize,
        world_size: usize,
        host: IpAddr,
        token: &str,
        timeout: Duration,
    ) -> Result<Self> {
        let listener =
            TcpListener::bind((host, 0)).map_err(|e| io_context(format!("rank {rank} cannot listen on {host}"), e))?;
        let me = listener.local_addr()?;
        store.set(&format!("addr/{rank}"), me.to_string().as_bytes())?;
        let mut streams: Vec<Option<TcpStream>> = (0..world_size).map(|_| None).collect();
        for (peer, slot) in streams.iter_mut().enumerate().take(rank) {
            let addr = store
                .get(&format!("addr/{peer}"), timeout)
                .map_err(|e| Error::Msg(format!("rank {rank} never learned rank {peer}'s address: {e}")))?;
            *slot = Some(dial(&addr, rank, peer, token, timeout)?);
        }
        accept_higher(&listener, &mut streams, rank, token, timeout)?;
        let peers = streams
            .into_iter()
            .enumerate()
            .map(|(r, s)| s.map(|s| Peer::start(s, r, timeout)).transpose())
            .collect::<Result<_>>()?;
        Ok(Self { rank, peers, timeout, failure: RefCell::new(None) })
    }

    /// Queues `header` and `payload` for rank `to`; returns before they arrive.
    pub fn send(&self, to: usize, header: &Header, payload: &[u8]) -> Result<()> {
        self.check_failed()?;
        self.post(to, &header.encode(), payload)
    }

    fn post(&self, to: usize, header: &[u8; HEADER_BYTES], payload: &[u8]) -> Result<()> {
        let peer = self.peer(to)?;
        if let Some(e) = peer.write_error.lock().unwrap_or_else(PoisonError::into_inner).as_ref() {
            return Err(Error::Msg(format!("rank {} could not send to rank {to}: {e}", self.rank)));
        }
        let mut frame = Vec::with_capacity(HEADER_BYTES + payload.len());
        frame.extend_from_slice(header);
        frame.extend_from_slice(payload);
        let gone = || Error::Msg(format!("rank {} could not send to rank {to}: the connection is closed", self.rank));
        peer.outbox.as_ref().ok_or_else(gone)?.send(frame).map_err(|_| gone())
    }

    /// Reads the next message from rank `from`, which must be `expected`,
    /// into `into` (whose length is the expected payload's). On any failure
    /// this rank gives up and tells every peer why.
    pub fn recv(&self, from: usize, expected: &Header, into: &mut [u8]) -> Result<()> {
        self.check_failed()?;
        self.receive(from, expected, into).map_err(|reason| {
            self.abort(&reason);
            Error::Msg(reason)
        })
    }

    fn receive(&self, from: usize, expected: &Header, into: &mut [u8]) -> std::result::Result<(), String> {
        let peer = self.peer(from).map_err(|e| e.to_string())?;
        let mut stream = &peer.stream;
        let mut raw = [0u8; HEADER_BYTES];
        self.read(&mut stream, &mut raw, from, expected)?;
        match Header::decode(&raw) {
            Some(Frame::Message(got)) if got == *expected => self.read(&mut stream, into, from, expected),
            Some(Frame::Message(got)) => Err(format!(
                "rank {} expected {expected} from rank {from}, which sent {got}: every rank must issue the same collectives in the same order, with tensors of the same shape and dtype",
                self.rank
            )),
            Some(Frame::Abort { len }) => {
                let mut reason = vec![0u8; len];
                self.read(&mut stream, &mut reason, from, expected)?;
                Err(String::from_utf8_lossy(&reason).into_owned())
            }
            None => Err(format!(
                "rank {} received a message from rank {from} that is no header of this backend (a bug, or ranks built from different versions)",
                self.rank
            )),
        }
    }

    /// Gives up: records `reason` and sends it to every peer still reachable,
    /// so that a rank waiting on this one learns the root cause, not just
    /// that this rank left.
    fn abort(&self, reason: &str) {
        if self.failure.borrow().is_some() {
            return;
        }
        *self.failure.borrow_mut() = Some(reason.to_string());
        let reason = &reason.as_bytes()[..reason.len().min(MAX_REASON)];
        for to in (0..self.peers.len()).filter(|&r| r != self.rank) {
            let _ = self.post(to, &Header::abort(reason.len()), reason);
        }
    }

    fn check_failed(&self) -> Result<()> {
        match self.failure.borrow().as_ref() {
            Some(reason) => Err(Error::Msg(reason.clone())),
            None => Ok(()),
        }
    }

    fn read(
        &self,
        stream: &mut &TcpStream,
        buf: &mut [u8],
        from: usize,
        waiting_for: &Header,
    ) -> std::result::Result<(), String> {
        let start = Instant::now();
        stream.read_exact(buf).map_err(|e| {
            let me = self.rank;
            match e.kind() {
                ErrorKind::WouldBlock | ErrorKind::TimedOut => format!(
                    "{waiting_for} timed out after {:.0?} on rank {me}: rank {from} sent nothing (stuck, or it skipped this call: every rank must issue the same collectives in the same order)",
                    start.elapsed()
                ),
                ErrorKind::UnexpectedEof | ErrorKind::ConnectionReset | ErrorKind::BrokenPipe => format!(
                    "rank {from} closed its connection while rank {me} waited in {waiting_for}: rank {from} exited or crashed (its own output says why)"
                ),
                _ => format!("rank {me} lost its connection to rank {from} in {waiting_for}: {e}"),
            }
        })
    }

    fn peer(&self, rank: usize) -> Result<&Peer> {
        self.peers
            .get(rank)
            .and_then(Option::as_ref)
            .ok_or_else(|| Error::Msg(format!("rank {} has no connection to rank {rank}", self.rank)))
    }

    /// The longest a read waits for a peer.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }
}

impl Drop for Mesh {
    /// Sends what is queued before the sockets close: a peer may still be
    /// reading this rank's last chunks.
    fn drop(&mut self) {
        for peer in self.peers.iter_mut().flatten() {
            peer.outbox = None;
        }
        for peer in self.peers.iter_mut().flatten() {
            if let Some(writer) = peer.writer.take() {
                let _ = writer.join();
            }
        }
    }
}

impl Peer {
    fn start(stream: TcpStream, rank: usize, timeout: Duration) -> Result<Self> {
        stream.set_nodelay(true)?;
        // A peer that stops reading must not keep this rank from exiting.
        stream.set_write_timeout(Some(timeout))?;
        let mut out = stream.try_clone()?;
        let (outbox, frames) = mpsc::channel::<Vec<u8>>();
        let write_error = Arc::new(Mutex::new(None));
        let slot = Arc::clone(&write_error);
        let writer = thread::Builder::new().name(format!("send-to-rank-{rank}")).spawn(move || {
            for frame in frames {
                if let Err(e) = out.write_all(&frame) {
                    *slot.lock().unwrap_or_else(PoisonError::into_inner) = Some(e.to_string());
                    return;
                }
            }
        })?;
        Ok(Self { stream, outbox: Some(outbox), writer: Some(writer), write_error })
    }
}

/// The address this machine uses to reach `master`: the interface the ranks
/// listen on, so a one-node job stays on loopback.
pub(super) fn local_address_towards(master: SocketAddr) -> io::Result<IpAddr> {
    let unspecified: SocketAddr = match master {
        SocketAddr::V4(_) => "0.0.0.0:0".parse().expect("valid"),
        SocketAddr::V6(_) => "[::]:0".parse().expect("valid"),
    };
    let probe = UdpSocket::bind(unspecified)?;
    probe.connect(master)?; // chooses a route; sends nothing
    Ok(probe.local_addr()?.ip())
}

/// Connects to rank `peer` at `addr` and says who is calling.
fn dial(addr: &[u8], rank: usize, peer: usize, token: &str, timeout: Duration) -> Result<TcpStream> {
    let text = String::from_utf8_lossy(addr);
    let target: SocketAddr = text
        .parse()
        .map_err(|_| Error::Msg(format!("rank {peer} published `{text}` as its address, which is not one")))?;
    let mut stream = TcpStream::connect_timeout(&target, timeout)
        .map_err(|e| io_context(format!("rank {rank} cannot connect to rank {peer} at {target}"), e))?;
    let mut hello = HELLO.to_vec();
    hello.extend_from_slice(&(token.len() as u32).to_le_bytes());
    hello.extend_from_slice(token.as_bytes());
    hello.extend_from_slice(&(rank as u32).to_le_bytes());
    stream.write_all(&hello)?;
    stream.set_read_timeout(Some(timeout))?;
    Ok(stream)
}

/// Accepts one connection from each rank above `rank`, ignoring strangers.
fn accept_higher(
    listener: &TcpListener,
    streams: &mut [Option<TcpStream>],
    rank: usize,
    token: &str,
    timeout: Duration,
) -> Result<()> {
    let deadline = Instant::now() + timeout;
    listener.set_nonblocking(true)?;
    while let Some(missing) = (rank + 1..streams.len()).find(|&r| streams[r].is_none()) {
        match listener.accept() {
            Ok((stream, _)) => {
                if let Some(peer) = greet(&stream, token, rank, streams.len()) {
                    if streams[peer].is_none() {
                        stream.set_read_timeout(Some(timeout))?;
                        streams[peer] = Some(stream);
                    }
                }
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                if Instant::now() >= deadline {
                    return Err(Error::Msg(format!(
                        "rank {rank} waited {timeout:.0?} for rank {missing} to connect: did every rank start, with the same MASTER_ADDR, MASTER_PORT and WORLD_SIZE?"
                    )));
                }
                thread::sleep(Duration::from_millis(5));
            }
            Err(e) => return Err(io_context(format!("rank {rank} cannot accept connections"), e)),
        }
    }
    Ok(())
}

/// The rank a new connection speaks for, if it is one of this job's ranks above `rank`.
fn greet(stream: &TcpStream, token: &str, rank: usize, world_size: usize) -> Option<usize> {
    stream.set_nonblocking(false).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    let mut reader = stream;
    let mut head = [0u8; 8];
    reader.read_exact(&mut head).ok()?;
    let len = u32::from_le_bytes(head[4..8].try_into().ok()?) as usize;
    if &head[..4] != HELLO || len != token.len() || len > MAX_TOKEN {
        return None;
    }
    let mut rest = vec![0u8; len + 4];
    reader.read_exact(&mut rest).ok()?;
    let peer = u32::from_le_bytes(rest[len..].try_into().ok()?) as usize;
    (&rest[..len] == token.as_bytes() && peer > rank && peer < world_size).then_some(peer)
}
