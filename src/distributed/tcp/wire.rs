//! What travels between two ranks: a fixed header that says what the message
//! is, then the tensor's bytes.
//!
//! The receiver knows what it expects (the collective's number, kind, dtype,
//! shape and the chunk's length), so it checks the header before it reads or
//! allocates the payload. A rank that issued a different collective, or the
//! same one with another shape, is reported by name instead of mixing its
//! bytes into the result.

use std::fmt;

use candle_core::{DType, Tensor};

use crate::distributed::collective::Call;
use crate::distributed::{Collective, ReduceOp};

/// The size of an encoded [`Header`].
pub(super) const HEADER_BYTES: usize = 40;

/// The kind byte of an abort: a rank that gave up tells the others why, in a
/// payload of at most [`MAX_REASON`] bytes, so the root cause reaches every rank.
const ABORT: u8 = u8::MAX;
pub(super) const MAX_REASON: usize = 4096;
/// The kind byte of a heartbeat: a peer's writer sends one whenever it has
/// been idle for a while, so silence means the peer is gone, not just slow.
/// Its payload, when not empty, says what long work the peer is busy with;
/// its header, which rank the peer waits for, if it waits for one.
const HEARTBEAT: u8 = u8::MAX - 1;

/// What a frame holds: a message of a collective or point-to-point call, or a peer's abort.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Frame {
    Message(Header),
    /// A peer gave up; the reason (`len` bytes of text) follows.
    Abort {
        len: usize,
    },
    /// A peer is alive; what it is busy with (`len` bytes of text, none when
    /// it is not) follows. `waits_on`: the rank it waits to hear from, if any.
    Heartbeat {
        len: usize,
        waits_on: Option<usize>,
    },
}

/// What a message belongs to and how long its payload is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Header {
    /// The collective's number (the same on every rank), or for a
    /// point-to-point message, its number among those from sender to receiver.
    pub seq: u64,
    /// The collective and its argument (reduce op or root), or `Send`.
    pub kind: Collective,
    pub arg: u32,
    /// The whole tensor's dtype and a digest of its shape.
    pub dtype: DType,
    pub shape: u64,
    /// Payload bytes that follow the header.
    pub len: u64,
    /// The group the message belongs to: 0 for the whole job, a digest of
    /// its split for a subgroup (see [`subgroup_tag`]).
    pub group: u64,
}

impl Header {
    /// The header of a message of `call` #`seq` of `group` about `t`, carrying `len` bytes.
    pub fn collective(group: u64, seq: u64, call: Call, t: Option<&Tensor>, len: usize) -> Self {
        let arg = match call {
            Call::AllReduce(op) | Call::ReduceScatter(op) => op_code(op),
            Call::Broadcast { root } => root as u32,
            Call::AllGather | Call::Barrier => 0,
        };
        Self::new(group, seq, call.kind(), arg, t, len)
    }

    /// The header of point-to-point message #`seq` of `group` carrying `t`.
    pub fn point_to_point(group: u64, seq: u64, t: &Tensor, len: usize) -> Self {
        Self::new(group, seq, Collective::Send, 0, Some(t), len)
    }

    fn new(group: u64, seq: u64, kind: Collective, arg: u32, t: Option<&Tensor>, len: usize) -> Self {
        Self {
            group,
            seq,
            kind,
            arg,
            dtype: t.map_or(DType::U8, Tensor::dtype),
            shape: t.map_or(0, |t| shape_digest(t.dims())),
            len: len as u64,
        }
    }

    pub fn encode(&self) -> [u8; HEADER_BYTES] {
        let mut out = [0u8; HEADER_BYTES];
        out[0..8].copy_from_slice(&self.seq.to_le_bytes());
        out[8] = self.kind as u8;
        out[9] = dtype_code(self.dtype);
        out[12..16].copy_from_slice(&self.arg.to_le_bytes());
        out[16..24].copy_from_slice(&self.shape.to_le_bytes());
        out[24..32].copy_from_slice(&self.len.to_le_bytes());
        out[32..40].copy_from_slice(&self.group.to_le_bytes());
        out
    }

    /// The header of an abort whose reason is `len` bytes long.
    pub fn abort(len: usize) -> [u8; HEADER_BYTES] {
        Self::text_frame(ABORT, len)
    }

