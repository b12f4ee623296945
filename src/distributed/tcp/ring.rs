//! The bandwidth-optimal ring algorithms, on a flat byte buffer.
//!
//! The N ranks form a ring: rank r sends to r + 1 and receives from r − 1
//! (mod N). The buffer is cut into N chunks (the first `len % N` one element
//! longer when N does not divide it).
//!
//! - **Reduce-scatter**: in each of N − 1 steps, every rank sends one chunk to
//!   its successor and adds the chunk its predecessor sent into its own copy.
//!   Chunk c starts at rank c + 1 and picks up one rank's contribution per
//!   step, so after N − 1 steps rank c holds chunk c summed over all ranks.
//! - **All-gather**: N − 1 more steps pass the finished chunks around the ring,
//!   each rank overwriting the chunk it receives.
//! - **All-reduce** is the two in turn: each rank sends 2(N − 1) chunks,
//!   2(N − 1)/N of the buffer, whatever N is. That is why NCCL and Gloo use it
//!   for large buffers.
//!
//! ```text
//!   reduce-scatter, N = 3, step 0       step 1                 result
//!   rank 0: sends c2 ──> rank 1         sends c1+c1' ──> ...   rank 0 holds Σ c0
//!   rank 1: sends c0 ──> rank 2         ...                    rank 1 holds Σ c1
//!   rank 2: sends c1 ──> rank 0         ...                    rank 2 holds Σ c2
//! ```

use std::ops::Range;

use candle_core::{DType, Result};

use super::mesh::Mesh;
use super::wire::Header;
use crate::distributed::chunk_ranges;
use crate::kernels::buffers::add_assign;

/// The piece a chunk travels in, one message each: a multiple of every
/// element size, large enough that per-message costs vanish. The receiver's
/// scratch buffer is one piece, small enough to stay in cache and below the
/// allocator's threshold for handing memory back to the OS.
const PIECE: usize = 1 << 20;

/// One collective's view of the ring: who this rank is in its group, and
/// the header its messages carry (the length is filled in per chunk).
pub(super) struct Ring<'a> {
    pub mesh: &'a Mesh,
    /// This rank's place in the group, and the group's size.
    pub rank: usize,
    pub world_size: usize,
    /// The group's ranks, as the mesh numbers them, in group order.
    pub members: &'a [usize],
    pub header: Header,
    /// Tensor bytes this rank has sent so far in this collective.
    pub sent: u64,
}

