//! Ranks as processes: [`TcpComm`] runs the [`Collectives`] over the connections a
//! [`Rendezvous`] left, a star through rank 0. One collective:
//!
//! ```text
//!  rank r ≠ 0:  Part frame (seq, op, its bytes) ──► rank 0
//!  rank 0:      waits on every connection at once (poll), checks each Part's seq and op against
//!               its own, combines: all-gather -> the table of every rank's bytes; all-reduce ->
//!               the reduction in rank order 0, 1, 2, ...; broadcast -> the root's bytes
//!  rank 0:      Result frame ──► every rank r; all return the same bytes
//! ```
//!
//! The reductions are done once, on rank 0, in the same rank order as [`Collectives`]' defaults
//! (so the bits equal those of [`super::local`] and of a group of one with the same inputs), and
//! only the reduced values travel back: a gradient all-reduce moves 2 x its size per rank, not
//! `size` times it.
//!
//! Failures: a rank whose connection closes (it exited, crashed or was killed) or that sends
//! nothing for the collective timeout makes rank 0's collective fail with an error naming it,
//! and rank 0 sends that error to every other rank, so all of them report the same cause. A
//! rank that loses rank 0 says so. After a failure the group is broken: every later collective
//! fails at once with the first cause, as in [`super::local`]. A rank that calls a different
//! collective, or a different number of them, is an error naming both calls. Dropping a
//! `TcpComm` closes its connections, which is how the others learn that it left.

use super::launch::ProcessGroupEnv;
use super::rendezvous::{notify, Links, Rendezvous, ANSWER_GRACE};
use super::wire::{
    decode_table, encode_table, read_frame, seconds, wait_readable, write_frame, Tag,
};
use super::{bytes_to_values, reduce_in_rank_order, Collectives, Communicator, Element, ReduceOp};
use crate::backend::Backend;
use anyhow::{anyhow, bail, ensure, Result};
use std::fmt;
use std::io;
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// One process's handle on a group of processes.
pub struct TcpComm {
    rank: usize,
    size: usize,
    timeout: Duration,
    state: Mutex<State>,
}

struct State {
    links: Links,
    /// The last collective's number (1 is the first after the rendezvous).
    seq: u64,
    /// Why the group can no longer run a collective (the first failure seen).
    broken: Option<String>,
}

/// Which collective a frame belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    Gather,
    Barrier,
    Broadcast(usize),
    Reduce(Dtype, ReduceOp),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Dtype {
    F32,
    F64,
}

impl Op {
    fn code(self) -> u32 {
        match self {
            Op::Gather => 1,
            Op::Barrier => 2,
            Op::Broadcast(root) => 3 | (root as u32) << 8,
            Op::Reduce(Dtype::F32, ReduceOp::Sum) => 4,
            Op::Reduce(Dtype::F32, ReduceOp::Max) => 5,
            Op::Reduce(Dtype::F64, ReduceOp::Sum) => 6,
            Op::Reduce(Dtype::F64, ReduceOp::Max) => 7,
        }
    }

    fn from_code(code: u32) -> Option<Op> {
        Some(match code & 0xff {
            1 if code == 1 => Op::Gather,
            2 if code == 2 => Op::Barrier,
            3 => Op::Broadcast((code >> 8) as usize),
            4 if code == 4 => Op::Reduce(Dtype::F32, ReduceOp::Sum),
            5 if code == 5 => Op::Reduce(Dtype::F32, ReduceOp::Max),
            6 if code == 6 => Op::Reduce(Dtype::F64, ReduceOp::Sum),
            7 if code == 7 => Op::Reduce(Dtype::F64, ReduceOp::Max),
            _ => return None,
        })
    }

    /// What another rank's frame says it calls.
    fn describe(code: u32) -> String {
        match Op::from_code(code) {
            Some(op) => op.to_string(),
            None => format!("an unknown collective (code {code:#x})"),
        }
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Op::Gather => write!(f, "all-gather"),
            Op::Barrier => write!(f, "barrier"),
            Op::Broadcast(root) => write!(f, "broadcast from rank {root}"),
            Op::Reduce(dtype, op) => {
                let dtype = if *dtype == Dtype::F32 { "f32" } else { "f64" };
                let op = if *op == ReduceOp::Sum { "sum" } else { "max" };
                write!(f, "all-reduce ({dtype}, {op})")
            }
        }
    }
}

