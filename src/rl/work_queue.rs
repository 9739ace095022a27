//! The task groups of one rollout round, handed out across processes (one per node) as each
//! has room, so a node that finishes early takes more and a slow node holds up nobody's
//! collectives: none runs while episodes are in flight.
//!
//! ```text
//!   process 0: QueueServer (a thread per process's connection) ── units 0 1 2 3 4 5 ...
//!                  ▲ next / alive / finished / wait
//!   process r: QueueClient ── its workers pull the next unit when one of them is idle
//!
//!   client                          server
//!   hello ROUND RANK             ─► ok                      (the round is the rollout's index)
//!   next                         ─► unit N | none           (N: a task and its G samples)
//!   alive                        ─► ok                      (every HEARTBEAT, from a thread)
//!   finished                     ─► ok                      (every unit it took has ended)
//!   wait                         ─► waiting | all-finished C0,C1,.. | error WHY
//! ```
//!
//! A unit is a task with its whole group, so a group's episodes stay on one node. Every
//! process (0 included) is a client; process 0 also serves, on the rendezvous host at
//! [`queue_port`]. When every process has said `finished`, `wait` answers with how many units
//! each took, and the processes go on to exchange their episodes (no longer under time
//! pressure). Waiting has no time limit, but a liveness check: a client sends `alive` every
//! [`HEARTBEAT`], and a connection that sends nothing for [`LIVENESS`] (or closes) before its
//! process finished makes every `wait` fail with an error naming that process.

use crate::dist::launch::ProcessGroupEnv;
use anyhow::{anyhow, bail, Context, Result};
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How often a client says it is alive while its episodes run.
pub const HEARTBEAT: Duration = Duration::from_secs(5);
/// Silence after which the server declares a process dead.
pub const LIVENESS: Duration = Duration::from_secs(60);
/// How often a finished client asks whether the others have finished.
const POLL: Duration = Duration::from_millis(100);

/// Where process 0's queue listens, and how long a client keeps trying to reach it.
#[derive(Clone, Debug)]
pub struct QueueAddress {
    pub host: String,
    pub port: u16,
    pub connect_timeout: Duration,
}

impl QueueAddress {
    /// On the rendezvous host (`MASTER_ADDR`), at the port after the rendezvous'
    /// (`MASTER_PORT`) and the learner's data-parallel groups' (`MASTER_PORT + 1 + tp_rank`,
    /// see [`crate::dist::grid::Nested`]): `MASTER_PORT + 1 + tensor_parallel`.
    pub fn for_process_group(process: &ProcessGroupEnv, tensor_parallel: usize) -> Result<Self> {
        let port =
            u16::try_from(process.master_port as usize + 1 + tensor_parallel).map_err(|_| {
                anyhow!(
                    "the rollouts' work queue's port {} + {} is past 65535",
                    process.master_port,
                    1 + tensor_parallel
                )
            })?;
        Ok(Self {
            host: process.master_addr.clone(),
            port,
            connect_timeout: process.rendezvous_timeout,
        })
    }
}

/// `host:port` (IPv6 in brackets).
fn address(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// What the server knows of one round.
struct Round {
    round: u64,
    units: usize,
    next_unit: usize,
    /// Units handed to each process.
    taken: Vec<usize>,
    finished: Vec<bool>,
    failure: Option<String>,
}

/// Process 0's side: hands out `units` units to `processes` processes, for one round.
pub struct QueueServer {
    state: Arc<Mutex<Round>>,
}

impl QueueServer {
    /// Listens on `host:port` and serves the round on threads of its own (they end with it).
    pub fn start(
        host: &str,
        port: u16,
        round: u64,
        units: usize,
        processes: usize,
    ) -> Result<Self> {
        let at = address(host, port);
        let listener = TcpListener::bind(&at)
            .with_context(|| format!("the rollouts' work queue: listening on {at}"))?;
        let state = Arc::new(Mutex::new(Round {
            round,
            units,
            next_unit: 0,
            taken: vec![0; processes],
            finished: vec![false; processes],
            failure: None,
        }));
        let shared = state.clone();
        std::thread::spawn(move || {
            // One connection per process; then the listener closes.
            for _ in 0..processes {
                match listener.accept() {
                    Ok((stream, _)) => {
                        let state = shared.clone();
                        std::thread::spawn(move || serve(stream, &state));
                    }
                    Err(e) => {
                        lock(&shared).failure = Some(format!("the work queue's listener: {e}"));
                        return;
                    }
                }
            }
        });
        Ok(Self { state })
    }

    /// Units taken by each process so far.
    pub fn taken(&self) -> Vec<usize> {
        lock(&self.state).taken.clone()
    }
}

fn lock(state: &Mutex<Round>) -> std::sync::MutexGuard<'_, Round> {
    state.lock().unwrap_or_else(|e| e.into_inner())
}

