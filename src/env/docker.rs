//! The `docker` environment: one container per episode, from the task's image (SWE-bench and
//! SWE-rebench images keep the repository at `/testbed`), through the docker CLI.
//!
//! ```text
//!   start:  docker run -d --name swerve-EP --network none --memory M --memory-swap M
//!             --pids-limit P --ulimit fsize=F --ulimit core=0 --workdir W
//!             --entrypoint sleep IMAGE infinity
//!           (a folder task: docker exec mkdir -p W, docker cp REPO/. swerve-EP:W)
//!   run:    docker exec -i -w W swerve-EP timeout -s KILL T sh -c COMMAND
//!   copy:   docker cp HOST/. swerve-EP:W          (resolved inside the container's root)
//!   close:  docker rm -f swerve-EP                (every process of the episode with it)
//! ```
//!
//! The limits are the container's (memory and process count for the whole episode, which the
//! local sandbox can only approximate). A command past its timeout is killed inside the
//! container by `timeout`, and the client by us.

use super::output::run_captured;
use super::task::shell_quote;
use super::{run_setup, CommandOutput, Environment, Limits, RepoSource, Sandbox, Task};
use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::Duration;

/// Where a folder task's repository goes inside the container.
pub const FOLDER_WORKDIR: &str = "/workspace";

#[derive(Clone, Debug)]
pub struct DockerConfig {
    pub limits: Limits,
    /// The docker CLI.
    pub docker: PathBuf,
    /// Image for tasks that name none (folder tasks).
    pub default_image: String,
}

impl DockerConfig {
    pub fn new(limits: Limits) -> Self {
        Self {
            limits,
            docker: PathBuf::from("docker"),
            default_image: "python:3.11-slim".to_string(),
        }
    }
}

pub struct DockerEnvironment {
    config: DockerConfig,
}

