//! A connection from every rank to every other rank, found through the store.
//!
//! Each rank listens on an ephemeral port of its own address and publishes
//! `addr/<rank>` in the store. Rank `r` then connects to every lower rank and
//! accepts a connection from every higher one, so each pair has exactly one
//! socket. A connection opens with the connecting rank's number and the
//! [handshake](crate::distributed::auth) in which each side proves it knows
//! the job token; anything else on the port is closed. Newcomers are greeted
//! each on a thread of its own, so silent strangers cannot hold up the ranks.
//!
//! Reading is done by the rank's own thread. Writing goes through one thread
//! per peer, so that sending never waits for receiving: in a ring every rank
//! sends before it receives, and with blocking writes of large chunks all of
//! them would wait for each other forever. A message sent with [`Mesh::send`]
//! is copied for the writer and the call returns at once; a ring step's chunk
//! is not copied: the writer reads it where it lies while the rank's thread
//! receives, and the step waits for the writer before it returns (see
//! [`Mesh::send_while`]).
//!
//! Liveness: a writer with nothing to send sends a heartbeat, which says what
//! long work (a checkpoint write) its rank is busy with, if any. A rank
//! waiting for a peer tells three cases apart: silence for the whole timeout
//! (the peer's process is stopped or its machine gone), a peer that is alive
//! and not busy but sends nothing for this call (stuck, or it skipped the
//! call), and a peer that is busy, whose wait is not charged to the timeout.
//! Heartbeats also say which rank their sender waits on: on a mesh of
//! groups a rank often waits in a collective on a peer that waits on a
//! third, and the third is the one to name, so the first gives the peer one
//! more timeout to find out why and pass the cause on. Not in a
//! point-to-point receive, where such a chain is more likely a cycle of
//! ranks that each receive before they send.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::io::{self, ErrorKind, Read, Write};
use std::net::{IpAddr, Shutdown, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use candle_core::{Error, Result};

use super::wire::{Frame, Header, HEADER_BYTES, MAX_REASON};
use crate::distributed::auth::{self, Purpose};
use crate::distributed::store::StoreClient;
use crate::distributed::Collective;
use crate::error::io_context;

const HELLO: &[u8; 4] = b"WBRK";
/// Connections greeted at once. A newcomer beyond this closes the oldest
/// greeting still under way, so strangers that say nothing cannot fill every
/// place and keep a rank out: a flood costs no more threads, and a real rank
/// that is closed this way dials again.
const MAX_GREETING: usize = 64;
/// How long one connection may take to say who it is and prove the token. A
/// rank on the same network needs milliseconds; a silent stranger loses its
/// place after this.
const GREETING_PATIENCE: Duration = Duration::from_secs(2);
/// The pause before a rank dials again after its connection was closed
/// during the greeting.
const REDIAL_AFTER: Duration = Duration::from_millis(50);
/// How a learner gives a wait longer, under `cargo test` or the launcher.
const RAISE_TIMEOUT: &str = "raise the timeout (WORKBOOK_TIMEOUT_S, or the launcher's --timeout)";

/// This rank's connections to the others.
pub(super) struct Mesh {
    rank: usize,
    /// Indexed by rank; `None` at this rank's own index.
    peers: Vec<Option<Peer>>,
    timeout: Duration,
    /// Why this rank gave up, once it has: every later call fails with it.
    failure: RefCell<Option<String>>,
    /// The peer this rank found silent for a whole timeout, if any.
    silent_peer: Cell<Option<usize>>,
    /// What this rank's writers' heartbeats say of it.
    status: Arc<Mutex<Status>>,
    /// What each peer last said of itself.
    peer_status: RefCell<Vec<Status>>,
}

/// What a rank's heartbeats say of it.
#[derive(Debug, Clone, Default)]
struct Status {
    /// The long work (a checkpoint write) it is busy with.
    busy: Option<String>,
    /// The rank it waits to hear from. A rank that waits on a live peer
    /// which itself waits on a third gives that peer time to find out why,
    /// so that the rank at the root of a chain of waits is the one named.
    waiting_on: Option<usize>,
}

/// One wait for a message from a peer: when it gives up, when the peer
/// was last heard from at all, and whether the deadline was already moved
/// for a peer that waits on another rank.
struct Wait<'a> {
    from: usize,
    waiting_for: &'a Header,
    start: Instant,
    deadline: Instant,
    last_heard: Instant,
    extended: bool,
}

