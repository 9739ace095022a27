//! swerve-train's `--env`, `--sandbox-*`, `--image`, `--docker-cli`, `--infra-retries` and
//! `--k8s-*` flags: where agent commands run and their limits.

use std::path::PathBuf;
use swerve::agent::rollout::Workers;
use swerve::env::{EnvKind, Limits};

/// Where agent commands run and their limits (`rollout`, `eval`, `rl`).
#[derive(clap::Args)]
pub struct SandboxArgs {
    /// Where commands run: local (bubblewrap), docker (the task's image) or kubernetes (a pod
    /// of the task's image per episode; the --k8s-* flags).
    #[arg(long, default_value = "local")]
    pub env: EnvKind,
    /// Wall-clock limit of one agent command, seconds.
    #[arg(long, default_value_t = 120)]
    pub command_timeout: u64,
    /// Memory per sandboxed process (local), per container (docker) or per pod (kubernetes),
    /// MiB.
    #[arg(long, default_value_t = 8192)]
    pub sandbox_memory_mb: u64,
    /// Processes and threads an episode may have at once.
    #[arg(long, default_value_t = 512)]
    pub sandbox_processes: u64,
    /// A host path bound read-only into the local sandbox (repeatable).
    #[arg(long)]
    pub sandbox_bind: Vec<PathBuf>,
    /// Image for tasks that name none (docker, kubernetes).
    #[arg(long, default_value = "python:3.11-slim")]
    pub image: String,
    /// The docker CLI (`podman` works as a drop-in).
    #[arg(long, default_value = "docker")]
    pub docker_cli: PathBuf,
    /// Times an episode starts again after an infrastructure failure (sandbox or container
    /// start, daemon, grader, policy server) before it is dropped as an error.
    #[arg(long, default_value_t = 2)]
    pub infra_retries: usize,
    #[command(flatten)]
    pub kubernetes: swerve::env::kubernetes::cli::KubernetesArgs,
    /// Episodes (so sandboxes) alive at once, each on its own thread (default: --concurrency).
    /// Apart from the engine's batch limit (--concurrency): an episode waiting on a slow command
    /// holds a sandbox, not a batch slot, so more sandboxes than batch slots keep the engine
    /// busy while commands run.
    #[arg(long)]
    pub sandboxes: Option<usize>,
    /// Sandboxes of the next episodes started (their setup run) while the current ones run, so
    /// start-up leaves the episodes' critical path (default: a quarter of --sandboxes; 0: off).
    #[arg(long)]
    pub warm_pool: Option<usize>,
}

impl SandboxArgs {
    pub fn limits(&self) -> Limits {
        Limits {
            command_timeout: std::time::Duration::from_secs(self.command_timeout.max(1)),
            memory_bytes: self.sandbox_memory_mb << 20,
            processes: self.sandbox_processes,
            ..Limits::default()
        }
    }

    /// `--sandboxes` (default: the engine's batch limit) and `--warm-pool`.
    pub fn workers(&self, concurrency: usize) -> Workers {
        let sandboxes = self.sandboxes.unwrap_or(concurrency);
        Workers {
            sandboxes,
            warm_pool: self.warm_pool.unwrap_or(sandboxes.div_ceil(4)),
        }
    }
}
