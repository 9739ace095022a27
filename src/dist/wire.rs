//! What travels on the TCP connections between processes ([`super::rendezvous`], [`super::tcp`]):
//! the hello a rank sends when it connects, then length-prefixed frames both ways; and the socket
//! settings and readiness wait both use.
//!
//! ```text
//!  hello (rank -> rank 0, once):  magic "swerveRZ" | version u32 | rank u32 | world size u32 |
//!                                 payload length u32 | payload
//!  frame (either way):            tag u8 | op u32 | seq u64 | body length u64 | body
//! ```
//!
//! Integers are little-endian. `seq` numbers the collectives (0 is the rendezvous' answer), `op`
//! says which collective a frame belongs to, so two ranks that call different collectives, or
//! a different number of them, are told so instead of exchanging the wrong bytes.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::time::Duration;

/// The first bytes every swerve rank sends to rank 0.
pub(super) const MAGIC: [u8; 8] = *b"swerveRZ";
/// Bumped when the hello or the frames change: every process must run the same build.
pub(super) const VERSION: u32 = 1;
/// The largest hello payload (an NCCL unique id is 128 bytes; a fingerprint, a few dozen).
pub(super) const MAX_HELLO_PAYLOAD: usize = 1 << 20;
/// The largest frame body believed (a corrupt length must not allocate the machine away).
const MAX_BODY: u64 = 1 << 44;

/// A frame's kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Tag {
    /// Rank 0 -> rank: every rank's hello payload; the rendezvous is complete.
    Table = 1,
    /// Rank 0 -> rank: the group failed; the body is the reason (UTF-8), the same on every rank.
    Error = 2,
    /// Rank -> rank 0: this rank's contribution to a collective.
    Part = 3,
    /// Rank 0 -> rank: a collective's result.
    Result = 4,
}

pub(super) struct Frame {
    pub tag: u8,
    pub op: u32,
    pub seq: u64,
    pub body: Vec<u8>,
}

/// What a connecting rank says first.
pub(super) struct Hello {
    /// The first bytes received (up to 8; fewer where they already differ from [`MAGIC`]).
    pub magic: Vec<u8>,
    pub version: u32,
    pub rank: u32,
    pub world_size: u32,
    pub payload: Vec<u8>,
}

pub(super) fn write_hello(
    stream: &mut TcpStream,
    rank: usize,
    world_size: usize,
    payload: &[u8],
) -> io::Result<()> {
    let mut bytes = Vec::with_capacity(24 + payload.len());
    bytes.extend_from_slice(&MAGIC);
    for v in [
        VERSION,
        rank as u32,
        world_size as u32,
        payload.len() as u32,
    ] {
        bytes.extend_from_slice(&v.to_le_bytes());
    }
    bytes.extend_from_slice(payload);
    stream.write_all(&bytes)?;
    stream.flush()
}

/// Reads a hello. `Ok(None)`: the peer closed without sending a byte (a port probe). A wrong
/// magic returns at once (with what came instead) so that a foreign program is named, not
/// waited on.
pub(super) fn read_hello(stream: &mut TcpStream) -> io::Result<Option<Hello>> {
    let mut magic = [0u8; 8];
    let mut got = 0;
    while got < magic.len() {
        match stream.read(&mut magic[got..]) {
            Ok(0) if got == 0 => return Ok(None),
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
        if magic[..got] != MAGIC[..got] {
            break;
        }
    }
    let mut hello = Hello {
        magic: magic[..got].to_vec(),
        version: 0,
        rank: 0,
        world_size: 0,
        payload: Vec::new(),
    };
    if hello.magic != MAGIC {
        return Ok(Some(hello));
    }
    let mut fixed = [0u8; 16];
    stream.read_exact(&mut fixed)?;
    let word = |i: usize| u32::from_le_bytes(fixed[4 * i..4 * i + 4].try_into().unwrap());
    hello.version = word(0);
    if hello.version != VERSION {
        return Ok(Some(hello));
    }
    (hello.rank, hello.world_size) = (word(1), word(2));
    let len = word(3) as usize;
    if len > MAX_HELLO_PAYLOAD {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("a hello payload of {len} bytes (at most {MAX_HELLO_PAYLOAD})"),
        ));
    }
    hello.payload = vec![0; len];
    stream.read_exact(&mut hello.payload)?;
    Ok(Some(hello))
}

pub(super) fn write_frame(
    stream: &mut TcpStream,
    tag: Tag,
    op: u32,
    seq: u64,
    body: &[u8],
) -> io::Result<()> {
    let mut header = Vec::with_capacity(21 + body.len().min(1 << 16));
    header.push(tag as u8);
    header.extend_from_slice(&op.to_le_bytes());
    header.extend_from_slice(&seq.to_le_bytes());
    header.extend_from_slice(&(body.len() as u64).to_le_bytes());
    if body.len() <= 1 << 16 {
        header.extend_from_slice(body);
        stream.write_all(&header)?;
    } else {
        stream.write_all(&header)?;
        stream.write_all(body)?;
    }
    stream.flush()
}