impl<'a> Wait<'a> {
    fn new(from: usize, waiting_for: &'a Header, timeout: Duration) -> Self {
        let now = Instant::now();
        Self { from, waiting_for, start: now, deadline: now + timeout, last_heard: now, extended: false }
    }
}

struct Peer {
    stream: TcpStream,
    /// Frames for the writer thread; `None` once the mesh is closing.
    outbox: Option<Sender<Outgoing>>,
    writer: Option<JoinHandle<()>>,
    /// The first write error, reported by this rank's next call (or by the
    /// ring step waiting for the writer).
    write_error: Arc<Mutex<Option<String>>>,
}

/// What a peer's writer thread sends next.
enum Outgoing {
    /// A whole frame, header and payload, that the writer owns.
    Frame(Vec<u8>),
    /// Frames whose payloads the writer reads from memory it borrows.
    Borrowed(BorrowedFrames),
}

/// `headers[i]` followed by piece `i` of the `len` bytes at `payload`, cut in
/// pieces of `piece` bytes. The writer answers on `done` once it no longer
/// reads the bytes (or drops `done` unanswered).
struct BorrowedFrames {
    headers: Vec<[u8; HEADER_BYTES]>,
    payload: *const u8,
    len: usize,
    piece: usize,
    done: Sender<std::result::Result<(), String>>,
}

// SAFETY: the writer only reads the payload, and `Mesh::send_while`, the only
// place that makes these frames, keeps the payload borrowed (so alive and
// unchanged) until the writer has answered on `done` or dropped it.
unsafe impl Send for BorrowedFrames {}

impl BorrowedFrames {
    fn write_to(&self, out: &mut TcpStream) -> io::Result<()> {
        // SAFETY: see `BorrowedFrames`'s `Send`.
        let payload = unsafe { std::slice::from_raw_parts(self.payload, self.len) };
        for (header, piece) in self.headers.iter().zip(payload.chunks(self.piece)) {
            out.write_all(header)?;
            out.write_all(piece)?;
        }
        Ok(())
    }
}

/// While alive, this rank's heartbeats say it waits on a peer.
struct WaitingOn<'a>(&'a Mutex<Status>);

impl<'a> WaitingOn<'a> {
    fn tell(status: &'a Mutex<Status>, peer: usize) -> Self {
        status.lock().unwrap_or_else(PoisonError::into_inner).waiting_on = Some(peer);
        Self(status)
    }
}

impl Drop for WaitingOn<'_> {
    fn drop(&mut self) {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).waiting_on = None;
    }
}

/// The writer's answer about borrowed frames. Dropping it waits for the
/// answer, so that every way out of [`Mesh::send_while`], a panic included,
/// outlives the writer's reads.
struct WriterAnswer(Option<Receiver<std::result::Result<(), String>>>);

impl WriterAnswer {
    /// Waits for the writer; `Err` when it could not send the frames.
    fn wait(mut self) -> std::result::Result<(), String> {
        let answer = self.0.take().map(|done| done.recv());
        answer.map_or(Ok(()), |answer| answer.unwrap_or_else(|_| Err(CLOSED.into())))
    }

    /// The writer's answer, if it comes within `patience`.
    fn answered_within(&mut self, patience: Duration) -> Option<std::result::Result<(), String>> {
        let answer = match self.0.as_ref()?.recv_timeout(patience) {
            Err(RecvTimeoutError::Timeout) => return None,
            Ok(answer) => answer,
            Err(RecvTimeoutError::Disconnected) => Err(CLOSED.into()),
        };
        self.0 = None;
        Some(answer)
    }
}

/// What a writer that stopped without answering leaves to say.
const CLOSED: &str = "the connection is closed";