/// One process's connection: answers its lines until it has been told that all finished, or
/// records why it went away.
fn serve(stream: TcpStream, state: &Mutex<Round>) {
    let mut rank: Option<usize> = None;
    let outcome = (|| -> Result<()> {
        stream.set_read_timeout(Some(LIVENESS))?;
        let mut writer = stream.try_clone()?;
        let mut lines = BufReader::new(stream);
        loop {
            let mut line = String::new();
            let who = rank.map_or("a process".to_string(), |r| format!("process {r}"));
            match lines.read_line(&mut line) {
                Ok(0) => bail!("{who} closed its work-queue connection before it finished"),
                Ok(_) => {}
                Err(e) => bail!(
                    "{who} sent nothing to the work queue for {} s before it finished (dead or hung): {e}",
                    LIVENESS.as_secs()
                ),
            }
            let (answer, done) = answer(line.trim(), &mut rank, state);
            writer.write_all(format!("{answer}\n").as_bytes())?;
            if done {
                return Ok(());
            }
        }
    })();
    if let Err(e) = outcome {
        let mut round = lock(state);
        // Once every process has finished, nobody waits on this one any more.
        if !round.finished.iter().all(|&f| f) {
            round.failure.get_or_insert(format!("{e:#}"));
        }
    }
}

/// The server's answer to one line, and whether the connection is done.
fn answer(line: &str, rank: &mut Option<usize>, state: &Mutex<Round>) -> (String, bool) {
    let mut round = lock(state);
    let words: Vec<&str> = line.split_whitespace().collect();
    match (words.as_slice(), *rank) {
        (["hello", r, p], None) => {
            let (Ok(r), Ok(p)) = (r.parse::<u64>(), p.parse::<usize>()) else {
                return (format!("error a bad hello: {line:?}"), true);
            };
            if r != round.round || p >= round.taken.len() {
                return (
                    format!(
                        "error process {p} is at round {r}, the queue at round {} of {} processes",
                        round.round,
                        round.taken.len()
                    ),
                    true,
                );
            }
            *rank = Some(p);
            ("ok".into(), false)
        }
        (["next"], Some(p)) => {
            if round.next_unit < round.units {
                let unit = round.next_unit;
                round.next_unit += 1;
                round.taken[p] += 1;
                (format!("unit {unit}"), false)
            } else {
                ("none".into(), false)
            }
        }
        (["alive"], Some(_)) => ("ok".into(), false),
        (["finished"], Some(p)) => {
            round.finished[p] = true;
            ("ok".into(), false)
        }
        (["wait"], Some(_)) => {
            if let Some(why) = &round.failure {
                (format!("error {why}"), true)
            } else if round.finished.iter().all(|&f| f) {
                let counts: Vec<String> = round.taken.iter().map(|c| c.to_string()).collect();
                (format!("all-finished {}", counts.join(",")), true)
            } else {
                ("waiting".into(), false)
            }
        }
        _ => (format!("error unexpected {line:?}"), true),
    }
}

/// Every process's side: pulls units, says it is alive, waits for the others.
pub struct QueueClient {
    connection: Arc<Mutex<(BufReader<TcpStream>, TcpStream)>>,
    at: String,
    stop_heartbeat: Arc<AtomicBool>,
}

