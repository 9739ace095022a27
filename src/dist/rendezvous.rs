//! The processes of a group find each other: rank 0 listens at `MASTER_ADDR:MASTER_PORT` (the
//! port as [`ProcessGroupEnv`] resolved it), every other rank connects and says hello, and once
//! all have arrived rank 0 sends everyone the table of their hello payloads. The connections stay
//! open and carry the collectives of [`super::tcp::TcpComm`] afterwards.
//!
//! ```text
//!  rank 0                                     rank r (1 .. world_size)
//!  bind 0.0.0.0:PORT (SO_REUSEADDR)           connect HOST:PORT, retrying with backoff
//!  accept, read hello  ◄───────────────────── hello: magic, version, r, world size, payload
//!    check: magic and version (same build),
//!    world size, rank in range, not twice
//!  ... until every rank arrived or the
//!  deadline passed (-> an Error frame to
//!  all who came, naming who did not)
//!  Table frame: every payload ──────────────► payloads in rank order
//! ```
//!
//! Each side gives up at its own deadline ([`ProcessGroupEnv::rendezvous_timeout`] after it
//! started): rank 0 with "rank 0 waited 60 s for ranks [3, 5] of 8 to arrive at 10.0.0.1:29500",
//! which it also sends to every rank that did arrive, so all of them report the same cause; a
//! rank that never reached rank 0 with "rank 3 could not reach rank 0 at HOST:PORT within 60 s:
//! connection refused". A connection that closes without a byte (a port probe) is ignored; one
//! that speaks something else, another build's protocol, a second rank 3 or a different world
//! size fails the rendezvous with an error saying so.
//!
//! The payload is the caller's: an NCCL unique id (rank 0's entry is the one that counts), a run
//! fingerprint every rank must share ([`Rendezvous::ensure_same_payload`]).

use super::launch::ProcessGroupEnv;
use super::wire::{
    configure, decode_table, encode_table, read_frame, read_hello, seconds, wait_readable,
    write_frame, write_hello, Hello, Tag, MAGIC, MAX_HELLO_PAYLOAD, VERSION,
};
use anyhow::{anyhow, bail, ensure, Result};
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

/// How long rank 0 waits for a connected peer's hello before ignoring the connection.
const HELLO_WAIT: Duration = Duration::from_secs(10);
/// How much longer than rank 0's own deadline a connected rank waits for rank 0's answer (rank 0
/// answers by its deadline, with the table or with the reason it gave up).
pub(super) const ANSWER_GRACE: Duration = Duration::from_secs(10);
/// Longest single connection attempt, and the longest pause between attempts.
const CONNECT_ATTEMPT: Duration = Duration::from_secs(5);
const MAX_BACKOFF: Duration = Duration::from_secs(1);

/// The connections a completed rendezvous leaves.
pub(super) enum Links {
    /// A group of one: no connections.
    Alone,
    /// Rank 0: the connection to every other rank, indexed by rank (`None` at 0).
    Root(Vec<Option<TcpStream>>),
    /// Any other rank: its connection to rank 0.
    Member(TcpStream),
}

/// A completed rendezvous: every rank's payload, and the open connections
/// ([`super::tcp::TcpComm::new`] runs collectives over them).
pub struct Rendezvous {
    rank: usize,
    world_size: usize,
    payloads: Vec<Vec<u8>>,
    links: Links,
}

impl Rendezvous {
    /// Meets the other processes of `group`, sending them `payload` (at most 1 MiB). Returns when
    /// every rank has arrived, or with an error by `group.rendezvous_timeout`.
    pub fn join(group: &ProcessGroupEnv, payload: &[u8]) -> Result<Rendezvous> {
        ensure!(
            payload.len() <= MAX_HELLO_PAYLOAD,
            "rendezvous payload of {} bytes (at most {MAX_HELLO_PAYLOAD})",
            payload.len()
        );
        ensure!(
            group.rank < group.world_size,
            "rank {} of {}",
            group.rank,
            group.world_size
        );
        if group.world_size == 1 {
            return Ok(Rendezvous {
                rank: 0,
                world_size: 1,
                payloads: vec![payload.to_vec()],
                links: Links::Alone,
            });
        }
        if group.rank == 0 {
            host(group, payload)
        } else {
            visit(group, payload)
        }
    }

