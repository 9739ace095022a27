//! The `docker` environment: one container per episode, from the task's image (SWE-bench and
//! SWE-rebench images keep the repository at `/testbed`), through the docker CLI.
//!
//! ```text
//!   start:  docker run -d --name swerve-RUN-EP --label swerve.run=RUN --label swerve.episode=EP
//!             --init --network none --cpus C --memory M --memory-swap M --pids-limit P
//!             --ulimit fsize=F:F --ulimit core=0 --cap-drop ALL
//!             --security-opt no-new-privileges --tmpfs /tmp:...,size=T [--storage-opt size=D]
//!             --workdir W --entrypoint sleep IMAGE infinity
//!           (a folder task: docker exec mkdir -p W, docker cp REPO/. NAME:W)
//!   run:    docker exec -i -w W NAME sh -c WRAPPER swerve-exec T 'ACTIVATE<newline>COMMAND'
//!           (WRAPPER: timeout -s KILL T sh -c SCRIPT, then its process group killed)
//!   copy:   docker cp HOST/. NAME:W          (resolved inside the container's root)
//!   close:  docker rm -f NAME, then docker inspect NAME must say it is gone
//!   sweep:  docker rm -f $(docker ps -aq --filter label=swerve.run=RUN)
//! ```
//!
//! The limits are the container's: memory (swap included) and process count for the whole
//! episode, CPUs, the largest file. The container has no network and no capabilities (`--cap-drop
//! ALL`: root in it cannot chown, open raw sockets, or bypass other users' file permissions; git,
//! pip and python need none of them), cannot gain privileges through setuid files, and runs
//! `docker-init` as PID 1 (`--init`) so orphans are reaped. Checked on Debian's docker.io 20.10.
//!
//! Disk: `--storage-opt size=` ([`DockerConfig::disk_bytes`]) works only on some storage drivers
//! (overlay2 over xfs with project quotas, btrfs, zfs; not overlay2 over ext4, where `docker run`
//! refuses it), so it is off by default. Without it the bound is per file (the fsize ulimit) and
//! `/tmp` is a tmpfs of [`DockerConfig::tmp_bytes`] (counted in the container's memory); the
//! writable layer as a whole is not bounded.
//!
//! Every CLI call has a time limit ([`DockerConfig::cli_timeout`]; `docker run`, which may pull
//! the image, [`DockerConfig::start_timeout`]): a hung daemon is an error naming the call. A
//! command past its timeout is killed inside the container by `timeout` (exit 124 or 137 reads
//! as `timed_out`), and the exec client by us. A container that is gone (killed from outside,
//! removed, the daemon restarted) makes `exec` an error saying so, not a command result.
//! Processes a command leaves in the background die with it, but those it moved to a session of
//! their own (`setsid cmd &`): they live until `close` (the pids limit bounds them).
//!
//! Podman is a drop-in (`DockerConfig::docker = "podman"`, `--docker-cli podman`): every flag
//! above is one podman's `run`, `exec`, `cp`, `rm`, `inspect` and `ps` accept.

use super::output::run_captured;
use super::{run_setup, CommandOutput, Environment, Limits, RepoSource, Sandbox, Task};
use anyhow::{bail, Context, Result};
use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Where a folder task's repository goes inside the container.
pub const FOLDER_WORKDIR: &str = "/workspace";

/// The label every container of a run carries (`swerve.run=RUN`); [`sweep`] finds them by it.
pub const RUN_LABEL: &str = "swerve.run";

#[derive(Clone, Debug)]
pub struct DockerConfig {
    pub limits: Limits,
    /// The CLI: `docker`, or `podman` (a drop-in).
    pub docker: PathBuf,
    /// Image for tasks that name none (folder tasks).
    pub default_image: String,
    /// CPUs an episode's container may use (`--cpus`).
    pub cpus: f64,
    /// Size of the tmpfs at `/tmp` (it counts towards the container's memory).
    pub tmp_bytes: u64,
    /// `--storage-opt size=`: bounds the container's writable layer, on storage drivers that
    /// support it only (see the module's comment); `None` leaves it out.
    pub disk_bytes: Option<u64>,
    /// This run's id: the `swerve.run` label of its containers and part of their names.
    pub run_id: String,
    /// Time limit of each CLI call but `docker run` and the commands themselves.
    pub cli_timeout: Duration,
    /// Time limit of `docker run` (it pulls an image that is not there).
    pub start_timeout: Duration,
}

