//! Environments: where an agent's commands run. One trait, several sandboxes.
//!
//! ```text
//!   Environment::start(task) ──► Sandbox (one per episode: a fresh copy of the repo)
//!        │                          ├─ run(command, stdin, timeout) ──► CommandOutput
//!        │                          │    (agent actions; setup commands before the episode)
//!        │                          ├─ copy_in(host folder)   a task's tests before grading
//!        │                          └─ close()                every process gone, workspace deleted
//!        └─ grading (grading.rs): the agent's diff (diff.rs) applied to a fresh sandbox of the
//!           task, its tests restored over it, the tests run hardened, verdict per test (logs.rs)
//! ```
//!
//! - [`local::LocalEnvironment`]: bubblewrap on this machine (read-only system, no network, own
//!   PID namespace, per-command timeout, memory / process / file-size limits).
//! - [`docker::DockerEnvironment`]: one container per episode from the task's image
//!   (SWE-bench / SWE-rebench), same limits through the docker CLI.
//! - [`kubernetes::KubernetesEnvironment`]: one pod per episode (as the published system ran)
//!   through the Kubernetes API (kube-rs): the pod watched until Running, commands over the exec
//!   API's websocket with docker's wrapper, files in as a tar stream over exec, the pod deleted
//!   with grace period 0 and confirmed gone, leftovers swept by label (docs/kubernetes.md).
//!
//! Every command runs in a fresh shell in the workspace (as mini-swe-agent does): `cd` and
//! variables do not carry over, and nothing it started outlives it.

pub mod builtin;
pub mod diff;
pub mod docker;
pub mod envs;
pub mod flags;
pub mod grading;
pub mod kubernetes;
pub mod local;
pub mod logs;
pub mod output;
pub mod prepare;
pub mod repos;
pub mod task;
pub mod toy;

use anyhow::{bail, Result};
pub use grading::GradeResult;
use std::path::Path;
use std::time::Duration;
pub use task::{load_tasks, Grading, HarnessRules, RepoSource, Task};

/// Resource limits of one episode's commands.
#[derive(Clone, Debug, PartialEq)]
pub struct Limits {
    /// Wall-clock limit of one command; past it every process the command started is killed.
    pub command_timeout: Duration,
    /// Bytes of a command's output kept for the observation (head and tail; the middle is cut
    /// with a marker saying how much).
    pub output_bytes: usize,
    /// A command printing more than this in all is killed (the observation says so).
    pub output_kill_bytes: u64,
    /// Address space of each process (local) or the container's memory (docker).
    pub memory_bytes: u64,
    /// Processes and threads the episode may have at once.
    pub processes: u64,
    /// Largest file a command may write.
    pub file_bytes: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            command_timeout: Duration::from_secs(120),
            output_bytes: 16 * 1024,
            output_kill_bytes: 64 << 20,
            memory_bytes: 8 << 30,
            processes: 512,
            file_bytes: 1 << 30,
        }
    }
}

/// What a command left: its output (stdout and stderr interleaved, truncated) and how it ended.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CommandOutput {
    pub output: String,
    /// The exit status; `None` when it was killed (timeout, too much output) or died by a signal.
    pub exit_code: Option<i32>,
    pub timed_out: bool,
    /// Killed for printing more than [`Limits::output_kill_bytes`].
    pub output_overflow: bool,
    /// Bytes of output dropped from the middle.
    pub omitted_bytes: u64,
    pub elapsed: Duration,
    /// The environment ends the episode here, as a `submit` would (the toy's winning guess).
    pub ends_episode: bool,
}

impl CommandOutput {
    pub fn success(&self) -> bool {
        self.exit_code == Some(0) && !self.timed_out && !self.output_overflow
    }
}