impl QueueClient {
    /// Connects to process 0's queue for `round` (retrying while it starts listening, up to
    /// `connect_timeout`).
    pub fn connect(
        host: &str,
        port: u16,
        round: u64,
        rank: usize,
        connect_timeout: Duration,
    ) -> Result<Self> {
        let at = address(host, port);
        let started = Instant::now();
        let stream = loop {
            match TcpStream::connect(&at) {
                Ok(s) => break s,
                Err(_) if started.elapsed() < connect_timeout => {
                    std::thread::sleep(Duration::from_millis(50));
                }
                Err(e) => {
                    return Err(e).with_context(|| {
                        format!("process {rank}: connecting to the rollouts' work queue at {at} (process 0)")
                    })
                }
            }
        };
        stream.set_read_timeout(Some(LIVENESS))?;
        let connection = Arc::new(Mutex::new((BufReader::new(stream.try_clone()?), stream)));
        let client = Self {
            connection,
            at,
            stop_heartbeat: Arc::new(AtomicBool::new(false)),
        };
        client.ask(&format!("hello {round} {rank}"))?;
        let (connection, stop, at) = (
            client.connection.clone(),
            client.stop_heartbeat.clone(),
            client.at.clone(),
        );
        std::thread::spawn(move || {
            let mut last = Instant::now();
            while !stop.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(100));
                if last.elapsed() >= HEARTBEAT {
                    last = Instant::now();
                    if exchange(&connection, &at, "alive").is_err() {
                        return;
                    }
                }
            }
        });
        Ok(client)
    }

    fn ask(&self, line: &str) -> Result<String> {
        let answer = exchange(&self.connection, &self.at, line)?;
        match answer.strip_prefix("error ") {
            Some(why) => bail!("the rollouts' work queue: {why}"),
            None => Ok(answer),
        }
    }

    /// The next unit, or `None` when every unit has been handed out.
    pub fn next_unit(&self) -> Result<Option<usize>> {
        let answer = self.ask("next")?;
        match answer.strip_prefix("unit ") {
            Some(n) => {
                Ok(Some(n.parse().with_context(|| {
                    format!("the work queue answered {answer:?}")
                })?))
            }
            None if answer == "none" => Ok(None),
            None => bail!("the work queue answered {answer:?} to next"),
        }
    }

    /// Says this process is done, then waits (no time limit; see the module's liveness check)
    /// until every process is; returns how many units each took.
    pub fn finish_and_wait(self) -> Result<Vec<usize>> {
        self.ask("finished")?;
        loop {
            let answer = self.ask("wait")?;
            if let Some(counts) = answer.strip_prefix("all-finished ") {
                self.stop_heartbeat.store(true, Ordering::SeqCst);
                return counts
                    .split(',')
                    .map(|c| c.parse().context("the work queue's counts"))
                    .collect();
            }
            std::thread::sleep(POLL);
        }
    }
}

impl Drop for QueueClient {
    fn drop(&mut self) {
        self.stop_heartbeat.store(true, Ordering::SeqCst);
    }
}

/// Sends one line, reads the answer.
fn exchange(
    connection: &Mutex<(BufReader<TcpStream>, TcpStream)>,
    at: &str,
    line: &str,
) -> Result<String> {
    let mut guard = connection.lock().unwrap_or_else(|e| e.into_inner());
    let (reader, writer) = &mut *guard;
    let gone = || format!("the rollouts' work queue at {at} (process 0) went away");
    writer
        .write_all(format!("{line}\n").as_bytes())
        .with_context(gone)?;
    let mut answer = String::new();
    if reader.read_line(&mut answer).with_context(gone)? == 0 {
        return Err(anyhow!(gone()));
    }
    Ok(answer.trim().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn free_port() -> u16 {
        TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    }

    #[test]
    fn units_go_to_whoever_asks_and_everyone_learns_the_counts() {
        let port = free_port();
        let server = QueueServer::start("127.0.0.1", port, 7, 5, 2).unwrap();
        let a = QueueClient::connect("127.0.0.1", port, 7, 0, Duration::from_secs(5)).unwrap();
        let b = QueueClient::connect("127.0.0.1", port, 7, 1, Duration::from_secs(5)).unwrap();
        assert_eq!(a.next_unit().unwrap(), Some(0));
        assert_eq!(b.next_unit().unwrap(), Some(1));
        for unit in 2..5 {
            assert_eq!(b.next_unit().unwrap(), Some(unit));
        }
        assert_eq!(a.next_unit().unwrap(), None);
        assert_eq!(server.taken(), vec![1, 4]);
        let waiting = std::thread::spawn(move || a.finish_and_wait().unwrap());
        std::thread::sleep(Duration::from_millis(300));
        assert!(!waiting.is_finished(), "process 0 waits for process 1");
        assert_eq!(b.finish_and_wait().unwrap(), vec![1, 4]);
        assert_eq!(waiting.join().unwrap(), vec![1, 4]);
    }

    #[test]
    fn a_process_that_goes_away_is_named() {
        let port = free_port();
        let _server = QueueServer::start("127.0.0.1", port, 0, 3, 2).unwrap();
        let a = QueueClient::connect("127.0.0.1", port, 0, 0, Duration::from_secs(5)).unwrap();
        let b = QueueClient::connect("127.0.0.1", port, 0, 1, Duration::from_secs(5)).unwrap();
        assert_eq!(b.next_unit().unwrap(), Some(0));
        drop(b); // its connection closes before it finished
        let error = a.finish_and_wait().unwrap_err().to_string();
        assert!(error.contains("process 1"), "{error}");
    }

    #[test]
    fn a_client_of_another_round_is_refused() {
        let port = free_port();
        let _server = QueueServer::start("127.0.0.1", port, 3, 1, 1).unwrap();
        let refused = QueueClient::connect("127.0.0.1", port, 2, 0, Duration::from_secs(5));
        let error = format!("{:#}", refused.err().expect("refused"));
        assert!(error.contains("round"), "{error}");
    }
}
