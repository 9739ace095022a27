//! One command in a pod over the exec API's websocket (`pods/exec`, the v5 channel protocol and
//! v4 alike).
//!
//! ```text
//!   exec sh -c WRAPPER swerve-exec SECONDS SCRIPT STDIN_BYTES DIR
//!     stderr channel ◄── the wrapper's own lines: `swerve-ready` (it waits for the go), then
//!                        `swerve-pgid N` (the command's process group)
//!     stdin channel  ──► `go` and a newline once `swerve-ready` came, then exactly STDIN_BYTES
//!                        bytes (`head -c` hands them on: no end-of-stream signal needed, which
//!                        the v4 protocol lacks)
//!     stdout channel ◄── the command's stdout and stderr (2>&1), kept head and tail (Capture)
//!     status channel ◄── Success, or NonZeroExitCode with the exit code
//! ```
//!
//! The wrapper is docker's: `timeout -s KILL` (its own process group) runs the command; when it
//! ends, every process left in that group is killed. Past the client's deadline (the command's
//! timeout and a grace) or past the output kill limit, the client kills the group through a
//! second exec (`kill -KILL -N`) and drops the stream.
//!
//! Retries. Running an agent's command twice is not safe in general (`git apply`, `echo >>
//! file`), so an exec is sent again only when its command provably did not start:
//! - the request was answered 429 or 5xx, or its connection failed before the websocket
//!   upgrade was answered (the kubelet runs nothing before the streams are up);
//! - the stream dropped before the client sent `go`: the wrapper runs the command only after
//!   reading `go` from stdin (a dropped stream closes its stdin: it exits without running it).
//!
//! A stream that drops after `go` was sent is an infrastructure failure, whether or not output
//! came: the command may have run (partly). The episode then starts again in a fresh pod.

use super::lifecycle::Pods;
use super::pod::CONTAINER;
use super::retry::{backoff, CallError};
use crate::env::output::Capture;
use crate::env::{CommandOutput, Limits};
use anyhow::{anyhow, Result};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Status;
use kube::api::{AttachParams, AttachedProcess};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};

/// What `exec` runs: `$1` the time limit in seconds, `$2` the script, `$3` the bytes of stdin
/// after the `go` line, `$4` the working folder. The exit status is `timeout`'s (124 or 137 when
/// it fired), 125 when the folder is missing, 0 without a `go` (the client is gone). `read`
/// takes its line a byte at a time, leaving the rest of stdin to `head`.
pub const EXEC_WRAPPER: &str = concat!(
    "cd \"$4\" 2>&1 || exit 125; exec 3<&0; echo swerve-ready >&2; ",
    "read -r go <&3 || exit 0; [ \"$go\" = go ] || exit 0; ",
    "if [ \"$3\" -gt 0 ]; then ",
    "head -c \"$3\" <&3 | timeout -s KILL \"$1\" sh -c \"$2\" 2>&1 3<&- & ",
    "else timeout -s KILL \"$1\" sh -c \"$2\" </dev/null 2>&1 3<&- & fi; ",
    "p=$!; echo \"swerve-pgid $p\" >&2; wait $p; r=$?; kill -KILL -$p 2>/dev/null; exit $r"
);

/// The client's deadline past the command's timeout (the pod's `timeout` does the killing).
const CLIENT_GRACE: Duration = Duration::from_secs(10);

/// One command to run.
pub struct ExecRequest<'a> {
    pub script: &'a str,
    pub stdin: Option<&'a [u8]>,
    pub timeout: Duration,
    pub output_bytes: usize,
    /// The folder it runs in.
    pub dir: &'a str,
}

/// The exec's argument vector.
pub fn exec_argv(request: &ExecRequest<'_>) -> Vec<String> {
    let timeout = request.timeout;
    let seconds = timeout.as_secs() + u64::from(timeout.subsec_nanos() > 0);
    let stdin_bytes = request.stdin.map_or(0, <[u8]>::len);
    [
        "sh",
        "-c",
        EXEC_WRAPPER,
        "swerve-exec",
        &seconds.max(1).to_string(),
        request.script,
        &stdin_bytes.to_string(),
        request.dir,
    ]
    .map(String::from)
    .to_vec()
}