impl TcpComm {
    /// Collectives over `rendezvous`' connections. `timeout`: how long a collective waits for a
    /// rank that sends nothing before failing (a rank whose process is gone fails it at once).
    pub fn new(rendezvous: Rendezvous, timeout: Duration) -> Result<TcpComm> {
        let (rank, size, links) = rendezvous.into_links();
        match &links {
            Links::Alone => {}
            Links::Root(members) => {
                for stream in members.iter().flatten() {
                    // poll(2) does the waiting; this bounds a frame that stops halfway.
                    stream.set_read_timeout(Some(timeout))?;
                    stream.set_write_timeout(Some(timeout))?;
                }
            }
            Links::Member(stream) => {
                // Rank 0 answers within its own timeout, with the result or with the reason.
                stream.set_read_timeout(Some(timeout + ANSWER_GRACE))?;
                stream.set_write_timeout(Some(timeout + ANSWER_GRACE))?;
            }
        }
        Ok(TcpComm {
            rank,
            size,
            timeout,
            state: Mutex::new(State {
                links,
                seq: 0,
                broken: None,
            }),
        })
    }

    /// The rendezvous of `group` with `payload` ([`Rendezvous::join`]), then collectives over
    /// it with `group.collective_timeout`; also every rank's payload, in rank order.
    pub fn connect(group: &ProcessGroupEnv, payload: &[u8]) -> Result<(TcpComm, Vec<Vec<u8>>)> {
        let rendezvous = Rendezvous::join(group, payload)?;
        let payloads = rendezvous.payloads().to_vec();
        Ok((
            TcpComm::new(rendezvous, group.collective_timeout)?,
            payloads,
        ))
    }

    /// One collective: every rank's `local` bytes go to rank 0, which `combine`s them (in rank
    /// order) into the reply every rank returns.
    fn exchange(
        &self,
        op: Op,
        local: &[u8],
        combine: impl FnOnce(Vec<Vec<u8>>) -> Result<Vec<u8>, String>,
    ) -> Result<Vec<u8>> {
        let mut state = self
            .state
            .lock()
            .map_err(|_| anyhow!("collective: an earlier collective on this rank panicked"))?;
        if let Some(why) = &state.broken {
            bail!("{why}");
        }
        state.seq += 1;
        let seq = state.seq;
        let outcome = match &mut state.links {
            Links::Alone => combine(vec![local.to_vec()]),
            Links::Root(members) => self.lead(members, op, seq, local, combine),
            Links::Member(stream) => self.follow(stream, op, seq, local),
        };
        outcome.map_err(|why| {
            state.broken = Some(why.clone());
            anyhow!(why)
        })
    }

    /// Rank 0's side: gather, combine, answer; on failure tell every rank why.
    fn lead(
        &self,
        members: &mut [Option<TcpStream>],
        op: Op,
        seq: u64,
        local: &[u8],
        combine: impl FnOnce(Vec<Vec<u8>>) -> Result<Vec<u8>, String>,
    ) -> Result<Vec<u8>, String> {
        let outcome = self.gather(members, op, seq, local).and_then(|parts| {
            let reply = combine(parts).map_err(|why| format!("collective #{seq} ({op}): {why}"))?;
            for (r, stream) in members.iter_mut().enumerate() {
                if let Some(stream) = stream {
                    write_frame(stream, Tag::Result, op.code(), seq, &reply)
                        .map_err(|e| self.lost(r, op, seq, &e))?;
                }
            }
            Ok(reply)
        });
        if let Err(why) = &outcome {
            for stream in members.iter_mut().flatten() {
                notify(stream, why);
            }
        }
        outcome
    }