impl Drop for WriterAnswer {
    fn drop(&mut self) {
        if let Some(done) = self.0.take() {
            let _ = done.recv();
        }
    }
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
        let status = Arc::new(Mutex::new(Status::default()));
        let peers = streams
            .into_iter()
            .enumerate()
            .map(|(r, s)| s.map(|s| Peer::start(s, r, timeout, Arc::clone(&status))).transpose())
            .collect::<Result<_>>()?;
        let peer_status = RefCell::new(vec![Status::default(); world_size]);
        let failure = RefCell::new(None);
        Ok(Self { rank, peers, timeout, failure, silent_peer: Cell::new(None), status, peer_status })
    }

    /// Says what long work this rank is busy with (`None`: none), at once to
    /// every peer and in every heartbeat after.
    pub fn set_busy(&self, what: Option<&str>) {
        self.status.lock().unwrap_or_else(PoisonError::into_inner).busy = what.map(str::to_string);
        let frame = heartbeat(&self.status);
        for to in (0..self.peers.len()).filter(|&r| r != self.rank) {
            let _ = self.queue(to, Outgoing::Frame(frame.clone()));
        }
    }

    /// Queues `header` and `payload` for rank `to`; returns before they arrive.
    pub fn send(&self, to: usize, header: &Header, payload: &[u8]) -> Result<()> {
        self.check_failed()?;
        self.post(to, &header.encode(), payload)
    }

    fn post(&self, to: usize, header: &[u8; HEADER_BYTES], payload: &[u8]) -> Result<()> {
        let mut frame = Vec::with_capacity(HEADER_BYTES + payload.len());
        frame.extend_from_slice(header);
        frame.extend_from_slice(payload);
        self.queue(to, Outgoing::Frame(frame))
    }

    /// Sends `payload` to rank `to` in frames of at most `piece` bytes, each
    /// under the header `header` gives for its length, while `meanwhile` runs
    /// on this thread (a ring step's receive); returns when both are done.
    /// Nothing is copied: the writer thread reads `payload` where it lies,
    /// and this call keeps it borrowed until the writer is done with it.
    pub fn send_while<T>(
        &self,
        to: usize,
        payload: &[u8],
        piece: usize,
        header: impl Fn(usize) -> Header,
        meanwhile: impl FnOnce() -> Result<T>,
    ) -> Result<T> {
        self.check_failed()?;
        let headers = payload.chunks(piece).map(|p| header(p.len()).encode()).collect();
        let (done, answer) = mpsc::channel();
        let frames = BorrowedFrames { headers, payload: payload.as_ptr(), len: payload.len(), piece, done };
        self.queue(to, Outgoing::Borrowed(frames))?;
        let answer = WriterAnswer(Some(answer));
        let result = meanwhile();
        let written = match &result {
            Ok(_) => self.wait_for_writer(to, answer, &header(payload.len())),
            Err(_) => {
                if self.silent_peer.get() == Some(to) {
                    // The writer may be blocked on this peer, which has been
                    // silent for a whole timeout: end its write now rather than
                    // after its own write timeout. A peer that is only slow is
                    // left to read on, so that this rank's abort reaches it
                    // after the chunk.
                    let _ = self.peer(to)?.stream.shutdown(Shutdown::Both);
                }
                answer.wait().map_err(|e| self.write_failure(to, e))
            }
        };
        let value = result?;
        written.map_err(|reason| {
            self.abort(&reason);
            Error::Msg(reason)
        })?;
        Ok(value)
    }

    /// Waits for the writer to finish sending to rank `to`. It may be blocked
    /// on `to` for as long as the write timeout; an abort that another peer
    /// sends meanwhile ends the wait with that abort's reason (the root
    /// cause, which would otherwise wait unread), after the connection to
    /// `to` is shut to free the writer.
    fn wait_for_writer(
        &self,
        to: usize,
        mut answer: WriterAnswer,
        waiting_for: &Header,
    ) -> std::result::Result<(), String> {
        loop {
            if let Some(written) = answer.answered_within(heartbeat_interval(self.timeout)) {
                return written.map_err(|e| self.write_failure(to, e));
            }
            if let Some(reason) = self.abort_from_a_peer(waiting_for) {
                let _ = self.peer(to).map(|peer| peer.stream.shutdown(Shutdown::Both));
                drop(answer); // waits for the writer, now that its write fails
                return Err(reason);
            }
        }
    }

    /// An abort that some peer has sent, if one is next on its connection;
    /// heartbeats before it are taken as [`Mesh::recv`] takes them. Any
    /// other message stays where it is, for the call it belongs to. Looks at
    /// each peer for at most the socket's read timeout (a heartbeat interval).
    fn abort_from_a_peer(&self, waiting_for: &Header) -> Option<String> {
        for from in (0..self.peers.len()).filter(|&r| r != self.rank) {
            let Ok(peer) = self.peer(from) else { continue };
            loop {
                let mut raw = [0u8; HEADER_BYTES];
                if !matches!(peer.stream.peek(&mut raw), Ok(HEADER_BYTES)) {
                    break;
                }
                let mut wait = Wait::new(from, waiting_for, self.timeout);
                let (len, waits_on, abort) = match Header::decode(&raw) {
                    Some(Frame::Heartbeat { len, waits_on }) => (len, waits_on, false),
                    Some(Frame::Abort { len }) => (len, None, true),
                    _ => break,
                };
                self.fill(&peer.stream, &mut raw, &mut wait).ok()?; // the header peeked at
                let text = self.read_text(&peer.stream, len, &mut wait).ok()?;
                if abort {
                    return Some(text);
                }
                self.peer_status.borrow_mut()[from] = Status { busy: (len > 0).then_some(text), waiting_on: waits_on };
            }
        }
        None
    }

    /// What to say when the writer could not send to rank `to`: the writer's
    /// own error where it recorded one, and in words where the peer read
    /// nothing for the whole write timeout.
    fn write_failure(&self, to: usize, answer: String) -> String {
        let recorded =
            self.peer(to).ok().and_then(|p| p.write_error.lock().unwrap_or_else(PoisonError::into_inner).clone());
        let error = recorded.unwrap_or(answer);
        let me = self.rank;
        if error.contains(STALLED_WRITE) {
            format!(
                "rank {to} read nothing that rank {me} sent for {:.0?}: its process is stopped or hung, its machine is down, or the network between them is cut",
                self.timeout
            )
        } else {
            format!("rank {me} could not send to rank {to}: {error}")
        }
    }

    /// Hands `outgoing` to the writer thread of rank `to`.
    fn queue(&self, to: usize, outgoing: Outgoing) -> Result<()> {
        let peer = self.peer(to)?;
        let recorded = peer.write_error.lock().unwrap_or_else(PoisonError::into_inner).clone();
        if let Some(error) = recorded {
            return Err(Error::Msg(self.write_failure(to, error)));
        }
        let gone = || Error::Msg(self.write_failure(to, CLOSED.into()));
        peer.outbox.as_ref().ok_or_else(gone)?.send(outgoing).map_err(|_| gone())
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

    /// Why a message from `from` is not the `expected` one: the rule the two
    /// ranks broke, which the headers show.
    fn mismatch(&self, from: usize, expected: &Header, got: &Header) -> String {
        let me = self.rank;
        let point_to_point = expected.kind == Collective::Send && got.kind == Collective::Send;
        let rule = if point_to_point && got.seq != expected.seq {
            format!(
                "each recv from rank {from} takes that rank's next send to rank {me}, in order, so the two ranks \
                 disagree on how many messages went from {from} to {me} before this one (check each send's \
                 destination and each recv's source)"
            )
        } else if point_to_point {
            "a send and its recv must carry tensors of the same shape and dtype".to_string()
        } else {
            "every rank must issue the same collectives in the same order, with tensors of the same shape and dtype"
                .to_string()
        };
        format!("rank {me} expected {expected} from rank {from}, which sent {got}: {rule}")
    }

    fn receive(&self, from: usize, expected: &Header, into: &mut [u8]) -> std::result::Result<(), String> {
        let peer = self.peer(from).map_err(|e| e.to_string())?;
        let mut wait = Wait::new(from, expected, self.timeout);
        let _told = WaitingOn::tell(&self.status, from);
        loop {
            let mut raw = [0u8; HEADER_BYTES];
            self.fill(&peer.stream, &mut raw, &mut wait)?;
            match Header::decode(&raw) {
                Some(Frame::Heartbeat { len, waits_on }) => {
                    let busy = self.read_text(&peer.stream, len, &mut wait)?;
                    self.peer_status.borrow_mut()[from] = Status { busy: (len > 0).then_some(busy), waiting_on: waits_on };
                    // Heartbeats keep coming while a live peer sends nothing else.
                    self.still_waiting(&mut wait)?;
                }
                Some(Frame::Message(got)) if got == *expected => return self.fill(&peer.stream, into, &mut wait),
                Some(Frame::Message(got)) => return Err(self.mismatch(from, expected, &got)),
                Some(Frame::Abort { len }) => return Err(self.read_text(&peer.stream, len, &mut wait)?),
                None => return Err(format!(
                    "rank {} received a message from rank {from} that is no header of this backend (a bug, or ranks built from different versions)",
                    self.rank
                )),
            }
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

    /// Reads exactly `buf.len()` bytes from the peer of `wait`, giving up as
    /// that wait's rules say. Bytes arrive as they come: the socket's read
    /// timeout is only the heartbeat interval, so the checks run often.
    fn fill(&self, mut stream: &TcpStream, buf: &mut [u8], wait: &mut Wait) -> std::result::Result<(), String> {
        let (me, from, waiting_for) = (self.rank, wait.from, wait.waiting_for);
        let mut filled = 0;
        while filled < buf.len() {
            match stream.read(&mut buf[filled..]) {
                Ok(0) => return Err(format!(
                    "rank {from} closed its connection while rank {me} waited in {waiting_for}: rank {from} exited or crashed (its own output says why)"
                )),
                Ok(n) => {
                    filled += n;
                    wait.last_heard = Instant::now();
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => self.still_waiting(wait)?,
                Err(e) => return Err(format!("rank {me} lost its connection to rank {from} in {waiting_for}: {e}")),
            }
        }
        Ok(())
    }

    /// The `len` bytes of text that follow a heartbeat's or an abort's header.
    fn read_text(&self, stream: &TcpStream, len: usize, wait: &mut Wait) -> std::result::Result<String, String> {
        let mut text = vec![0u8; len];
        self.fill(stream, &mut text, wait)?;
        Ok(String::from_utf8_lossy(&text).into_owned())
    }

    /// Whether to go on waiting: not after silence for the whole timeout,
    /// nor past the deadline unless the peer says it is busy, which moves it.
    fn still_waiting(&self, wait: &mut Wait) -> std::result::Result<(), String> {
        let (me, from, waiting_for) = (self.rank, wait.from, wait.waiting_for);
        let now = Instant::now();
        let silent = now - wait.last_heard;
        if silent >= self.timeout {
            self.silent_peer.set(Some(from));
            return Err(format!(
                "rank {from} stopped answering while rank {me} waited in {waiting_for}: nothing from it, not even a heartbeat, for {silent:.0?}: its process is stopped or hung, its machine is down, or the network between them is cut"
            ));
        }
        if now < wait.deadline {
            return Ok(());
        }
        let peer = self.peer_status.borrow()[from].clone();
        if peer.busy.is_some() {
            wait.deadline = now + self.timeout;
            return Ok(());
        }
        // In a collective, a peer that waits on a third rank finds out within
        // a timeout whether that rank is gone, and then tells this one why.
        // Not for a point-to-point receive: there the likelier chain is a
        // cycle of ranks that each receive before they send, which waiting
        // longer only prolongs.
        let third = peer.waiting_on.filter(|&r| r != me && waiting_for.kind != Collective::Send);
        if third.is_some() && !wait.extended {
            wait.extended = true;
            wait.deadline = now + self.timeout;
            return Ok(());
        }
        if let Some(third) = third {
            // A fact, not a verdict: rank `third` may be stuck, or may wait
            // on another rank in turn, this one included.
            return Err(format!(
                "{waiting_for} timed out after {:.0?} on rank {me}: rank {from} is alive but has itself waited on rank {third} all this time; look at rank {third}: it is stuck in its own work, or the ranks wait for each other in a cycle (collectives issued in different orders on groups they share); if the work legitimately takes longer, {RAISE_TIMEOUT}",
                now - wait.start
            ));
        }
        // A receive can also wait on a peer that waits in a receive of its
        // own: its heartbeats say from whom, and that is all that is known.
        if let Some(other) = peer.waiting_on.filter(|_| waiting_for.kind == Collective::Send) {
            let whom = match other == me {
                true => "this rank: each waits for the other".to_string(),
                false => format!("rank {other}"),
            };
            return Err(format!(
                "{waiting_for} timed out after {:.0?} on rank {me}: rank {from} is alive (its heartbeats arrive) but sent nothing for this call: it waits in a receive of its own, from {whom}",
                now - wait.start
            ));
        }
        Err(format!(
            "{waiting_for} timed out after {:.0?} on rank {me}: rank {from} is alive (its heartbeats arrive) but sent nothing for this call: it is stuck in its own work or it skipped this call (every rank must issue the same collectives in the same order); if its work legitimately takes longer, {RAISE_TIMEOUT}",
            now - wait.start
        ))
    }

    fn peer(&self, rank: usize) -> Result<&Peer> {
        self.peers
            .get(rank)
            .and_then(Option::as_ref)
            .ok_or_else(|| Error::Msg(format!("rank {} has no connection to rank {rank}", self.rank)))
    }
}

impl Drop for Mesh {
    /// Sends what is queued before the sockets close (but to a peer whose
    /// connection was shut for its silence): a peer may still be reading this
    /// rank's last chunks.
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
    fn start(stream: TcpStream, rank: usize, timeout: Duration, status: Arc<Mutex<Status>>) -> Result<Self> {
        stream.set_nodelay(true)?;
        // A peer that stops reading must not keep this rank from exiting.
        stream.set_write_timeout(Some(timeout))?;
        let interval = heartbeat_interval(timeout);
        stream.set_read_timeout(Some(interval))?;
        let mut out = stream.try_clone()?;
        let (outbox, queued) = mpsc::channel::<Outgoing>();
        let write_error = Arc::new(Mutex::new(None));
        let slot = Arc::clone(&write_error);
        let writer = thread::Builder::new().name(format!("send-to-rank-{rank}")).spawn(move || loop {
            let written = match queued.recv_timeout(interval) {
                Ok(Outgoing::Frame(frame)) => out.write_all(&frame),
                Ok(Outgoing::Borrowed(frames)) => {
                    let written = frames.write_to(&mut out);
                    let _ = frames.done.send(written.as_ref().map(drop).map_err(describe_write_error));
                    written
                }
                Err(RecvTimeoutError::Timeout) => out.write_all(&heartbeat(&status)),
                Err(RecvTimeoutError::Disconnected) => return,
            };
            if let Err(e) = written {
                *slot.lock().unwrap_or_else(PoisonError::into_inner) = Some(describe_write_error(&e));
                return;
            }
        })?;
        Ok(Self { stream, outbox: Some(outbox), writer: Some(writer), write_error })
    }
}

/// Marks a write that the peer's reading never made room for: the socket's
/// write timeout (the job's `--timeout`) ran out with nothing taken.
const STALLED_WRITE: &str = "nothing was read for the whole timeout";

fn describe_write_error(e: &io::Error) -> String {
    match e.kind() {
        ErrorKind::WouldBlock | ErrorKind::TimedOut => STALLED_WRITE.to_string(),
        _ => e.to_string(),
    }
}

/// How often an idle writer sends a heartbeat: often enough that a live peer
/// is never silent for a whole `timeout`, even on a busy machine.
fn heartbeat_interval(timeout: Duration) -> Duration {
    (timeout / 8).clamp(Duration::from_millis(20), Duration::from_secs(1))
}

/// A heartbeat frame carrying what this rank is busy with and whom it waits on.
fn heartbeat(status: &Mutex<Status>) -> Vec<u8> {
    let status = status.lock().unwrap_or_else(PoisonError::into_inner);
    let text = status.busy.as_deref().unwrap_or_default().as_bytes();
    let text = &text[..text.len().min(MAX_REASON)];
    let mut frame = Header::heartbeat(text.len(), status.waiting_on).to_vec();
    frame.extend_from_slice(text);
    frame
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

/// Connects to rank `peer` at `addr`, says who is calling and proves it is of
/// the job. A connection closed during the greeting (the peer had too many
/// strangers to greet at once) is dialled again until `timeout` has passed.
fn dial(addr: &[u8], rank: usize, peer: usize, token: &str, timeout: Duration) -> Result<TcpStream> {
    let text = String::from_utf8_lossy(addr);
    let target: SocketAddr = text
        .parse()
        .map_err(|_| Error::Msg(format!("rank {peer} published `{text}` as its address, which is not one")))?;
    let who = format!("rank {peer} at {target}");
    let deadline = Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1));
        let mut stream = TcpStream::connect_timeout(&target, left)
            .map_err(|e| io_context(format!("rank {rank} cannot connect to {who}"), e))?;
        stream.set_read_timeout(Some(left))?;
        let hello = [&HELLO[..], &(rank as u32).to_le_bytes()].concat();
        match stream.write_all(&hello).and_then(|()| auth::dial(&mut stream, token, Purpose::Mesh, &who)) {
            Ok(()) => return Ok(stream),
            Err(e) if closed_by_peer(&e) && Instant::now() + REDIAL_AFTER < deadline => thread::sleep(REDIAL_AFTER),
            Err(e) => return Err(io_context(format!("rank {rank} cannot join {who}"), e)),
        }
    }
}

/// Whether `e` says the other side closed the connection: what a greeting
/// cut short looks like from the dialling side.
fn closed_by_peer(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        ErrorKind::UnexpectedEof | ErrorKind::ConnectionReset | ErrorKind::BrokenPipe | ErrorKind::ConnectionAborted
    )
}