impl DockerConfig {
    pub fn new(limits: Limits) -> Self {
        Self {
            limits,
            docker: PathBuf::from("docker"),
            default_image: "python:3.11-slim".to_string(),
            cpus: 2.0,
            tmp_bytes: 1 << 30,
            disk_bytes: None,
            run_id: new_run_id(),
            cli_timeout: Duration::from_secs(60),
            start_timeout: Duration::from_secs(600),
        }
    }
}

/// A run id unique on this machine: the process id and the start time.
pub fn new_run_id() -> String {
    let millis = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0);
    // Two environments of one process made in the same millisecond still differ.
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("{}-{millis}-{n}", std::process::id())
}

pub struct DockerEnvironment {
    config: DockerConfig,
}

impl DockerEnvironment {
    /// Checks that the CLI is there and a daemon answers (within `config.cli_timeout`).
    pub fn new(config: DockerConfig) -> Result<Self> {
        let out = cli(&config.docker, &["version".into()], config.cli_timeout)
            .context("the docker environment needs a docker CLI and a daemon")?;
        if !out.status.success() {
            bail!(
                "no docker daemon answers `{} version` ({}): start one, or use --env local",
                config.docker.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(Self { config })
    }

    pub fn config(&self) -> &DockerConfig {
        &self.config
    }

    /// The container name of an episode of run `run`.
    pub fn container_name(run: &str, episode: &str) -> String {
        let safe: String = format!("{run}-{episode}")
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || "_.-".contains(c) {
                    c
                } else {
                    '-'
                }
            })
            .collect();
        format!("swerve-{safe}")
    }

