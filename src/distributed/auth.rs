//! Proving the job token without sending it. Every connection between the
//! processes of a job (a rank or launcher to the store, a rank to another)
//! opens with a challenge and response, so that a process that merely holds
//! the port learns nothing it could use, and each side knows the other is of
//! the job:
//!
//! ```text
//!   accepting side                          dialling side
//!     nonce_a (32 random bytes)   ──────►
//!                                 ◄──────   nonce_d, HMAC(token, purpose·"dial"·nonce_a·nonce_d)
//!     ACCEPTED, HMAC(token, purpose·"accept"·nonce_d·nonce_a)  ──────►   (or REFUSED)
//! ```
//!
//! HMAC-SHA256 keyed with the token; fresh nonces on both sides make every
//! answer good for one connection only. The traffic after the handshake is
//! neither encrypted nor signed: someone who can rewrite packets between the
//! machines can still read and change it. Keep jobs on networks you trust.

use std::io::{self, ErrorKind, Read, Write};

use hmac::{Hmac, Mac};
use sha2::Sha256;

const NONCE_BYTES: usize = 32;
const MAC_BYTES: usize = 32;
const ACCEPTED: u8 = 0;
const REFUSED: u8 = 1;

/// What a connection is for, mixed into every proof so that one made for the
/// store is never taken by a rank's mesh, and the reverse.
#[derive(Debug, Clone, Copy)]
pub enum Purpose {
    Store,
    Mesh,
}

impl Purpose {
    fn label(self) -> &'static [u8] {
        match self {
            Purpose::Store => b"workbook-store",
            Purpose::Mesh => b"workbook-mesh",
        }
    }
}

/// The accepting side's half. Returns whether the peer proved it knows
/// `token`; a peer that did not was told so and should be closed.
pub fn accept(stream: &mut (impl Read + Write), token: &str, purpose: Purpose) -> io::Result<bool> {
    let nonce_a: [u8; NONCE_BYTES] = rand::random();
    stream.write_all(&nonce_a)?;
    let mut answer = [0u8; NONCE_BYTES + MAC_BYTES];
    stream.read_exact(&mut answer)?;
    let (nonce_d, proof) = answer.split_at(NONCE_BYTES);
    if proof_of(token, purpose, b"dial", &nonce_a, nonce_d).verify_slice(proof).is_err() {
        stream.write_all(&[REFUSED])?;
        return Ok(false);
    }
    let ours = proof_of(token, purpose, b"accept", nonce_d, &nonce_a).finalize().into_bytes();
    stream.write_all(&[&[ACCEPTED][..], &ours].concat())?;
    Ok(true)
}

/// The dialling side's half. Fails with [`ErrorKind::PermissionDenied`] when
/// the other side refuses this token or cannot prove it knows the token
/// itself (then it is not of this job); `peer` names it in the message.
pub fn dial(stream: &mut (impl Read + Write), token: &str, purpose: Purpose, peer: &str) -> io::Result<()> {
    let mut nonce_a = [0u8; NONCE_BYTES];
    stream.read_exact(&mut nonce_a)?;
    let nonce_d: [u8; NONCE_BYTES] = rand::random();
    let ours = proof_of(token, purpose, b"dial", &nonce_a, &nonce_d).finalize().into_bytes();
    stream.write_all(&[&nonce_d[..], &ours].concat())?;
    let mut verdict = [0u8; 1];
    stream.read_exact(&mut verdict)?;
    if verdict[0] != ACCEPTED {
        let message = format!("{peer} refused this process's job token: WORKBOOK_JOB_TOKEN (or --token-file) differs from the job's; give every node the same");
        return Err(io::Error::new(ErrorKind::PermissionDenied, message));
    }
    let mut theirs = [0u8; MAC_BYTES];
    stream.read_exact(&mut theirs)?;
    if proof_of(token, purpose, b"accept", &nonce_d, &nonce_a).verify_slice(&theirs).is_err() {
        let message =
            format!("{peer} does not know the job token: another program holds the port, or it belongs to another job");
        return Err(io::Error::new(ErrorKind::PermissionDenied, message));
    }
    Ok(())
}

/// The HMAC of `purpose`, `role` and the two nonces, keyed with `token`.
fn proof_of(token: &str, purpose: Purpose, role: &[u8], first: &[u8], second: &[u8]) -> Hmac<Sha256> {
    let mut mac = Hmac::<Sha256>::new_from_slice(token.as_bytes()).expect("HMAC takes a key of any length");
    for part in [purpose.label(), role, first, second] {
        mac.update(part);
    }
    mac
}