    pub fn rank(&self) -> usize {
        self.rank
    }

    pub fn world_size(&self) -> usize {
        self.world_size
    }

    /// Every rank's payload, in rank order (the same on every rank).
    pub fn payloads(&self) -> &[Vec<u8>] {
        &self.payloads
    }

    /// An error naming the first rank whose payload differs from rank 0's: for a payload every
    /// process must share, such as a fingerprint of the run's configuration (`what` names it).
    pub fn ensure_same_payload(&self, what: &str) -> Result<()> {
        if let Some(r) = (1..self.world_size).find(|&r| self.payloads[r] != self.payloads[0]) {
            bail!(
                "rank {r}'s {what} differs from rank 0's ({} and {} bytes{}): every process must \
                 run the same configuration",
                self.payloads[r].len(),
                self.payloads[0].len(),
                match (
                    std::str::from_utf8(&self.payloads[r]),
                    std::str::from_utf8(&self.payloads[0])
                ) {
                    (Ok(a), Ok(b)) if a.len() + b.len() < 400 => format!(": `{a}` and `{b}`"),
                    _ => String::new(),
                }
            );
        }
        Ok(())
    }

    pub(super) fn into_links(self) -> (usize, usize, Links) {
        (self.rank, self.world_size, self.links)
    }
}

/// Rank 0: listen, collect every rank's hello, answer with the table.
fn host(group: &ProcessGroupEnv, payload: &[u8]) -> Result<Rendezvous> {
    let deadline = Instant::now() + group.rendezvous_timeout;
    let address = group.rendezvous_address();
    let world = group.world_size;
    let listener = listen(group)?;
    let mut members: Vec<Option<(TcpStream, SocketAddr)>> = (0..world).map(|_| None).collect();
    let mut payloads: Vec<Vec<u8>> = vec![Vec::new(); world];
    payloads[0] = payload.to_vec();
    let mut arrived = 1;
    while arrived < world {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            let missing: Vec<usize> = (1..world).filter(|&r| members[r].is_none()).collect();
            return Err(fail(
                &mut members,
                None,
                format!(
                    "rank 0 waited {} for ranks {missing:?} of {world} to arrive at {address}",
                    seconds(group.rendezvous_timeout)
                ),
            ));
        }
        if !wait_readable(&[listener.as_raw_fd()], left)?[0] {
            continue;
        }
        let (mut stream, from) = match listener.accept() {
            Ok(accepted) => accepted,
            Err(e) if transient_accept_error(&e) => continue,
            Err(e) => {
                let message = format!("rank 0: accepting a connection at {address}: {e}");
                return Err(fail(&mut members, None, message));
            }
        };
        stream.set_nonblocking(false)?;
        stream.set_read_timeout(Some(left.min(HELLO_WAIT)))?;
        // A connection that closes or stalls before saying anything is not a rank.
        let Ok(Some(hello)) = read_hello(&mut stream) else {
            continue;
        };
        let problem = hello_problem(&hello, from, &address, world, &members);
        if let Some(message) = problem {
            return Err(fail(&mut members, Some(stream), message));
        }
        configure(&stream)?;
        let rank = hello.rank as usize;
        payloads[rank] = hello.payload;
        members[rank] = Some((stream, from));
        arrived += 1;
    }
    drop(listener);
    let table = encode_table(&payloads.iter().map(Vec::as_slice).collect::<Vec<_>>());
    for r in 1..world {
        let (stream, from) = members[r].as_mut().expect("every rank arrived");
        stream.set_read_timeout(None)?;
        if let Err(e) = write_frame(stream, Tag::Table, 0, 0, &table) {
            let message = format!(
                "rank {r} (at {from}) left before the rendezvous at {address} completed: {e}"
            );
            return Err(fail(&mut members, None, message));
        }
    }
    let links = members.into_iter().map(|m| m.map(|(s, _)| s)).collect();
    Ok(Rendezvous {
        rank: 0,
        world_size: world,
        payloads,
        links: Links::Root(links),
    })
}