/// A place where one episode's commands run.
pub trait Sandbox: Send {
    /// The workspace as commands see it (`/workspace`, or a SWE-bench image's `/testbed`).
    fn workdir(&self) -> &str;
    /// The limits its commands run under.
    fn limits(&self) -> &Limits;
    /// Runs `command` with `sh -c` in the workspace, `stdin` fed to it, within `timeout`,
    /// keeping `output_bytes` of its output.
    fn exec(
        &mut self,
        command: &str,
        stdin: Option<&[u8]>,
        timeout: Duration,
        output_bytes: usize,
    ) -> Result<CommandOutput>;
    /// [`Sandbox::exec`] keeping the limits' share of output (what an observation shows).
    fn run(
        &mut self,
        command: &str,
        stdin: Option<&[u8]>,
        timeout: Duration,
    ) -> Result<CommandOutput> {
        let keep = self.limits().output_bytes;
        self.exec(command, stdin, timeout, keep)
    }
    /// Copies a host folder's contents over the workspace root (`tests/x.py` lands at
    /// `WORKDIR/tests/x.py`), replacing files that exist, through the sandbox's own view of the
    /// workspace (a symlink the agent planted cannot point the copy outside it).
    fn copy_in(&mut self, host_dir: &Path) -> Result<()>;
    /// Ends the episode: every process it started is gone, its workspace removed. Idempotent;
    /// dropping a sandbox closes it too.
    fn close(&mut self) -> Result<()>;
}

/// A kind of sandbox, started once per episode.
pub trait Environment: Send + Sync {
    fn name(&self) -> &'static str;
    /// A fresh sandbox for `task`, its setup commands run. `episode` is unique in this run and
    /// names the sandbox's resources (container, folder).
    fn start(&self, task: &Task, episode: &str) -> Result<Box<dyn Sandbox>>;
    fn limits(&self) -> &Limits;
}

/// Runs `task`'s setup commands; the first that fails is an error with its output.
pub fn run_setup(sandbox: &mut dyn Sandbox, task: &Task, limits: &Limits) -> Result<()> {
    for (i, command) in task.setup.iter().enumerate() {
        let out = sandbox.run(command, None, limits.command_timeout)?;
        if !out.success() {
            bail!(
                "task {} ({}): setup[{i}] `{command}` failed ({}):\n{}",
                task.id,
                task.origin,
                describe_end(&out),
                out.output
            );
        }
    }
    Ok(())
}

/// Grades a command task (the toy) in its own sandbox: the command decides (exit 0 within the
/// task's timeout = resolved). Tasks with tests are graded in a fresh sandbox
/// ([`grading::grade_fresh`]).
pub fn grade_in_place(sandbox: &mut dyn Sandbox, task: &Task) -> Result<GradeResult> {
    let Grading::Command { test_command } = &task.grading else {
        bail!(
            "task {} ({}) has tests: it is graded in a fresh sandbox, not in place",
            task.id,
            task.origin
        );
    };
    let output = sandbox.run(test_command, None, Duration::from_secs(task.timeout_s))?;
    Ok(GradeResult {
        resolved: output.success(),
        verdict: None,
        failure: None,
        output,
        dropped: Vec::new(),
        flags: Vec::new(),
        cleanup_error: None,
    })
}

/// `s` as one single-quoted shell word.
pub fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// At most `max_bytes` of text that came from the agent's sandbox, for a message.
pub(crate) fn agent_text(text: &str, max_bytes: usize) -> String {
    let text = text.trim();
    if text.len() <= max_bytes {
        return text.to_string();
    }
    let mut end = max_bytes;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}[... cut]", &text[..end])
}

/// "exit 1", "timed out after 120 s", ... for messages and observations.
pub fn describe_end(out: &CommandOutput) -> String {
    if out.timed_out {
        format!("timed out after {:.0} s", out.elapsed.as_secs_f64())
    } else if out.output_overflow {
        "killed for printing too much output".to_string()
    } else {
        match out.exit_code {
            Some(code) => format!("exit {code}"),
            None => "killed by a signal".to_string(),
        }
    }
}

/// Parses `--env local|docker|kubernetes`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EnvKind {
    Local,
    Docker,
    Kubernetes,
}

impl std::str::FromStr for EnvKind {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "local" => Ok(Self::Local),
            "docker" => Ok(Self::Docker),
            "kubernetes" => Ok(Self::Kubernetes),
            other => Err(format!(
                "unknown environment {other:?} (expected local, docker or kubernetes)"
            )),
        }
    }
}