    /// The header of a heartbeat whose busy text is `len` bytes long, from a
    /// rank that waits on rank `waits_on` (if it waits on one).
    pub fn heartbeat(len: usize, waits_on: Option<usize>) -> [u8; HEADER_BYTES] {
        let mut out = Self::text_frame(HEARTBEAT, len);
        let code = waits_on.map_or(0, |rank| rank as u32 + 1); // 0: waits on no one
        out[12..16].copy_from_slice(&code.to_le_bytes());
        out
    }

    fn text_frame(kind: u8, len: usize) -> [u8; HEADER_BYTES] {
        let mut out = [0u8; HEADER_BYTES];
        out[8] = kind;
        out[24..32].copy_from_slice(&(len.min(MAX_REASON) as u64).to_le_bytes());
        out
    }

    /// `None` when the bytes are no header this backend writes.
    pub fn decode(bytes: &[u8; HEADER_BYTES]) -> Option<Frame> {
        let u64_at = |i: usize| u64::from_le_bytes(bytes[i..i + 8].try_into().expect("8 bytes"));
        let text_len = (u64_at(24) as usize).min(MAX_REASON);
        match bytes[8] {
            ABORT => return Some(Frame::Abort { len: text_len }),
            HEARTBEAT => {
                let code = u32::from_le_bytes(bytes[12..16].try_into().expect("4 bytes"));
                let waits_on = code.checked_sub(1).map(|rank| rank as usize);
                return Some(Frame::Heartbeat { len: text_len, waits_on });
            }
            _ => {}
        }
        Some(Frame::Message(Self {
            seq: u64_at(0),
            kind: *Collective::ALL.get(bytes[8] as usize)?,
            dtype: *DTYPES.get(bytes[9] as usize)?,
            arg: u32::from_le_bytes(bytes[12..16].try_into().expect("4 bytes")),
            shape: u64_at(16),
            len: u64_at(24),
            group: u64_at(32),
        }))
    }
}

/// How a header reads in an error: `all_reduce #7 (f32, 4096 bytes)`.
impl fmt::Display for Header {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = self.kind;
        let what = match kind {
            Collective::AllReduce | Collective::ReduceScatter => format!("{kind}({})", op_name(self.arg)),
            Collective::Broadcast => format!("broadcast(root {})", self.arg),
            Collective::Send => "a point-to-point message".to_string(),
            _ => kind.to_string(),
        };
        let group = match self.group {
            0 => String::new(),
            tag => format!(" of subgroup {tag:016x}"),
        };
        write!(f, "{what} #{}{group} ({}, {} bytes)", self.seq, self.dtype.as_str(), self.len)
    }
}

const DTYPES: [DType; 6] = [DType::U8, DType::U32, DType::I64, DType::BF16, DType::F16, DType::F32];

fn dtype_code(dtype: DType) -> u8 {
    DTYPES.iter().position(|&d| d == dtype).map_or(u8::MAX, |i| i as u8)
}

fn op_code(op: ReduceOp) -> u32 {
    match op {
        ReduceOp::Sum => 0,
        ReduceOp::Avg => 1,
    }
}

fn op_name(code: u32) -> &'static str {
    match code {
        0 => "sum",
        _ => "avg",
    }
}

/// A digest of a shape: two ranks with different shapes of the same size
/// disagree on it, whatever machine computes it.
fn shape_digest(dims: &[usize]) -> u64 {
    digest(dims.iter().map(|&d| d as u64))
}

/// The tag of the subgroup that split number `number` of the group tagged
/// `parent` makes of the ranks that passed `color`: the same on each of them,
/// different from its siblings' and (but for a 2⁻⁶⁴ chance) any other group's.
pub(super) fn subgroup_tag(parent: u64, number: u64, color: usize) -> u64 {
    digest([parent, number, color as u64]).max(1) // 0 is the whole job
}

/// FNV-1a over 64-bit values.
fn digest(values: impl IntoIterator<Item = u64>) -> u64 {
    values.into_iter().fold(0xcbf2_9ce4_8422_2325, |h, v| (h ^ v).wrapping_mul(0x0100_0000_01b3))
}
