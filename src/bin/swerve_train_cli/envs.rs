//! `swerve-train envs ...`: the environments' housekeeping, apart from runs.

use anyhow::{bail, Result};
use std::path::PathBuf;
use std::time::Duration;
use swerve::env::prepare::{prepare, DaemonSetOptions, PrepareTarget};
use swerve::env::{builtin, load_tasks};

#[derive(clap::Subcommand)]
pub enum EnvsCommand {
    /// The container images a task file needs, made ready: pulled (`--env docker`) or written
    /// into a pre-pull DaemonSet manifest (`--env kubernetes`), with their sizes, a disk
    /// estimate and the task lines that need each (docs/images.md).
    Prepare(PrepareArgs),
    /// `envs sweep`: the pods a killed run left (kubernetes).
    #[command(flatten)]
    Kubernetes(swerve::env::envs::EnvsCommand),
}

#[derive(clap::Args)]
pub struct PrepareArgs {
    /// Task file (JSON lines, either format) or a built-in set (`builtin`, `builtin:NAME`).
    #[arg(long)]
    tasks: String,
    /// docker: pull the missing images; kubernetes: write a pre-pull DaemonSet (--manifest).
    #[arg(long, value_parser = ["docker", "kubernetes"])]
    env: String,
    /// Image for tasks that name none (folder tasks), as `rollout --image`.
    #[arg(long, default_value = "python:3.11-slim")]
    image: String,
    /// The docker CLI (`podman` works as a drop-in); kubernetes: asked for image sizes only.
    #[arg(long, default_value = "docker")]
    docker_cli: PathBuf,
    /// Time limit of each image pull, seconds (docker).
    #[arg(long, default_value_t = 1800, value_parser = clap::value_parser!(u64).range(1..))]
    pull_timeout: u64,
    /// Where the DaemonSet manifest (JSON, which kubectl reads as YAML) is written (kubernetes).
    #[arg(long)]
    manifest: Option<PathBuf>,
    /// The DaemonSet's namespace (kubernetes).
    #[arg(long, default_value = "default")]
    namespace: String,
    /// The DaemonSet's name and `app.kubernetes.io/name` label (kubernetes).
    #[arg(long, default_value = "swerve-prepull")]
    daemonset_name: String,
    /// The container that keeps each node's pre-pull pod alive once the images are pulled.
    #[arg(long, default_value = "registry.k8s.io/pause:3.10")]
    pause_image: String,
    /// A node label KEY=VALUE the DaemonSet is limited to (repeatable; none: every node).
    #[arg(long, value_parser = key_value)]
    node_selector: Vec<(String, String)>,
    /// An image-pull secret in the namespace, for private registries (repeatable).
    #[arg(long)]
    image_pull_secret: Vec<String>,
}

fn key_value(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((key, value)) if !key.is_empty() => Ok((key.to_string(), value.to_string())),
        _ => Err(format!("{text:?} is not KEY=VALUE")),
    }
}

impl PrepareArgs {
    fn target(&self) -> Result<PrepareTarget> {
        match (self.env.as_str(), &self.manifest) {
            ("docker", None) => Ok(PrepareTarget::Docker {
                pull_timeout: Duration::from_secs(self.pull_timeout),
            }),
            ("docker", Some(_)) => bail!("--manifest is for --env kubernetes; --env docker pulls"),
            (_, None) => bail!("--env kubernetes needs --manifest FILE (where the DaemonSet goes)"),
            (_, Some(manifest)) => Ok(PrepareTarget::Kubernetes {
                manifest: manifest.clone(),
                daemonset: DaemonSetOptions {
                    name: self.daemonset_name.clone(),
                    namespace: self.namespace.clone(),
                    pause_image: self.pause_image.clone(),
                    node_selector: self.node_selector.clone(),
                    image_pull_secrets: self.image_pull_secret.clone(),
                },
            }),
        }
    }
}

pub fn run(command: &EnvsCommand) -> Result<()> {
    match command {
        EnvsCommand::Kubernetes(command) => swerve::env::envs::run(command),
        EnvsCommand::Prepare(args) => {
            let target = args.target()?;
            let path = builtin::resolve_tasks(&args.tasks)?;
            let tasks = load_tasks(&path)?;
            let report = prepare(&tasks, &path, &args.image, &args.docker_cli, &target)?;
            print!("{report}");
            Ok(())
        }
    }
}