    /// [`Environment::start`] with an activation prefix: shell lines every command runs after,
    /// in the same shell (`. /opt/venv/bin/activate`; `sh` is dash in Debian images: no `source`).
    pub fn start_sandbox(
        &self,
        task: &Task,
        episode: &str,
        activate: Option<&str>,
    ) -> Result<DockerSandbox> {
        let image = task
            .image
            .clone()
            .unwrap_or_else(|| self.config.default_image.clone());
        let (workdir, folder) = match &task.repo {
            RepoSource::InImage { workdir } => (workdir.clone(), None),
            RepoSource::Folder(dir) => (FOLDER_WORKDIR.to_string(), Some(dir.clone())),
            RepoSource::Toy { .. } => bail!(
                "task {} is a toy task: it runs in process (`--tasks builtin:toy` picks the toy environment)",
                task.id
            ),
        };
        let name = Self::container_name(&self.config.run_id, episode);
        // A folder task's workdir does not exist in the image yet: podman refuses a missing
        // `--workdir` (docker creates it), so the container starts in `/` and it is made below.
        let start_dir = if folder.is_some() { "/" } else { &workdir };
        let args = run_args(&self.config, &name, episode, &image, start_dir);
        let docker = &self.config.docker;
        let out = match cli(docker, &args, self.config.start_timeout) {
            Ok(out) => out,
            Err(e) => {
                // The daemon may have created it before the client gave up.
                let _ = cli(docker, &rm_args(&name), self.config.cli_timeout);
                return Err(e.context(format!("task {}: starting a container of {image}", task.id)));
            }
        };
        if !out.status.success() {
            // A failed run can leave the container created (podman does).
            let _ = cli(docker, &rm_args(&name), self.config.cli_timeout);
            bail!(
                "task {}: docker run {image} failed: {}",
                task.id,
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        // From here on, dropping the sandbox (an error below) removes the container.
        let mut sandbox = DockerSandbox {
            docker: docker.clone(),
            name,
            workdir,
            limits: self.config.limits.clone(),
            cli_timeout: self.config.cli_timeout,
            activate: activate.map(str::to_string),
            closed: false,
        };
        if let Some(dir) = folder {
            // `cp DIR/. CONTAINER:/workspace` creates the folder from outside: inside, root has
            // no capabilities and an image's `/` may be read-only to it (podman keeps 0555).
            sandbox.copy_in(&dir)?;
        }
        run_setup(&mut sandbox, task, &self.config.limits)?;
        Ok(sandbox)
    }
}

/// `docker run` arguments for an episode's container (podman accepts them too).
pub fn run_args(
    config: &DockerConfig,
    name: &str,
    episode: &str,
    image: &str,
    workdir: &str,
) -> Vec<String> {
    let limits = &config.limits;
    let memory = limits.memory_bytes.to_string();
    let mut args: Vec<String> = [
        "run",
        "-d",
        "--name",
        name,
        "--label",
        &format!("{RUN_LABEL}={}", config.run_id),
        "--label",
        &format!("swerve.episode={episode}"),
        "--init",
        "--network",
        "none",
        "--cpus",
        &format!("{}", config.cpus),
        "--memory",
        &memory,
        "--memory-swap",
        &memory,
        "--pids-limit",
        &limits.processes.to_string(),
        "--ulimit",
        &format!("fsize={0}:{0}", limits.file_bytes),
        "--ulimit",
        "core=0",
        // Set explicitly: podman otherwise asks for limits some hosts refuse (the process count
        // is bounded by --pids-limit; this only keeps the runtime's default out).
        "--ulimit",
        "nofile=16384:16384",
        "--ulimit",
        "nproc=32768:32768",
        "--cap-drop",
        "ALL",
        "--security-opt",
        "no-new-privileges",
        "--tmpfs",
        &format!(
            "/tmp:rw,exec,nosuid,nodev,mode=1777,size={}",
            config.tmp_bytes
        ),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    if let Some(disk) = config.disk_bytes {
        args.extend(["--storage-opt".into(), format!("size={disk}")]);
    }
    args.extend(
        [
            "--workdir",
            workdir,
            "--entrypoint",
            "sleep",
            image,
            "infinity",
        ]
        .map(String::from),
    );
    args
}

/// The script `sh -c` runs: the activation lines, then the command, untouched.
pub fn command_script(activate: Option<&str>, command: &str) -> String {
    match activate {
        Some(prefix) if !prefix.trim().is_empty() => format!("{prefix}\n{command}"),
        _ => command.to_string(),
    }
}

/// What `docker exec` runs: `timeout` (its own process group) in the background, stdin handed
/// to it explicitly, then every process left in that group killed: nothing the command started
/// outlives it, but what it moved to a session of its own (`setsid`). `$1` is the time limit,
/// `$2` the script; the exit status is `timeout`'s (124 or 137 when it fired).
const EXEC_WRAPPER: &str =
    "exec 3<&0; timeout -s KILL \"$1\" sh -c \"$2\" <&3 3<&- & p=$!; wait $p; r=$?; kill -KILL -$p 2>/dev/null; exit $r";

/// `docker exec` arguments for one command (killed in the container past `timeout`).
pub fn exec_args(name: &str, workdir: &str, script: &str, timeout: Duration) -> Vec<String> {
    let seconds = timeout.as_secs() + u64::from(timeout.subsec_nanos() > 0);
    [
        "exec",
        "-i",
        "-w",
        workdir,
        name,
        "sh",
        "-c",
        EXEC_WRAPPER,
        "swerve-exec",
        &seconds.max(1).to_string(),
        script,
    ]
    .map(String::from)
    .to_vec()
}

fn rm_args(name: &str) -> Vec<String> {
    ["rm", "-f", name].map(String::from).to_vec()
}

impl Environment for DockerEnvironment {
    fn name(&self) -> &'static str {
        "docker"
    }

    fn limits(&self) -> &Limits {
        &self.config.limits
    }

    fn start(&self, task: &Task, episode: &str) -> Result<Box<dyn Sandbox>> {
        Ok(Box::new(self.start_sandbox(
            task,
            episode,
            task.activate.as_deref(),
        )?))
    }
}

/// Removes the containers of run `run` (every swerve container when `None`): what a crashed run
/// left behind. Returns how many it removed.
pub fn sweep(config: &DockerConfig, run: Option<&str>) -> Result<usize> {
    let filter = match run {
        Some(run) => format!("label={RUN_LABEL}={run}"),
        None => format!("label={RUN_LABEL}"),
    };
    let list = ["ps", "-aq", "--filter", &filter]
        .map(String::from)
        .to_vec();
    let out = cli(&config.docker, &list, config.cli_timeout)?;
    if !out.status.success() {
        bail!(
            "`docker ps --filter {filter}` failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let ids: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .map(str::to_string)
        .collect();
    if ids.is_empty() {
        return Ok(0);
    }
    let mut args = vec!["rm".to_string(), "-f".to_string()];
    args.extend(ids.iter().cloned());
    let out = cli(&config.docker, &args, config.cli_timeout)?;
    if !out.status.success() {
        bail!(
            "removing the containers of {filter} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(ids.len())
}

/// "docker rm -f NAME" for messages (arguments past the fourth elided).
fn describe_call(docker: &Path, args: &[String]) -> String {
    let mut words = vec![docker.display().to_string()];
    words.extend(args.iter().take(4).cloned());
    if args.len() > 4 {
        words.push("...".into());
    }
    words.join(" ")
}

/// Kills `child`'s process group (it leads one: the CLI and anything it started).
fn kill_group(child: &mut Child) {
    if let Ok(pid) = i32::try_from(child.id()) {
        // SAFETY: kill(2) with a negative pid signals that process group; no memory involved.
        unsafe {
            libc::kill(-pid, libc::SIGKILL);
        }
    }
    let _ = child.kill();
}

/// Reads a pipe to its end on a thread; the receiver gets the bytes.
fn read_on_thread(pipe: Option<impl Read + Send + 'static>) -> mpsc::Receiver<Vec<u8>> {
    let (tx, rx) = mpsc::channel();
    if let Some(mut pipe) = pipe {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            let _ = pipe.read_to_end(&mut bytes);
            let _ = tx.send(bytes);
        });
    }
    rx
}

/// Runs one CLI call to its end, or kills it past `timeout`: then an error naming the call.
pub fn cli(docker: &Path, args: &[String], timeout: Duration) -> Result<Output> {
    let what = describe_call(docker, args);
    let mut child = Command::new(docker)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .with_context(|| format!("`{what}` did not start (is the CLI installed?)"))?;
    let stdout = read_on_thread(child.stdout.take());
    let stderr = read_on_thread(child.stderr.take());
    let started = Instant::now();
    let mut pause = Duration::from_millis(1);
    let status = loop {
        if let Some(status) = child
            .try_wait()
            .with_context(|| format!("waiting for `{what}`"))?
        {
            break status;
        }
        if started.elapsed() >= timeout {
            kill_group(&mut child);
            let _ = child.wait();
            bail!(
                "`{what}` did not answer within {:.0} s (is the daemon hung?)",
                timeout.as_secs_f64()
            );
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(20));
    };
    // A process the CLI left behind may hold the pipes open: wait for them a little only.
    let grace = Duration::from_secs(2);
    Ok(Output {
        status,
        stdout: stdout.recv_timeout(grace).unwrap_or_default(),
        stderr: stderr.recv_timeout(grace).unwrap_or_default(),
    })
}

pub struct DockerSandbox {
    docker: PathBuf,
    name: String,
    workdir: String,
    limits: Limits,
    cli_timeout: Duration,
    /// Shell lines run before every command, in its shell (a task's environment activation).
    activate: Option<String>,
    closed: bool,
}

impl DockerSandbox {
    /// The container's name.
    pub fn container(&self) -> &str {
        &self.name
    }

    fn call(&self, args: &[String]) -> Result<Output> {
        cli(&self.docker, args, self.cli_timeout)
    }

    /// `Ok(())` while the container runs; else an error saying it is gone and why.
    pub fn check_alive(&self) -> Result<()> {
        let args = [
            "inspect",
            "-f",
            "{{.State.Status}} {{.State.ExitCode}}",
            &self.name,
        ]
        .map(String::from)
        .to_vec();
        let out = self.call(&args)?;
        let state = String::from_utf8_lossy(&out.stdout).trim().to_string();
        if out.status.success() && state.starts_with("running") {
            return Ok(());
        }
        let why = if out.status.success() {
            format!("its state is {state:?}")
        } else {
            String::from_utf8_lossy(&out.stderr).trim().to_string()
        };
        bail!(
            "the container {} is gone ({why}): an infrastructure failure, not a command result",
            self.name
        )
    }
}

impl Sandbox for DockerSandbox {
    fn workdir(&self) -> &str {
        &self.workdir
    }

    fn limits(&self) -> &Limits {
        &self.limits
    }

    fn exec(
        &mut self,
        command: &str,
        stdin: Option<&[u8]>,
        timeout: Duration,
        output_bytes: usize,
    ) -> Result<CommandOutput> {
        if self.closed {
            bail!("the container {} is removed", self.name);
        }
        let script = command_script(self.activate.as_deref(), command);
        let mut c = Command::new(&self.docker);
        c.args(exec_args(&self.name, &self.workdir, &script, timeout))
            .process_group(0);
        // The client gets a little longer than the in-container timeout, which does the killing.
        let client_timeout = timeout + Duration::from_secs(10);
        let mut out = run_captured(
            c,
            stdin,
            client_timeout,
            output_bytes,
            &self.limits,
            &kill_group,
        )?;
        if out.exit_code != Some(0) {
            // A failed command or a dead container (docker exec says so with its own exit code).
            self.check_alive()?;
        }
        // `timeout -s KILL` ends with 137 (it kills itself with its group); 124 is its own code.
        if matches!(out.exit_code, Some(124 | 137)) && out.elapsed >= timeout {
            out.timed_out = true;
            out.exit_code = None;
        }
        Ok(out)
    }

    fn copy_in(&mut self, host_dir: &Path) -> Result<()> {
        if !host_dir.is_dir() {
            bail!("{} is not a folder", host_dir.display());
        }
        let source = format!("{}/.", host_dir.display());
        let target = format!("{}:{}", self.name, self.workdir);
        let out = self.call(&["cp".into(), source, target])?;
        if !out.status.success() {
            bail!(
                "docker cp {} into {} failed: {}",
                host_dir.display(),
                self.name,
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(())
    }

    fn close(&mut self) -> Result<()> {
        if self.closed {
            return Ok(());
        }
        self.closed = true;
        let out = self.call(&rm_args(&self.name))?;
        let stderr = String::from_utf8_lossy(&out.stderr).trim().to_string();
        if !out.status.success() && !says_missing(&stderr) {
            bail!("docker rm -f {} failed: {stderr}", self.name);
        }
        let inspect = ["inspect", "-f", "{{.Id}}", &self.name]
            .map(String::from)
            .to_vec();
        let out = self.call(&inspect)?;
        let stderr = String::from_utf8_lossy(&out.stderr).trim().to_string();
        if out.status.success() {
            bail!(
                "the container {} is still there after docker rm -f",
                self.name
            );
        }
        if !says_missing(&stderr) {
            bail!("cannot confirm that {} is removed: {stderr}", self.name);
        }
        Ok(())
    }
}

/// Whether a CLI error says the container does not exist (docker's and podman's wordings).
fn says_missing(stderr: &str) -> bool {
    let s = stderr.to_ascii_lowercase();
    s.contains("no such container")
        || s.contains("no such object")
        || s.contains("no container with")
}

impl Drop for DockerSandbox {
    fn drop(&mut self) {
        let _ = self.close();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_cli_is_a_clear_error() {
        let config = DockerConfig {
            docker: PathBuf::from("/nonexistent/docker"),
            ..DockerConfig::new(Limits::default())
        };
        let err = format!("{:#}", DockerEnvironment::new(config).err().unwrap());
        assert!(err.contains("docker CLI"), "{err}");
        assert!(err.contains("/nonexistent/docker version"), "{err}");
    }

    #[test]
    fn scripts_keep_the_command_whole() {
        assert_eq!(command_script(None, "ls"), "ls");
        assert_eq!(command_script(Some(" "), "ls"), "ls");
        assert_eq!(
            command_script(Some(". /venv/bin/activate"), "a && b; c <<EOF\nx\nEOF"),
            ". /venv/bin/activate\na && b; c <<EOF\nx\nEOF"
        );
    }
}