/// Reads one frame; a connection closed before or inside it is `UnexpectedEof`.
pub(super) fn read_frame(stream: &mut TcpStream) -> io::Result<Frame> {
    let mut header = [0u8; 21];
    stream.read_exact(&mut header)?;
    let len = u64::from_le_bytes(header[13..21].try_into().unwrap());
    if len > MAX_BODY {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("a frame of {len} bytes: the stream is corrupt"),
        ));
    }
    // Grown as the bytes arrive, so a lying length cannot allocate more than was sent.
    let mut body = Vec::with_capacity(len.min(1 << 26) as usize);
    Read::by_ref(stream).take(len).read_to_end(&mut body)?;
    if body.len() as u64 != len {
        return Err(io::ErrorKind::UnexpectedEof.into());
    }
    Ok(Frame {
        tag: header[0],
        op: u32::from_le_bytes(header[1..5].try_into().unwrap()),
        seq: u64::from_le_bytes(header[5..13].try_into().unwrap()),
        body,
    })
}

/// Every rank's payload, in rank order: count u64, then length u64 and bytes per rank.
pub(super) fn encode_table(parts: &[&[u8]]) -> Vec<u8> {
    let total: usize = parts.iter().map(|p| p.len() + 8).sum();
    let mut bytes = Vec::with_capacity(total + 8);
    bytes.extend_from_slice(&(parts.len() as u64).to_le_bytes());
    for part in parts {
        bytes.extend_from_slice(&(part.len() as u64).to_le_bytes());
        bytes.extend_from_slice(part);
    }
    bytes
}

pub(super) fn decode_table(bytes: &[u8]) -> Option<Vec<Vec<u8>>> {
    let mut rest = bytes;
    let mut take = |n: usize| -> Option<&[u8]> {
        let (head, tail) = (rest.get(..n)?, rest.get(n..)?);
        rest = tail;
        Some(head)
    };
    let word = |b: &[u8]| u64::from_le_bytes(b.try_into().unwrap()) as usize;
    let count = word(take(8)?);
    let mut parts = Vec::with_capacity(count.min(1 << 16));
    for _ in 0..count {
        let len = word(take(8)?);
        parts.push(take(len)?.to_vec());
    }
    rest.is_empty().then_some(parts)
}

/// Low latency for small frames, and keepalive probes so a peer whose host vanished (no FIN,
/// no RST) is noticed in about a minute even while this side only waits.
pub(super) fn configure(stream: &TcpStream) -> io::Result<()> {
    stream.set_nodelay(true)?;
    let fd = stream.as_raw_fd();
    let set = |level: libc::c_int, name: libc::c_int, value: libc::c_int| -> io::Result<()> {
        // SAFETY: a valid socket descriptor (borrowed from `stream`) and a pointer to an int that
        // lives across the call, with its size.
        let rc = unsafe {
            libc::setsockopt(
                fd,
                level,
                name,
                (&value as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if rc == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    };
    set(libc::SOL_SOCKET, libc::SO_KEEPALIVE, 1)?;
    #[cfg(target_os = "linux")]
    {
        set(libc::IPPROTO_TCP, libc::TCP_KEEPIDLE, 30)?;
        set(libc::IPPROTO_TCP, libc::TCP_KEEPINTVL, 10)?;
        set(libc::IPPROTO_TCP, libc::TCP_KEEPCNT, 3)?;
    }
    Ok(())
}

/// Waits until one of `fds` can be read (data, end of stream or an error) or `timeout` passes;
/// returns which ones can.
pub(super) fn wait_readable(fds: &[i32], timeout: Duration) -> io::Result<Vec<bool>> {
    let mut polls: Vec<libc::pollfd> = fds
        .iter()
        .map(|&fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    let deadline = std::time::Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        // Rounded up, so that a wait never ends a hair before the deadline it was given.
        let ms = left.as_micros().div_ceil(1000).min(i32::MAX as u128) as libc::c_int;
        // SAFETY: `polls` is a live, exclusively borrowed array of `polls.len()` pollfd.
        let rc = unsafe { libc::poll(polls.as_mut_ptr(), polls.len() as libc::nfds_t, ms) };
        if rc >= 0 {
            return Ok(polls.iter().map(|p| p.revents != 0).collect());
        }
        let error = io::Error::last_os_error();
        if error.kind() != io::ErrorKind::Interrupted {
            return Err(error);
        }
    }
}

/// `60 s`, `1.5 s`: a duration as the error messages say it.
pub(super) fn seconds(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s.fract() == 0.0 {
        format!("{s} s")
    } else {
        format!("{s:.1} s")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_round_trip_and_reject_garbage() {
        let parts: [&[u8]; 3] = [b"a", b"", b"xyz"];
        let bytes = encode_table(&parts);
        assert_eq!(
            decode_table(&bytes).unwrap(),
            vec![b"a".to_vec(), vec![], b"xyz".to_vec()]
        );
        assert!(decode_table(&bytes[..bytes.len() - 1]).is_none());
        assert!(decode_table(&[bytes.as_slice(), b"!"].concat()).is_none());
        assert_eq!(seconds(Duration::from_secs(60)), "60 s");
        assert_eq!(seconds(Duration::from_millis(1500)), "1.5 s");
    }
}
