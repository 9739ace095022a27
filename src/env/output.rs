//! Running one sandbox command with a wall-clock limit and bounded output.
//!
//! ```text
//!   child ──stdout+stderr (one pipe)──► reader thread: head [..keep/2] + tail ring [keep/2]
//!     ▲                                     │ total > kill_bytes: flag, stop reading
//!     └── killed by the waiter on timeout or flag (the sandbox's kill takes every process)
//! ```
//!
//! The reader never blocks the child for long: it keeps draining (and counting) past what it
//! keeps, so a chatty command only ends by itself, by its timeout, or past the kill limit.

use super::{CommandOutput, Limits};
use anyhow::{Context, Result};
use std::collections::VecDeque;
use std::io::{PipeReader, Read, Write};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Receiver;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Head, tail and count of a stream too long to keep whole.
#[derive(Default)]
pub(crate) struct Capture {
    head: Vec<u8>,
    tail: VecDeque<u8>,
    /// Bytes pushed in all.
    pub(crate) total: u64,
}

impl Capture {
    /// Adds `bytes`, keeping `keep` bytes of all (the first half, the last half).
    pub(crate) fn push(&mut self, bytes: &[u8], keep: usize) {
        self.total += bytes.len() as u64;
        let head_room = (keep / 2).saturating_sub(self.head.len());
        let (to_head, rest) = bytes.split_at(head_room.min(bytes.len()));
        self.head.extend_from_slice(to_head);
        let tail_keep = keep - keep / 2;
        if rest.len() >= tail_keep {
            self.tail.clear();
            self.tail.extend(&rest[rest.len() - tail_keep..]);
        } else {
            self.tail.extend(rest);
            while self.tail.len() > tail_keep {
                self.tail.pop_front();
            }
        }
    }

    /// The kept text, with a marker where bytes were dropped.
    pub(crate) fn text(&self) -> (String, u64) {
        let kept = (self.head.len() + self.tail.len()) as u64;
        let omitted = self.total - kept;
        let mut bytes = self.head.clone();
        if omitted > 0 {
            bytes.extend_from_slice(
                format!("\n[... {omitted} bytes of output omitted ...]\n").as_bytes(),
            );
        }
        bytes.extend(self.tail.iter());
        (String::from_utf8_lossy(&bytes).into_owned(), omitted)
    }
}

/// Spawns `command` (stdout and stderr joined), feeds `stdin`, and waits at most `timeout`.
/// `kill` ends the child and everything it started (the caller knows how for its sandbox).
pub fn run_captured(
    command: Command,
    stdin: Option<&[u8]>,
    timeout: Duration,
    output_bytes: usize,
    limits: &Limits,
    kill: &dyn Fn(&mut Child),
) -> Result<CommandOutput> {
    let started = Instant::now();
    let (mut child, reader) = spawn_joined(command, stdin.is_some())?;
    let feeder = feed_stdin(&mut child, stdin);
    let kill_bytes = limits.output_kill_bytes.max(output_bytes as u64);
    let output = OutputReader::start(reader, output_bytes, kill_bytes);
    let (status, timed_out, mut killed_for_output) =
        wait_or_kill(&mut child, started, timeout, &output.overflow, kill)?;
    // Every writer is gone with the sandbox's processes; a short wait covers the last read.
    let _ = output.done.recv_timeout(Duration::from_secs(5));
    // The reader may have stopped first and the command died of the closed pipe (SIGPIPE).
    if output.overflow.load(Ordering::SeqCst) && !timed_out {
        killed_for_output = true;
    }
    if let Some(feeder) = feeder {
        let _ = feeder.join();
    }
    let (text, omitted_bytes) = output
        .capture
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .text();
    Ok(CommandOutput {
        output: text,
        exit_code: if timed_out || killed_for_output {
            None
        } else {
            status.code()
        },
        timed_out,
        output_overflow: killed_for_output,
        omitted_bytes,
        elapsed: started.elapsed(),
        ends_episode: false,
    })
}

/// Spawns `command` with stdout and stderr on one pipe (stdin piped when `piped_stdin`, else
/// null); returns the child and the pipe's read end.
fn spawn_joined(mut command: Command, piped_stdin: bool) -> Result<(Child, PipeReader)> {
    let (reader, writer) = std::io::pipe().context("creating an output pipe")?;
    command
        .stdout(writer.try_clone().context("duplicating the output pipe")?)
        .stderr(writer)
        .stdin(if piped_stdin {
            Stdio::piped()
        } else {
            Stdio::null()
        });
    let child = command
        .spawn()
        .with_context(|| format!("cannot start {:?}", command.get_program()))?;
    // The command holds the pipe's write ends: drop them, or the reader never sees EOF.
    drop(command);
    Ok((child, reader))
}