/// Why an exec gave no command result.
enum ExecFailure {
    /// The request failed before the websocket was up: the command did not start.
    NotStarted(CallError),
    /// The command may have run: the stream dropped, or the answer made no sense.
    AfterStart(String),
}

/// Runs `request` in the pod `name`, retrying only what cannot have started the command.
pub async fn exec(
    pods: &Pods,
    name: &str,
    request: &ExecRequest<'_>,
    limits: &Limits,
) -> Result<CommandOutput> {
    let mut attempt = 0;
    loop {
        let failure = match exec_once(pods, name, request, limits).await {
            Ok(out) => return Ok(out),
            Err(failure) => failure,
        };
        match failure {
            ExecFailure::NotStarted(e)
                if e.retryable() && attempt + 1 < pods.config.retry.attempts =>
            {
                tokio::time::sleep(backoff(&pods.config.retry, attempt)).await;
                attempt += 1;
            }
            ExecFailure::NotStarted(e) => {
                pods.check_alive(name).await?;
                return Err(anyhow!(
                    "exec in the pod {name} failed before the command started ({e}, {} tries): an infrastructure failure",
                    attempt + 1
                ));
            }
            ExecFailure::AfterStart(why) => {
                pods.check_alive(name).await?;
                return Err(anyhow!(
                    "exec in the pod {name}: {why}; not retried, the command may have run: an infrastructure failure"
                ));
            }
        }
    }
}

/// Opens the exec websocket of `request` in the pod `name`.
async fn connect(
    pods: &Pods,
    name: &str,
    request: &ExecRequest<'_>,
) -> Result<AttachedProcess, ExecFailure> {
    let params = AttachParams::default()
        .container(CONTAINER)
        .stdin(true)
        .stdout(true)
        .stderr(true)
        .tty(false)
        .max_stdout_buf_size(64 * 1024)
        .max_stdin_buf_size(64 * 1024);
    let connect = pods.api.exec(name, exec_argv(request), &params);
    match tokio::time::timeout(pods.config.api_timeout, connect).await {
        Ok(Ok(attached)) => Ok(attached),
        Ok(Err(e)) => Err(ExecFailure::NotStarted(CallError::from_kube(e))),
        // The upgrade may have been answered and the wrapper be waiting: it runs nothing
        // without the go, and dropping the request closes its stdin.
        Err(_) => Err(ExecFailure::NotStarted(CallError::Transport(format!(
            "the exec request had no answer within {:.0} s",
            pods.config.api_timeout.as_secs_f64()
        )))),
    }
}