    /// Every rank's part of collective `seq`, waiting on all connections at once so that a rank
    /// that left is noticed even while another is still computing.
    fn gather(
        &self,
        members: &mut [Option<TcpStream>],
        op: Op,
        seq: u64,
        local: &[u8],
    ) -> Result<Vec<Vec<u8>>, String> {
        let size = self.size;
        let mut parts: Vec<Option<Vec<u8>>> = vec![None; size];
        parts[0] = Some(local.to_vec());
        let deadline = Instant::now() + self.timeout;
        loop {
            let pending: Vec<usize> = (1..size).filter(|&r| parts[r].is_none()).collect();
            if pending.is_empty() {
                break;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(format!(
                    "collective #{seq} ({op}): rank 0 waited {} for ranks {pending:?} of {size}, \
                     which sent nothing (hung, or busy longer than the collective timeout, \
                     SWERVE_COLLECTIVE_TIMEOUT_S)",
                    seconds(self.timeout)
                ));
            }
            let stream = |r: usize| members[r].as_ref().expect("rank 0 links every other rank");
            let fds: Vec<i32> = pending.iter().map(|&r| stream(r).as_raw_fd()).collect();
            let ready = wait_readable(&fds, left)
                .map_err(|e| format!("collective #{seq} ({op}): waiting for ranks: {e}"))?;
            for (&r, _) in pending.iter().zip(ready).filter(|(_, ready)| *ready) {
                let stream = members[r].as_mut().expect("rank 0 links every other rank");
                let frame = read_frame(stream).map_err(|e| self.lost(r, op, seq, &e))?;
                if frame.tag != Tag::Part as u8 {
                    return Err(format!(
                        "collective #{seq} ({op}): rank {r} sent a frame of kind {} where rank 0 \
                         expected its part: the connection is out of step",
                        frame.tag
                    ));
                }
                if frame.seq != seq {
                    return Err(format!(
                        "rank 0 is at collective #{seq} ({op}) but rank {r} sent collective #{} \
                         ({}): the ranks called different numbers of collectives",
                        frame.seq,
                        Op::describe(frame.op)
                    ));
                }
                if frame.op != op.code() {
                    return Err(format!(
                        "collective #{seq}: rank 0 calls {op} but rank {r} calls {}: the ranks \
                         called different collectives",
                        Op::describe(frame.op)
                    ));
                }
                parts[r] = Some(frame.body);
            }
        }
        Ok(parts.into_iter().map(|p| p.expect("every part")).collect())
    }

    /// Another rank's side: send the part, wait for rank 0's answer.
    fn follow(
        &self,
        stream: &mut TcpStream,
        op: Op,
        seq: u64,
        local: &[u8],
    ) -> Result<Vec<u8>, String> {
        write_frame(stream, Tag::Part, op.code(), seq, local)
            .map_err(|e| self.lost(0, op, seq, &e))?;
        let frame = read_frame(stream).map_err(|e| self.lost(0, op, seq, &e))?;
        if frame.tag == Tag::Error as u8 {
            return Err(String::from_utf8_lossy(&frame.body).into_owned());
        }
        if frame.tag != Tag::Result as u8 || frame.seq != seq || frame.op != op.code() {
            return Err(format!(
                "collective #{seq} ({op}): rank {} got rank 0's answer to collective #{} ({}): \
                 the connection is out of step",
                self.rank,
                frame.seq,
                Op::describe(frame.op)
            ));
        }
        Ok(frame.body)
    }