/// Writes `stdin` into the child's input on a thread of its own.
fn feed_stdin(child: &mut Child, stdin: Option<&[u8]>) -> Option<JoinHandle<()>> {
    match (stdin, child.stdin.take()) {
        (Some(bytes), Some(mut pipe)) => {
            let bytes = bytes.to_vec();
            // A command that does not read its input ends with the pipe unread: not an error.
            Some(std::thread::spawn(move || {
                let _ = pipe.write_all(&bytes);
            }))
        }
        _ => None,
    }
}

/// The reader thread's results: what it kept, whether the output passed the kill limit (then it
/// stopped reading), and a message when it has stopped.
struct OutputReader {
    capture: Arc<Mutex<Capture>>,
    overflow: Arc<AtomicBool>,
    done: Receiver<()>,
}

impl OutputReader {
    /// Drains `reader` on a thread, keeping `keep` bytes (head and tail), until EOF or past
    /// `kill_bytes` in all.
    fn start(mut reader: PipeReader, keep: usize, kill_bytes: u64) -> Self {
        let capture = Arc::new(Mutex::new(Capture::default()));
        let overflow = Arc::new(AtomicBool::new(false));
        let (done_tx, done) = std::sync::mpsc::channel::<()>();
        {
            let capture = capture.clone();
            let overflow = overflow.clone();
            std::thread::spawn(move || {
                let mut buf = vec![0u8; 64 * 1024];
                loop {
                    match reader.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => {
                            let mut c = capture.lock().unwrap_or_else(|e| e.into_inner());
                            c.push(&buf[..n], keep);
                            if c.total > kill_bytes {
                                overflow.store(true, Ordering::SeqCst);
                                break;
                            }
                        }
                    }
                }
                let _ = done_tx.send(());
            });
        }
        Self {
            capture,
            overflow,
            done,
        }
    }
}

/// Polls the child until it exits, killing it once when its output overflows or its time is
/// up. Returns its status, whether it timed out, and whether it was killed for its output.
fn wait_or_kill(
    child: &mut Child,
    started: Instant,
    timeout: Duration,
    overflow: &AtomicBool,
    kill: &dyn Fn(&mut Child),
) -> Result<(ExitStatus, bool, bool)> {
    let mut timed_out = false;
    let mut killed_for_output = false;
    let mut poll = Duration::from_millis(1);
    let status = loop {
        if let Some(status) = child.try_wait().context("waiting for a sandbox command")? {
            break status;
        }
        if overflow.load(Ordering::SeqCst) && !killed_for_output {
            killed_for_output = true;
            kill(child);
        } else if started.elapsed() >= timeout && !timed_out && !killed_for_output {
            timed_out = true;
            kill(child);
        }
        std::thread::sleep(poll);
        poll = (poll * 2).min(Duration::from_millis(20));
    };
    Ok((status, timed_out, killed_for_output))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(script: &str) -> Command {
        let mut c = Command::new("sh");
        c.arg("-c").arg(script);
        c
    }

    fn kill(child: &mut Child) {
        let _ = child.kill();
    }

    #[test]
    fn keeps_head_and_tail_with_a_marker() {
        let mut c = Capture::default();
        for chunk in [b"abcdef".as_slice(), b"ghij", b"klmnop"] {
            c.push(chunk, 6);
        }
        let (text, omitted) = c.text();
        assert_eq!(omitted, 10);
        assert_eq!(text, "abc\n[... 10 bytes of output omitted ...]\nnop");
        let mut short = Capture::default();
        short.push(b"hi", 6);
        assert_eq!(short.text(), ("hi".to_string(), 0));
    }

    #[test]
    fn exit_codes_stdin_and_interleaving() {
        let limits = Limits::default();
        let out = run_captured(
            sh("cat; echo err >&2; exit 3"),
            Some(b"in\n"),
            Duration::from_secs(10),
            limits.output_bytes,
            &limits,
            &kill,
        )
        .unwrap();
        assert_eq!(out.output, "in\nerr\n");
        assert_eq!(out.exit_code, Some(3));
        assert!(!out.timed_out && !out.success());
    }

    #[test]
    fn timeout_and_overflow_kill() {
        let limits = Limits {
            output_bytes: 100,
            output_kill_bytes: 1 << 20,
            ..Limits::default()
        };
        let out = run_captured(
            sh("exec sleep 30"),
            None,
            Duration::from_millis(200),
            100,
            &limits,
            &kill,
        )
        .unwrap();
        assert!(out.timed_out && out.exit_code.is_none());
        assert!(out.elapsed < Duration::from_secs(5));
        let out = run_captured(
            sh("exec yes"),
            None,
            Duration::from_secs(30),
            100,
            &limits,
            &kill,
        )
        .unwrap();
        assert!(out.output_overflow && !out.timed_out, "{out:?}");
        assert!(out.output.len() < 200, "{}", out.output.len());
        assert!(out.output.contains("bytes of output omitted"));
    }
}