async fn exec_once(
    pods: &Pods,
    name: &str,
    request: &ExecRequest<'_>,
    limits: &Limits,
) -> Result<CommandOutput, ExecFailure> {
    let started = Instant::now();
    let mut attached = connect(pods, name, request).await?;
    let streams = (
        attached.take_status(),
        attached.stdout(),
        attached.stderr(),
        attached.stdin(),
    );
    let (Some(status), Some(stdout), Some(stderr), Some(stdin)) = streams else {
        attached.abort();
        return Err(ExecFailure::AfterStart(
            "the exec stream lacks a channel".into(),
        ));
    };
    let control = Arc::new(Mutex::new(Vec::new()));
    let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
    let control_reader = tokio::spawn(read_control(stderr, control.clone(), ready_tx));
    let go = match tokio::time::timeout(pods.config.api_timeout, ready_rx).await {
        Ok(Ok(())) => true,
        // The wrapper ended before its ready line (its folder is missing): the status follows.
        Ok(Err(_)) => false,
        Err(_) => {
            attached.abort();
            return Err(ExecFailure::NotStarted(CallError::Transport(
                "the wrapper did not say it was ready".into(),
            )));
        }
    };
    // Held until the end: dropping it would close stdin (all of the websocket on v4).
    let (stdin_done, stdin_task) = feed_stdin(stdin, go.then_some(request.stdin.unwrap_or(&[])));
    let keep = request.output_bytes;
    let kill_bytes = limits.output_kill_bytes.max(keep as u64);
    let deadline = started + request.timeout + CLIENT_GRACE;
    let (capture, ended) = read_output(stdout, keep, kill_bytes, deadline).await;
    let (text, omitted_bytes) = capture.text();
    let mut out = CommandOutput {
        output: text,
        omitted_bytes,
        ..CommandOutput::default()
    };
    if ended != Ended::Eof {
        out.timed_out = ended == Ended::Deadline;
        out.output_overflow = ended == Ended::Overflow;
        let group = pgid(&control.lock().unwrap_or_else(|e| e.into_inner()));
        if let Some(group) = group {
            kill_group(pods, name, group).await;
        }
        attached.abort();
        out.elapsed = started.elapsed();
        return Ok(out);
    }
    let status = tokio::time::timeout(CLIENT_GRACE, status)
        .await
        .ok()
        .flatten();
    drop(stdin_done);
    let _ = stdin_task.await;
    let _ = control_reader.await;
    let joined = attached.join().await;
    let Some(status) = status else {
        let why = match joined {
            Err(e) => format!("the stream broke ({e})"),
            Ok(()) => "the stream ended without the command's exit status".to_string(),
        };
        return Err(if go {
            ExecFailure::AfterStart(why)
        } else {
            ExecFailure::NotStarted(CallError::Transport(format!("{why}, before the go")))
        });
    };
    out.exit_code = Some(exit_code(&status).map_err(ExecFailure::AfterStart)?);
    out.elapsed = started.elapsed();
    // `timeout -s KILL` ends with 137 (it kills itself with its group); 124 is its own code.
    if matches!(out.exit_code, Some(124 | 137)) && out.elapsed >= request.timeout {
        out.timed_out = true;
        out.exit_code = None;
    }
    Ok(out)
}

/// On a task: writes `go` and `stdin` (when `Some`), then holds the channel open until the
/// returned sender is dropped.
fn feed_stdin(
    mut writer: impl tokio::io::AsyncWrite + Unpin + Send + 'static,
    stdin: Option<&[u8]>,
) -> (
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<()>,
) {
    let bytes = stdin.map(|stdin| [b"go\n".as_slice(), stdin].concat());
    let (done, wait) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        if let Some(bytes) = bytes {
            // A command that does not read its input leaves it unread: not an error.
            let _ = writer.write_all(&bytes).await;
            let _ = writer.flush().await;
        }
        let _ = wait.await;
    });
    (done, task)
}

/// How reading the output ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ended {
    Eof,
    Deadline,
    Overflow,
}

async fn read_output(
    mut stdout: impl AsyncRead + Unpin,
    keep: usize,
    kill_bytes: u64,
    deadline: Instant,
) -> (Capture, Ended) {
    let mut capture = Capture::default();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match tokio::time::timeout_at(deadline.into(), stdout.read(&mut buf)).await {
            Err(_) => return (capture, Ended::Deadline),
            Ok(Ok(0) | Err(_)) => return (capture, Ended::Eof),
            Ok(Ok(n)) => {
                capture.push(&buf[..n], keep);
                if capture.total > kill_bytes {
                    return (capture, Ended::Overflow);
                }
            }
        }
    }
}

/// Reads the wrapper's control channel (its stderr) into `into`, the first 4 KiB, and says
/// `ready` once the wrapper's ready line came.
async fn read_control(
    mut stderr: impl AsyncRead + Unpin,
    into: Arc<Mutex<Vec<u8>>>,
    ready: tokio::sync::oneshot::Sender<()>,
) {
    let mut ready = Some(ready);
    let mut buf = [0u8; 1024];
    while let Ok(n) = stderr.read(&mut buf).await {
        if n == 0 {
            break;
        }
        let mut kept = into.lock().unwrap_or_else(|e| e.into_inner());
        let room = 4096usize.saturating_sub(kept.len());
        kept.extend_from_slice(&buf[..n.min(room)]);
        if String::from_utf8_lossy(&kept)
            .lines()
            .any(|l| l == "swerve-ready")
        {
            if let Some(ready) = ready.take() {
                let _ = ready.send(());
            }
        }
    }
}

/// The process group the wrapper announced.
fn pgid(control: &[u8]) -> Option<u32> {
    let text = String::from_utf8_lossy(control);
    text.lines()
        .find_map(|line| line.strip_prefix("swerve-pgid "))
        .and_then(|n| n.trim().parse().ok())
        .filter(|&n| n > 1)
}