/// What is wrong with a hello rank 0 received from `from`, if anything.
fn hello_problem(
    hello: &Hello,
    from: SocketAddr,
    address: &str,
    world: usize,
    members: &[Option<(TcpStream, SocketAddr)>],
) -> Option<String> {
    if hello.magic != MAGIC {
        Some(format!(
            "rank 0: a connection from {from} to the rendezvous at {address} is not a swerve \
             rank (it began with \"{}\"): does another program use this port? (choose \
             another with SWERVE_RDZV_PORT)",
            String::from_utf8_lossy(&hello.magic).escape_debug()
        ))
    } else if hello.version != VERSION {
        Some(format!(
            "rank 0: the process at {from} speaks rendezvous protocol version {}, this \
             process version {VERSION}: every process must run the same swerve build",
            hello.version
        ))
    } else if hello.world_size as usize != world {
        Some(format!(
            "rank {} (at {from}) says the group has {} processes, rank 0 says {world}: \
             WORLD_SIZE / SLURM_NTASKS differ between processes",
            hello.rank, hello.world_size
        ))
    } else if hello.rank == 0 || hello.rank as usize >= world {
        Some(format!(
            "the process at {from} says it is rank {} of {world}, which {}: check RANK / \
             SLURM_PROCID",
            hello.rank,
            if hello.rank == 0 {
                "this process is"
            } else {
                "does not exist"
            }
        ))
    } else if let Some((_, first)) = &members[hello.rank as usize] {
        Some(format!(
            "two processes say they are rank {} of {world} (at {first} and {from}): check \
             RANK / SLURM_PROCID",
            hello.rank
        ))
    } else {
        None
    }
}

/// Rank 0's listener on every interface at the rendezvous port (IPv6 when rank 0's address
/// resolves only to IPv6). `TcpListener::bind` sets SO_REUSEADDR, so a port left in TIME_WAIT by
/// a previous run is reused; a port another process listens on is an error saying so.
fn listen(group: &ProcessGroupEnv) -> Result<TcpListener> {
    let resolved: Vec<SocketAddr> = (group.master_addr.as_str(), group.master_port)
        .to_socket_addrs()
        .map(Iterator::collect)
        .unwrap_or_default();
    let any: IpAddr = if !resolved.is_empty() && resolved.iter().all(SocketAddr::is_ipv6) {
        Ipv6Addr::UNSPECIFIED.into()
    } else {
        Ipv4Addr::UNSPECIFIED.into()
    };
    let at = SocketAddr::new(any, group.master_port);
    let listener = TcpListener::bind(at).map_err(|e| {
        let why = match e.kind() {
            io::ErrorKind::AddrInUse => "the port is in use (by another run or another \
                                          program: choose a free one with SWERVE_RDZV_PORT)"
                .to_string(),
            io::ErrorKind::PermissionDenied => {
                "permission denied (ports below 1024 need privileges)".to_string()
            }
            _ => e.to_string(),
        };
        anyhow!(
            "rank 0 could not listen for the rendezvous on {at} (port from {}): {why}",
            group.port_from
        )
    })?;
    listener.set_nonblocking(true)?;
    Ok(listener)
}

fn transient_accept_error(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock
            | io::ErrorKind::Interrupted
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
    )
}

/// Rank 0 gives up: tells every rank that arrived (and `extra`, the connection at fault) why,
/// best effort, and returns the reason as the error.
fn fail(
    members: &mut [Option<(TcpStream, SocketAddr)>],
    extra: Option<TcpStream>,
    message: String,
) -> anyhow::Error {
    for (stream, _) in members.iter_mut().flatten() {
        notify(stream, &message);
    }
    if let Some(mut stream) = extra {
        notify(&mut stream, &message);
    }
    anyhow!(message)
}

/// Sends `message` as an Error frame, without waiting long on a peer that does not read.
pub(super) fn notify(stream: &mut TcpStream, message: &str) {
    let _ = stream.set_write_timeout(Some(Duration::from_secs(1)));
    let _ = write_frame(stream, Tag::Error, 0, 0, message.as_bytes());
}