    /// Why the connection to rank `r` failed, as every rank will report it.
    fn lost(&self, r: usize, op: Op, seq: u64, e: &io::Error) -> String {
        let size = self.size;
        match e.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => {
                let waited = if self.rank == 0 {
                    self.timeout
                } else {
                    self.timeout + ANSWER_GRACE
                };
                format!(
                    "collective #{seq} ({op}): rank {} heard nothing from rank {r} of {size} for \
                     {} (it is hung, its host is gone, or it is busy longer than the collective \
                     timeout, SWERVE_COLLECTIVE_TIMEOUT_S)",
                    self.rank,
                    seconds(waited)
                )
            }
            io::ErrorKind::UnexpectedEof
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::BrokenPipe => format!(
                "collective #{seq} ({op}): rank {r} of {size} left the group (its connection \
                 closed: it failed or stopped)"
            ),
            _ => format!(
                "collective #{seq} ({op}): the connection to rank {r} of {size} failed: {e}"
            ),
        }
    }

    /// Every rank's `values` reduced in rank order on rank 0; the result on every rank.
    fn all_reduce<T: Element + bytemuck::Pod, const N: usize>(
        &self,
        values: &mut [T],
        op: ReduceOp,
        dtype: Dtype,
        from: fn([u8; N]) -> T,
    ) -> Result<()> {
        if self.size == 1 {
            return Ok(());
        }
        let n = values.len();
        let reply = self.exchange(
            Op::Reduce(dtype, op),
            bytemuck::cast_slice(values),
            |parts| {
                if let Some((r, p)) = parts.iter().enumerate().find(|(_, p)| p.len() != n * N) {
                    return Err(format!(
                        "rank {r} contributed {} values where rank 0 has {n}",
                        p.len() / N
                    ));
                }
                let all = bytes_to_values(&parts.concat(), from);
                let mut out = all[..n].to_vec();
                reduce_in_rank_order(&all, &mut out, op);
                Ok(bytemuck::cast_slice(&out).to_vec())
            },
        )?;
        ensure!(
            reply.len() == n * N,
            "collective ({}): rank 0 answered {} bytes for {n} values",
            Op::Reduce(dtype, op),
            reply.len()
        );
        for (v, bytes) in values.iter_mut().zip(reply.chunks_exact(N)) {
            *v = from(bytes.try_into().expect("chunk of N bytes"));
        }
        Ok(())
    }
}

impl Collectives for TcpComm {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    fn all_gather_bytes(&self, local: &[u8]) -> Result<Vec<Vec<u8>>> {
        let table = self.exchange(Op::Gather, local, |parts| {
            Ok(encode_table(
                &parts.iter().map(Vec::as_slice).collect::<Vec<_>>(),
            ))
        })?;
        decode_table(&table)
            .filter(|parts| parts.len() == self.size)
            .ok_or_else(|| anyhow!("collective (all-gather): rank 0 answered a malformed table"))
    }

    fn barrier(&self) -> Result<()> {
        self.exchange(Op::Barrier, &[], |_| Ok(Vec::new()))
            .map(drop)
    }

    fn broadcast_bytes(&self, bytes: &mut Vec<u8>, root: usize) -> Result<()> {
        ensure!(
            root < self.size && root < 1 << 24,
            "broadcast from rank {root} of {}",
            self.size
        );
        let mine: &[u8] = if self.rank == root { bytes } else { &[] };
        let reply = self.exchange(Op::Broadcast(root), mine, |mut parts| {
            Ok(std::mem::take(&mut parts[root]))
        })?;
        *bytes = reply;
        Ok(())
    }

    fn all_reduce_f32(&self, values: &mut [f32], op: ReduceOp) -> Result<()> {
        self.all_reduce(values, op, Dtype::F32, f32::from_le_bytes)
    }

    fn all_reduce_f64(&self, values: &mut [f64], op: ReduceOp) -> Result<()> {
        self.all_reduce(values, op, Dtype::F64, f64::from_le_bytes)
    }
}