/// Kills process group `group` in the pod (best effort: the pod's `timeout` and `close` are the
/// backstops).
async fn kill_group(pods: &Pods, name: &str, group: u32) {
    let argv = [
        "sh",
        "-c",
        "kill -KILL -\"$1\"",
        "swerve-kill",
        &group.to_string(),
    ];
    let params = AttachParams::default()
        .container(CONTAINER)
        .stdin(false)
        .stdout(true)
        .stderr(true);
    let kill = async {
        if let Ok(mut attached) = pods.api.exec(name, argv, &params).await {
            if let Some(status) = attached.take_status() {
                let _ = status.await;
            }
        }
    };
    let _ = tokio::time::timeout(pods.config.api_timeout, kill).await;
}

/// The exit code in an exec's status: 0 for Success, the `ExitCode` cause of NonZeroExitCode.
pub fn exit_code(status: &Status) -> std::result::Result<i32, String> {
    if status.status.as_deref() == Some("Success") {
        return Ok(0);
    }
    if status.reason.as_deref() == Some("NonZeroExitCode") {
        let code = status
            .details
            .iter()
            .flat_map(|d| d.causes.iter().flatten())
            .find(|c| c.reason.as_deref() == Some("ExitCode"))
            .and_then(|c| c.message.as_deref()?.trim().parse::<i32>().ok());
        if let Some(code) = code {
            return Ok(code);
        }
    }
    Err(format!(
        "the exec failed without an exit code (status {:?}, reason {:?}: {})",
        status.status.as_deref().unwrap_or(""),
        status.reason.as_deref().unwrap_or(""),
        status.message.as_deref().unwrap_or("")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn exit_codes_come_from_the_status_channel() {
        let ok: Status = serde_json::from_value(serde_json::json!({"status": "Success"})).unwrap();
        assert_eq!(exit_code(&ok), Ok(0));
        let failed: Status = serde_json::from_value(serde_json::json!({"status": "Failure",
            "reason": "NonZeroExitCode", "message": "command terminated with non-zero exit code",
            "details": {"causes": [{"reason": "ExitCode", "message": "3"}]}}))
        .unwrap();
        assert_eq!(exit_code(&failed), Ok(3));
        let broken: Status = serde_json::from_value(serde_json::json!({"status": "Failure",
            "reason": "InternalError", "message": "container not found"}))
        .unwrap();
        assert!(exit_code(&broken)
            .unwrap_err()
            .contains("container not found"));
    }

    #[test]
    fn the_wrapper_runs_the_command_with_its_stdin_in_its_folder() {
        let dir = tempfile::tempdir().unwrap();
        let request = ExecRequest {
            script: "pwd; cat; echo err >&2; exit 3",
            stdin: Some(b"in\n"),
            timeout: Duration::from_millis(1500),
            output_bytes: 1000,
            dir: dir.path().to_str().unwrap(),
        };
        let argv = exec_argv(&request);
        assert_eq!(argv[4], "2");
        let out = std::process::Command::new(&argv[0])
            .args(&argv[1..])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .and_then(|mut child| {
                // More than the command's share: only STDIN_BYTES reach it.
                child
                    .stdin
                    .take()
                    .unwrap()
                    .write_all(b"go\nin\nnot for it")?;
                child.wait_with_output()
            })
            .unwrap();
        assert_eq!(out.status.code(), Some(3));
        let expected = format!("{}\nin\nerr\n", dir.path().display());
        assert_eq!(String::from_utf8_lossy(&out.stdout), expected);
        assert!(
            pgid(&out.stderr).is_some(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(String::from_utf8_lossy(&out.stderr).starts_with("swerve-ready\n"));
        // Without the go (the stream dropped: stdin closed), the command does not run.
        let request = ExecRequest {
            script: "touch ran",
            ..request
        };
        let argv = exec_argv(&request);
        let status = std::process::Command::new(&argv[0])
            .args(&argv[1..])
            .stdin(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .unwrap();
        assert_eq!(status.code(), Some(0));
        assert!(!dir.path().join("ran").exists());
    }
}