/// Any other rank: reach rank 0, say hello, wait for the table.
fn visit(group: &ProcessGroupEnv, payload: &[u8]) -> Result<Rendezvous> {
    let deadline = Instant::now() + group.rendezvous_timeout;
    let (rank, world) = (group.rank, group.world_size);
    let address = group.rendezvous_address();
    let mut backoff = Duration::from_millis(20);
    let mut stream = loop {
        let last_error = match connect_once(group, deadline) {
            Ok(stream) => break stream,
            Err(why) => why,
        };
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            bail!(
                "rank {rank} could not reach rank 0 at {address} within {}: {last_error}",
                seconds(group.rendezvous_timeout)
            );
        }
        std::thread::sleep(backoff.min(left));
        backoff = (backoff * 2).min(MAX_BACKOFF);
    };
    configure(&stream)?;
    write_hello(&mut stream, rank, world, payload)
        .map_err(|e| anyhow!("rank {rank} could not greet rank 0 at {address}: {e}"))?;
    stream.set_read_timeout(Some(group.rendezvous_timeout + ANSWER_GRACE))?;
    let frame = read_frame(&mut stream).map_err(|e| match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => anyhow!(
            "rank {rank}: rank 0 at {address} took the connection but did not answer within {}",
            seconds(group.rendezvous_timeout + ANSWER_GRACE)
        ),
        _ => anyhow!(
            "rank {rank}: rank 0 at {address} closed the connection before the rendezvous \
             completed ({e}): it failed or stopped, see its log"
        ),
    })?;
    let payloads = match frame.tag {
        t if t == Tag::Error as u8 => bail!("{}", String::from_utf8_lossy(&frame.body)),
        t if t == Tag::Table as u8 => decode_table(&frame.body).filter(|p| p.len() == world),
        _ => None,
    };
    let payloads = payloads.ok_or_else(|| {
        anyhow!("rank {rank}: rank 0 at {address} answered with a malformed table")
    })?;
    stream.set_read_timeout(None)?;
    Ok(Rendezvous {
        rank,
        world_size: world,
        payloads,
        links: Links::Member(stream),
    })
}