impl Ring<'_> {
    /// The successor's rank on the mesh.
    fn next(&self) -> usize {
        self.members[(self.rank + 1) % self.world_size]
    }

    /// The predecessor's rank on the mesh.
    fn prev(&self) -> usize {
        self.members[(self.rank + self.world_size - 1) % self.world_size]
    }

    /// Chunk `i` counted around the ring (any integer, taken mod N).
    fn chunk(&self, i: isize) -> usize {
        i.rem_euclid(self.world_size as isize) as usize
    }

    fn header(&self, len: usize) -> Header {
        Header { len: len as u64, ..self.header }
    }

    /// Sends `out` to the successor while receiving the predecessor's chunk
    /// into `into`, landing it as `landing` says. `out` goes from where it
    /// lies, as the writer thread reads it; `into` comes in pieces of
    /// [`PIECE`] bytes, so that receiving and adding overlap and the scratch
    /// buffer stays small.
    fn exchange(&mut self, out: &[u8], into: &mut [u8], landing: Landing) -> Result<()> {
        let (mesh, prev) = (self.mesh, self.prev());
        mesh.send_while(
            self.next(),
            out,
            PIECE,
            |len| self.header(len),
            || {
                let adds = !matches!(landing, Landing::Overwrite);
                let mut scratch = vec![0u8; if adds { PIECE.min(into.len()) } else { 0 }];
                for (index, piece) in into.chunks_mut(PIECE).enumerate() {
                    let header = self.header(piece.len());
                    let dtype = match landing {
                        Landing::Overwrite => {
                            mesh.recv(prev, &header, piece)?;
                            continue;
                        }
                        Landing::AddInPlace(dtype) => dtype,
                        Landing::AddTo(dtype, own) => {
                            piece.copy_from_slice(&own[index * PIECE..][..piece.len()]);
                            dtype
                        }
                    };
                    let received = &mut scratch[..piece.len()];
                    mesh.recv(prev, &header, received)?;
                    add_assign(dtype, piece, received)?;
                }
                Ok(())
            },
        )?;
        self.sent += out.len() as u64;
        Ok(())
    }

    /// Sums chunk `rank` of `buf` over the ranks, into `result` where one is
    /// given (its length that chunk's), else into the chunk itself. The other
    /// chunks pass partial sums on; with [`Contribution::Lent`] the ones no
    /// partial sum passes through, and with `result` the chunk itself, are
    /// never written, so the zeroed pages of a fresh buffer stay unmapped: a
    /// reduce-scatter at N = 2 holds no more than its result.
    /// `chunks` are byte ranges of `buf`.
    pub fn reduce_scatter(
        &mut self,
        buf: &mut [u8],
        own: Contribution,
        chunks: &[Range<usize>],
        dtype: DType,
        mut result: Option<&mut [u8]>,
    ) -> Result<()> {
        let r = self.rank as isize;
        let last = self.world_size as isize - 2;
        for step in 0..=last {
            let out = chunks[self.chunk(r - step - 1)].clone();
            let into = chunks[self.chunk(r - step - 2)].clone();
            let separate = result.as_deref_mut().filter(|_| step == last);
            // Only the first step sends a chunk that no step summed into.
            let unsummed = match own {
                Contribution::Lent(input) if step == 0 => Some(&input[out.clone()]),
                _ => None,
            };
            // Where this rank's own elements of the received chunk are: in
            // the chunk itself, or lent.
            let own_part = match own {
                Contribution::InBuffer => None,
                Contribution::Lent(input) => Some(&input[into.clone()]),
            };
            match separate {
                // The last step lands the sum of this rank's own elements and
                // the predecessor's partial sum in `result`.
                Some(result) => {
                    let buf = &*buf;
                    let sent = unsummed.unwrap_or(&buf[out]);
                    self.exchange(sent, result, Landing::AddTo(dtype, own_part.unwrap_or(&buf[into])))?;
                }
                None => {
                    let (sent, received) = disjoint(buf, out, into);
                    let landing = match own_part {
                        Some(own) => Landing::AddTo(dtype, own),
                        None => Landing::AddInPlace(dtype),
                    };
                    self.exchange(unsummed.unwrap_or(sent), received, landing)?;
                }
            }
        }
        Ok(())
    }

    /// Given that rank r holds the final chunk r, gives every rank every chunk.
    pub fn all_gather(&mut self, buf: &mut [u8], chunks: &[Range<usize>]) -> Result<()> {
        let r = self.rank as isize;
        for step in 0..self.world_size as isize - 1 {
            let out = chunks[self.chunk(r - step)].clone();
            let into = chunks[self.chunk(r - step - 1)].clone();
            let (sent, received) = disjoint(buf, out, into);
            self.exchange(sent, received, Landing::Overwrite)?;
        }
        Ok(())
    }

    /// Passes `buf` from `root` along the ring, in pieces so that every link
    /// is busy at once: each rank forwards a piece as soon as it has it.
    pub fn broadcast(&mut self, buf: &mut [u8], root: usize) -> Result<()> {
        let n = self.world_size;
        let position = (self.rank + n - root) % n; // the root is 0, its successor 1, ...
        for piece in buf.chunks_mut(PIECE) {
            if position > 0 {
                self.mesh.recv(self.prev(), &self.header(piece.len()), piece)?;
            }
            if position < n - 1 {
                self.mesh.send(self.next(), &self.header(piece.len()), piece)?;
                self.sent += piece.len() as u64;
            }
        }
        Ok(())
    }

    /// Returns once every rank has arrived: each tells every other one, then
    /// waits to hear from all of them.
    pub fn barrier(&mut self) -> Result<()> {
        let others = (0..self.world_size).filter(|&r| r != self.rank).map(|r| self.members[r]);
        for peer in others.clone() {
            self.mesh.send(peer, &self.header(0), &[])?;
        }
        for peer in others {
            self.mesh.recv(peer, &self.header(0), &mut [])?;
        }
        Ok(())
    }
}

/// Where a reduce-scatter finds this rank's own elements.
#[derive(Clone, Copy)]
pub(super) enum Contribution<'a> {
    /// Already in the buffer, which the received chunks are added into.
    InBuffer,
    /// In the caller's memory, read where each chunk is first sent or summed:
    /// the buffer needs no copy of them beforehand.
    Lent(&'a [u8]),
}

/// What a received chunk does to the chunk of the buffer it lands in.
#[derive(Clone, Copy)]
enum Landing<'a> {
    Overwrite,
    /// Adds itself to what the buffer holds.
    AddInPlace(DType),
    /// Writes its sum with `own`, this rank's elements of the chunk.
    AddTo(DType, &'a [u8]),
}

/// `buf[a]` to read and `buf[b]` to write, two ranges that do not overlap.
fn disjoint(buf: &mut [u8], a: Range<usize>, b: Range<usize>) -> (&[u8], &mut [u8]) {
    if a.start < b.start {
        let (low, high) = buf.split_at_mut(b.start);
        (&low[a], &mut high[..b.len()])
    } else {
        let (low, high) = buf.split_at_mut(a.start);
        (&high[..a.len()], &mut low[b])
    }
}

/// `len` elements of `elem` bytes cut into `parts` chunks, as byte ranges
/// (see [`chunk_ranges`]).
pub(super) fn chunks(len: usize, parts: usize, elem: usize) -> Vec<Range<usize>> {
    chunk_ranges(len, parts).into_iter().map(|r| r.start * elem..r.end * elem).collect()
}