/// Accepts one connection from each rank above `rank`, ignoring strangers.
/// Each newcomer is greeted on its own thread, for at most
/// [`GREETING_PATIENCE`] and never past the job's formation deadline.
fn accept_higher(
    listener: &TcpListener,
    streams: &mut [Option<TcpStream>],
    rank: usize,
    token: &str,
    timeout: Duration,
) -> Result<()> {
    let deadline = Instant::now() + timeout;
    listener.set_nonblocking(true)?;
    let (greeted, arrivals) = mpsc::channel::<(u64, Option<(usize, TcpStream)>)>();
    // The greetings under way, oldest first, each with its number.
    let mut greeting: VecDeque<(u64, Claim)> = VecDeque::new();
    let mut next_number = 0u64;
    while let Some(missing) = (rank + 1..streams.len()).find(|&r| streams[r].is_none()) {
        while let Ok((number, arrival)) = arrivals.try_recv() {
            greeting.retain(|(n, _)| *n != number);
            if let Some((peer, stream)) = arrival {
                streams[peer].get_or_insert(stream);
            }
        }
        match listener.accept() {
            Ok((stream, _)) => {
                let Ok(handle) = stream.try_clone() else { continue };
                if greeting.len() >= MAX_GREETING {
                    if let Some((_, oldest)) = greeting.pop_front() {
                        close_unless_taken(&oldest);
                    }
                }
                next_number += 1;
                let claim: Claim = Arc::new(Mutex::new(Some(handle)));
                greeting.push_back((next_number, Arc::clone(&claim)));
                let (greeted, token, world_size, number) =
                    (greeted.clone(), token.to_string(), streams.len(), next_number);
                let patience = deadline.min(Instant::now() + GREETING_PATIENCE);
                thread::spawn(move || {
                    let arrival = greet(stream, &token, rank, world_size, patience).filter(|_| take(&claim));
                    let _ = greeted.send((number, arrival));
                });
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

/// A handle on a connection being greeted, which either the greeting (on
/// success) or the listener (closing the oldest greeting) takes first: a
/// connection that proved the token is never closed by the listener.
type Claim = Arc<Mutex<Option<TcpStream>>>;

/// Takes the claim for the greeting; `false` when the listener closed it first.
fn take(claim: &Claim) -> bool {
    claim.lock().unwrap_or_else(PoisonError::into_inner).take().is_some()
}

/// Closes a greeting's connection, unless the greeting already took it.
fn close_unless_taken(claim: &Claim) {
    if let Some(handle) = claim.lock().unwrap_or_else(PoisonError::into_inner).take() {
        let _ = handle.shutdown(Shutdown::Both);
    }
}

/// The rank a new connection speaks for, with the connection, if it is one
/// of this job's ranks above `rank` and proves it knows `token` by `deadline`.
fn greet(
    mut stream: TcpStream,
    token: &str,
    rank: usize,
    world_size: usize,
    deadline: Instant,
) -> Option<(usize, TcpStream)> {
    let left = deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1));
    stream.set_nonblocking(false).ok()?;
    stream.set_read_timeout(Some(left)).ok()?;
    stream.set_write_timeout(Some(left)).ok()?;
    let mut hello = [0u8; 8];
    stream.read_exact(&mut hello).ok()?;
    let peer = u32::from_le_bytes(hello[4..].try_into().ok()?) as usize;
    if &hello[..4] != HELLO || peer <= rank || peer >= world_size {
        return None;
    }
    auth::accept(&mut stream, token, Purpose::Mesh).ok()?.then_some(())?;
    stream.set_write_timeout(None).ok()?;
    Some((peer, stream))
}