impl<B: Backend> Communicator<B> for TcpComm {}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dist::launch::LaunchSource;
    use std::net::TcpListener;

    fn free_port() -> u16 {
        TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    }

    /// A group of `size` processes played by threads over loopback; `f` runs on each rank.
    fn on_ranks<R: Send>(
        size: usize,
        timeout: Duration,
        f: impl Fn(TcpComm) -> R + Sync,
    ) -> Vec<R> {
        let port = free_port();
        std::thread::scope(|s| {
            let f = &f;
            let handles: Vec<_> = (0..size)
                .map(|rank| {
                    s.spawn(move || {
                        let group = ProcessGroupEnv {
                            source: LaunchSource::Torchrun,
                            rank,
                            world_size: size,
                            master_addr: "127.0.0.1".into(),
                            master_port: port,
                            rendezvous_timeout: Duration::from_secs(10),
                            collective_timeout: timeout,
                            ..ProcessGroupEnv::single()
                        };
                        let (comm, _) = TcpComm::connect(&group, b"").unwrap();
                        f(comm)
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        })
    }

    #[test]
    fn op_codes_round_trip() {
        for op in [
            Op::Gather,
            Op::Barrier,
            Op::Broadcast(0),
            Op::Broadcast(70000),
            Op::Reduce(Dtype::F32, ReduceOp::Sum),
            Op::Reduce(Dtype::F32, ReduceOp::Max),
            Op::Reduce(Dtype::F64, ReduceOp::Sum),
            Op::Reduce(Dtype::F64, ReduceOp::Max),
        ] {
            assert_eq!(Op::from_code(op.code()), Some(op));
        }
        assert_eq!(Op::from_code(0x104), None);
        assert_eq!(Op::describe(9), "an unknown collective (code 0x9)");
    }

    #[test]
    fn collectives_match_the_rank_order_defaults() {
        // 1e8 + 1 + -1e8 in f32: (1e8 + 1) rounds to 1e8, so rank order gives 0, another order 1.
        let results = on_ranks(3, Duration::from_secs(10), |c| {
            let r = c.rank();
            let mut v = vec![[1.0e8f32, 1.0, -1.0e8][r], r as f32];
            c.all_reduce_f32(&mut v, ReduceOp::Sum).unwrap();
            assert_eq!(v, vec![0.0, 3.0]);
            let mut w = vec![r as f64, f64::NAN];
            c.all_reduce_f64(&mut w, ReduceOp::Max).unwrap();
            assert!(w[0] == 2.0 && w[1].is_nan());
            let part = c
                .reduce_scatter_f32(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
                .unwrap();
            assert_eq!(
                part,
                vec![3.0 * (2 * r + 1) as f32, 3.0 * (2 * r + 2) as f32]
            );
            let gathered = c.all_gather_bytes(&vec![r as u8; r]).unwrap();
            assert_eq!(gathered, vec![vec![], vec![1], vec![2, 2]]);
            let mut bytes = if r == 1 { b"one".to_vec() } else { vec![] };
            c.broadcast_bytes(&mut bytes, 1).unwrap();
            c.barrier().unwrap();
            let mut empty: Vec<f32> = vec![];
            c.all_reduce_f32(&mut empty, ReduceOp::Sum).unwrap();
            bytes
        });
        assert!(results.iter().all(|b| b == b"one"));
    }

    #[test]
    fn a_mismatched_call_or_length_fails_every_rank_with_both_names() {
        let results = on_ranks(3, Duration::from_secs(10), |c| {
            let first = if c.rank() == 2 {
                c.barrier()
            } else {
                c.all_reduce_f32(&mut [1.0], ReduceOp::Sum)
            };
            let again = c.barrier();
            (
                format!("{:#}", first.unwrap_err()),
                format!("{:#}", again.unwrap_err()),
            )
        });
        for (first, again) in &results {
            assert_eq!(
                first,
                "collective #1: rank 0 calls all-reduce (f32, sum) but rank 2 calls barrier: the \
                 ranks called different collectives"
            );
            // The group is broken: later collectives fail at once with the first cause.
            assert_eq!(again, first);
        }
        let results = on_ranks(2, Duration::from_secs(10), |c| {
            let mut v = vec![1.0f64; 1 + c.rank()];
            format!("{:#}", c.all_reduce_f64(&mut v, ReduceOp::Sum).unwrap_err())
        });
        for m in &results {
            assert_eq!(
                m,
                "collective #1 (all-reduce (f64, sum)): rank 1 contributed 2 values where rank 0 \
                 has 1"
            );
        }
    }

    #[test]
    fn a_silent_rank_times_out_with_its_name() {
        let started = Instant::now();
        let results = on_ranks(3, Duration::from_millis(300), |c| {
            if c.rank() == 1 {
                std::thread::sleep(Duration::from_millis(900));
                // Rank 0 gave up and told everyone; this rank hears the same cause.
            }
            format!("{:#}", c.barrier().unwrap_err())
        });
        for m in &results {
            assert_eq!(
                m,
                "collective #1 (barrier): rank 0 waited 0.3 s for ranks [1] of 3, which sent \
                 nothing (hung, or busy longer than the collective timeout, \
                 SWERVE_COLLECTIVE_TIMEOUT_S)"
            );
        }
        assert!(started.elapsed() < Duration::from_secs(5));
    }
}