/// One attempt to connect to rank 0 at every address its host name resolves to; the reason it
/// failed, as the error message will say it.
fn connect_once(group: &ProcessGroupEnv, deadline: Instant) -> Result<TcpStream, String> {
    let addrs = (group.master_addr.as_str(), group.master_port)
        .to_socket_addrs()
        .map_err(|e| format!("could not resolve {}: {e}", group.master_addr))?;
    let mut why = format!("{} resolves to no address", group.master_addr);
    for addr in addrs {
        let left = deadline.saturating_duration_since(Instant::now());
        let attempt = left.min(CONNECT_ATTEMPT).max(Duration::from_millis(1));
        match TcpStream::connect_timeout(&addr, attempt) {
            Ok(stream) => return Ok(stream),
            Err(e) => {
                why = match e.kind() {
                    io::ErrorKind::ConnectionRefused => "connection refused".to_string(),
                    io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock => {
                        format!("connecting to {addr} timed out")
                    }
                    _ => format!("connecting to {addr}: {e}"),
                }
            }
        }
    }
    Err(why)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dist::launch::LaunchSource;
    use std::io::Write;

    fn free_port() -> u16 {
        TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    }

    fn member(rank: usize, world_size: usize, port: u16, timeout_ms: u64) -> ProcessGroupEnv {
        ProcessGroupEnv {
            source: LaunchSource::Torchrun,
            rank,
            world_size,
            master_addr: "127.0.0.1".into(),
            master_port: port,
            port_from: "MASTER_PORT",
            rendezvous_timeout: Duration::from_millis(timeout_ms),
            ..ProcessGroupEnv::single()
        }
    }

    /// Runs `join` for each (rank, world size) on its own thread; the results in that order.
    fn join_all(port: u16, ranks: &[(usize, usize)], timeout_ms: u64) -> Vec<Result<Rendezvous>> {
        std::thread::scope(|s| {
            let handles: Vec<_> = ranks
                .iter()
                .map(|&(rank, world)| {
                    s.spawn(move || {
                        let group = member(rank, world, port, timeout_ms);
                        Rendezvous::join(&group, format!("payload {rank}").as_bytes())
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        })
    }

    fn message(result: &Result<Rendezvous>) -> String {
        match result {
            Ok(_) => "no error".into(),
            Err(e) => format!("{e:#}"),
        }
    }

    #[test]
    fn every_rank_gets_every_payload() {
        let port = free_port();
        let results = join_all(port, &[(2, 3), (1, 3), (0, 3)], 5000);
        for r in results {
            let r = r.unwrap();
            let expected: Vec<Vec<u8>> = (0..3).map(|i| format!("payload {i}").into()).collect();
            assert_eq!(r.payloads(), expected.as_slice());
            assert_eq!(r.world_size(), 3);
            assert!(r.ensure_same_payload("fingerprint").is_err());
        }
        let alone = Rendezvous::join(&ProcessGroupEnv::single(), b"x").unwrap();
        assert_eq!(alone.payloads(), &[b"x".to_vec()]);
        alone.ensure_same_payload("fingerprint").unwrap();
    }

    #[test]
    fn a_duplicate_rank_or_a_wrong_world_size_fails_everyone_with_the_reason() {
        let port = free_port();
        let results = join_all(port, &[(0, 3), (1, 3), (1, 3)], 5000);
        for r in &results {
            let m = message(r);
            assert!(m.contains("two processes say they are rank 1 of 3"), "{m}");
        }
        let port = free_port();
        let results = join_all(port, &[(0, 3), (1, 3), (2, 4)], 1000);
        for r in &results[..1] {
            let m = message(r);
            assert!(
                m.contains("rank 2 (at 127.0.0.1:") && m.contains("says the group has 4"),
                "{m}"
            );
        }
        // The rank with the wrong size hears it too (or, arriving after rank 0 gave up, cannot
        // connect any more: either way it fails).
        assert!(results[2].is_err());
    }

    #[test]
    fn a_foreign_program_on_the_port_is_named() {
        let port = free_port();
        let results = std::thread::scope(|s| {
            let root = s.spawn(|| Rendezvous::join(&member(0, 2, port, 5000), b""));
            // A port probe (connect, close) is ignored; an HTTP request is not.
            let connect = || loop {
                match TcpStream::connect(("127.0.0.1", port)) {
                    Ok(stream) => break stream,
                    Err(_) => std::thread::sleep(Duration::from_millis(10)),
                }
            };
            drop(connect());
            connect().write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
            root.join().unwrap()
        });
        let m = message(&results);
        assert!(
            m.contains("is not a swerve rank (it began with \"GET / HT\")"),
            "{m}"
        );
    }

    #[test]
    fn a_missing_rank_and_an_absent_rank_0_time_out_with_names() {
        let port = free_port();
        let started = Instant::now();
        let results = join_all(port, &[(0, 4), (2, 4)], 300);
        for r in &results {
            let m = message(r);
            assert!(
                m.contains(&format!(
                    "rank 0 waited 0.3 s for ranks [1, 3] of 4 to arrive at 127.0.0.1:{port}"
                )),
                "{m}"
            );
        }
        let port = free_port();
        let results = join_all(port, &[(1, 2)], 300);
        let m = message(&results[0]);
        assert_eq!(
            m,
            format!("rank 1 could not reach rank 0 at 127.0.0.1:{port} within 0.3 s: connection refused")
        );
        assert!(started.elapsed() < Duration::from_secs(5));
    }

    #[test]
    fn a_port_in_use_is_explained() {
        let taken = TcpListener::bind("0.0.0.0:0").unwrap();
        let port = taken.local_addr().unwrap().port();
        let m = message(&Rendezvous::join(&member(0, 2, port, 300), b""));
        assert!(m.contains("the port is in use"), "{m}");
        assert!(m.contains("port from MASTER_PORT"), "{m}");
    }
}