impl DockerEnvironment {
    /// Checks that the CLI is there and a daemon answers.
    pub fn new(config: DockerConfig) -> Result<Self> {
        let out = Command::new(&config.docker)
            .args(["version", "--format", "{{.Server.Version}}"])
            .output()
            .with_context(|| {
                format!(
                    "the docker environment needs the docker CLI (`{}` did not start)",
                    config.docker.display()
                )
            })?;
        if !out.status.success() {
            bail!(
                "no docker daemon answers `{} version` ({}): start one, or use --env local",
                config.docker.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(Self { config })
    }

    /// The container name of an episode.
    pub fn container_name(episode: &str) -> String {
        let safe: String = episode
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
}

/// `docker run` arguments for an episode's container.
pub fn run_args(name: &str, image: &str, workdir: &str, limits: &Limits) -> Vec<String> {
    let mut args: Vec<String> = vec![
        "run".into(),
        "-d".into(),
        "--name".into(),
        name.into(),
        "--network".into(),
        "none".into(),
        "--memory".into(),
        limits.memory_bytes.to_string(),
        "--memory-swap".into(),
        limits.memory_bytes.to_string(),
        "--pids-limit".into(),
        limits.processes.to_string(),
        "--ulimit".into(),
        format!("fsize={}", limits.file_bytes),
        "--ulimit".into(),
        "core=0".into(),
        "--security-opt".into(),
        "no-new-privileges".into(),
        "--workdir".into(),
        workdir.into(),
        "--entrypoint".into(),
        "sleep".into(),
    ];
    args.push(image.into());
    args.push("infinity".into());
    args
}

/// `docker exec` arguments for one command (killed in the container past `timeout`).
pub fn exec_args(name: &str, workdir: &str, command: &str, timeout: Duration) -> Vec<String> {
    vec![
        "exec".into(),
        "-i".into(),
        "-w".into(),
        workdir.into(),
        name.into(),
        "timeout".into(),
        "-s".into(),
        "KILL".into(),
        format!("{}", timeout.as_secs().max(1)),
        "sh".into(),
        "-c".into(),
        command.into(),
    ]
}

impl Environment for DockerEnvironment {
    fn name(&self) -> &'static str {
        "docker"
    }

    fn limits(&self) -> &Limits {
        &self.config.limits
    }

    fn start(&self, task: &Task, episode: &str) -> Result<Box<dyn Sandbox>> {
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
        let name = Self::container_name(episode);
        // A container left by a crashed run under the same name goes first.
        let _ = self.docker(&["rm", "-f", &name]);
        let out = self.docker(
            &run_args(&name, &image, &workdir, &self.config.limits)
                .iter()
                .map(String::as_str)
                .collect::<Vec<_>>(),
        )?;
        if !out.status.success() {
            bail!(
                "task {}: docker run {image} failed: {}",
                task.id,
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        let mut sandbox = DockerSandbox {
            docker: self.config.docker.clone(),
            name,
            workdir,
            limits: self.config.limits.clone(),
            closed: false,
        };
        if let Some(dir) = folder {
            let mk = sandbox.run(
                &format!("mkdir -p {}", shell_quote(&sandbox.workdir)),
                None,
                Duration::from_secs(60),
            )?;
            if !mk.success() {
                bail!(
                    "task {}: cannot create {}: {}",
                    task.id,
                    sandbox.workdir,
                    mk.output
                );
            }
            sandbox.copy_in(&dir)?;
        }
        run_setup(&mut sandbox, task, &self.config.limits)?;
        Ok(Box::new(sandbox))
    }
}

impl DockerEnvironment {
    fn docker(&self, args: &[&str]) -> Result<std::process::Output> {
        Command::new(&self.config.docker)
            .args(args)
            .output()
            .with_context(|| format!("running docker {}", args.first().unwrap_or(&"")))
    }
}

pub struct DockerSandbox {
    docker: PathBuf,
    name: String,
    workdir: String,
    limits: Limits,
    closed: bool,
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
        let mut c = Command::new(&self.docker);
        c.args(exec_args(&self.name, &self.workdir, command, timeout));
        // The client gets a little longer than the in-container timeout, which does the killing.
        let client_timeout = timeout + Duration::from_secs(10);
        let kill = |child: &mut Child| {
            let _ = child.kill();
        };
        let mut out = run_captured(c, stdin, client_timeout, output_bytes, &self.limits, &kill)?;
        // `timeout -s KILL` makes the command end with 137.
        if out.exit_code == Some(137) && out.elapsed >= timeout {
            out.timed_out = true;
            out.exit_code = None;
        }
        Ok(out)
    }

    fn copy_in(&mut self, host_dir: &Path) -> Result<()> {
        if !host_dir.is_dir() {
            bail!("{} is not a folder", host_dir.display());
        }
        let mut source = host_dir.as_os_str().to_owned();
        source.push("/.");
        let out = Command::new(&self.docker)
            .arg("cp")
            .arg(&source)
            .arg(format!("{}:{}", self.name, self.workdir))
            .output()
            .context("running docker cp")?;
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
        let out = Command::new(&self.docker)
            .args(["rm", "-f", &self.name])
            .output()
            .context("running docker rm")?;
        if !out.status.success() {
            bail!(
                "docker rm -f {} failed: {}",
                self.name,
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(())
    }
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
    fn command_lines_carry_the_limits() {
        let limits = Limits {
            memory_bytes: 1 << 30,
            processes: 64,
            file_bytes: 1 << 20,
            ..Limits::default()
        };
        let run = run_args("swerve-a", "img:1", "/testbed", &limits).join(" ");
        assert_eq!(
            run,
            "run -d --name swerve-a --network none --memory 1073741824 --memory-swap 1073741824 \
             --pids-limit 64 --ulimit fsize=1048576 --ulimit core=0 --security-opt \
             no-new-privileges --workdir /testbed --entrypoint sleep img:1 infinity"
        );
        let exec = exec_args(
            "swerve-a",
            "/testbed",
            "ls -la; echo 'x'",
            Duration::from_secs(5),
        );
        assert_eq!(
            exec,
            vec![
                "exec",
                "-i",
                "-w",
                "/testbed",
                "swerve-a",
                "timeout",
                "-s",
                "KILL",
                "5",
                "sh",
                "-c",
                "ls -la; echo 'x'"
            ]
        );
        assert_eq!(
            DockerEnvironment::container_name("task/3 #2"),
            "swerve-task-3--2"
        );
    }

    #[test]
    fn no_daemon_is_a_clear_error() {
        let config = DockerConfig {
            docker: PathBuf::from("/nonexistent/docker"),
            ..DockerConfig::new(Limits::default())
        };
        let err = format!("{:#}", DockerEnvironment::new(config).err().unwrap());
        assert!(err.contains("docker CLI"), "{err}");
    }
}
