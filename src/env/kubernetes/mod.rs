//! The `kubernetes` environment: one pod per episode, from the task's image, through the
//! Kubernetes API (kube-rs; no kubectl).
//!
//! ```text
//!   new:    client from --kubeconfig / KUBECONFIG / ~/.kube/config / in-cluster (config.rs);
//!           the namespace answers a list; pods left with this run's id deleted (sweep.rs)
//!   start:  POST pod swerve-RUN-EP-HASH  (pod.rs: labels swerve.run, swerve.episode; sleep
//!             infinity; requests/limits; restartPolicy Never; activeDeadlineSeconds; no
//!             service-account token, no service links; capabilities dropped, no privilege
//!             escalation; memory-backed /tmp; node selector, tolerations, pull secrets,
//!             runtime class)                        409: delete it, confirmed, create again
//!           watch metadata.name=POD until Running   ErrImagePull, ImagePullBackOff, Failed,
//!                                                   the start deadline: an error naming the
//!                                                   pod, the image and why (lifecycle.rs)
//!           (a folder task: its folder copied in as below); the task's setup
//!   run:    exec sh -c WRAPPER ... over the websocket (exec.rs; docker's wrapper and limits)
//!   copy:   exec tar -x in the pod, the folder's tar stream on stdin (files.rs)
//!   close:  DELETE grace period 0, then GET until 404 (within a deadline)
//!   sweep:  list by label swerve.run=RUN, delete each, list until they are gone
//! ```
//!
//! Every API call has a time limit and is retried with jittered exponential backoff on 429,
//! 5xx and no answer (retry.rs); what an exec may retry is in exec.rs. The limits: memory as
//! the pod's request and limit (swap is the node's), CPU request and limit, `/tmp` an emptyDir
//! in memory; per file (`ulimit -f`) and process counts are not settable per pod through the
//! API: a file's size is bounded by the memory of `/tmp` and the node's disk, processes by the
//! kubelet's `podPidsLimit` (docs/kubernetes.md).
//!
//! The `Sandbox` trait is synchronous: the environment keeps one tokio runtime and every call
//! blocks on it.

pub mod cli;
pub mod config;
pub mod exec;
pub mod files;
pub mod lifecycle;
pub mod pod;
pub mod retry;
pub mod sweep;

pub use config::{KubernetesConfig, KubernetesOptions};

use super::docker::{command_script, new_run_id, FOLDER_WORKDIR};
use super::{run_setup, CommandOutput, Environment, Limits, RepoSource, Sandbox, Task};
use anyhow::{bail, Context, Result};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use lifecycle::Pods;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tokio::runtime::Runtime;

/// The label every pod of a run carries (`swerve.run=RUN`), as docker's containers.
pub const RUN_LABEL: &str = "swerve.run";

/// The API client of a namespace, and the runtime it runs on.
struct Connection {
    runtime: Arc<Runtime>,
    pods: Pods,
}

/// Connects as `config` says and checks that the namespace's pods can be listed.
fn connect(config: &KubernetesConfig) -> Result<Connection> {
    config::check_options(&config.options)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("swerve-kubernetes")
        .enable_all()
        .build()
        .context("starting the Kubernetes client's runtime")?;
    let pods = runtime.block_on(async {
        let (client, namespace) = config::connect(&config.options).await?;
        let pods = Pods {
            api: Api::namespaced(client, &namespace),
            namespace,
            config: config.clone(),
        };
        let what = format!("listing pods in namespace {}", pods.namespace);
        let one = ListParams::default().limit(1);
        retry::with_retries(&config.retry, config.api_timeout, &what, || {
            pods.api.list(&one)
        })
        .await
        .map_err(|e| anyhow::anyhow!("the Kubernetes API does not answer {what}: {e}"))?;
        anyhow::Ok(pods)
    })?;
    Ok(Connection {
        runtime: Arc::new(runtime),
        pods,
    })
}

/// Deletes the pods of run `run` (every swerve pod in the namespace when `None`), as
/// `swerve-train envs sweep` does. Returns the namespace and how many it deleted.
pub fn sweep(config: &KubernetesConfig, run: Option<&str>) -> Result<(String, usize)> {
    let connection = connect(config)?;
    let pods = &connection.pods;
    let count = connection.runtime.block_on(sweep::sweep_pods(pods, run))?;
    Ok((pods.namespace.clone(), count))
}

pub struct KubernetesEnvironment {
    runtime: Arc<Runtime>,
    pods: Pods,
    run_id: String,
}

impl KubernetesEnvironment {
    /// Connects, checks the namespace answers, and deletes the pods a crashed run with the same
    /// run id left.
    pub fn new(config: KubernetesConfig) -> Result<Self> {
        let run_id = match &config.options.run_id {
            Some(id) => {
                config::parse_run_id(id).map_err(|e| anyhow::anyhow!("--k8s-run-id: {e}"))?
            }
            None => new_run_id(),
        };
        let connection = connect(&config)?;
        let swept = connection
            .runtime
            .block_on(sweep::sweep_pods(&connection.pods, Some(&run_id)))?;
        if swept > 0 {
            eprintln!("kubernetes: deleted {swept} pods an earlier run {run_id} left");
        }
        Ok(Self {
            runtime: connection.runtime,
            pods: connection.pods,
            run_id,
        })
    }

    /// This run's id (the `swerve.run` label of its pods).
    pub fn run_id(&self) -> &str {
        &self.run_id
    }

    pub fn namespace(&self) -> &str {
        &self.pods.namespace
    }

    pub fn config(&self) -> &KubernetesConfig {
        &self.pods.config
    }

    /// [`Environment::start`] with an activation prefix (shell lines every command runs first).
    pub fn start_sandbox(
        &self,
        task: &Task,
        episode: &str,
        activate: Option<&str>,
    ) -> Result<KubernetesSandbox> {
        let config = &self.pods.config;
        let image = task
            .image
            .clone()
            .unwrap_or_else(|| config.default_image.clone());
        let (workdir, folder) = match &task.repo {
            RepoSource::InImage { workdir } => (workdir.clone(), None),
            RepoSource::Folder(dir) => (FOLDER_WORKDIR.to_string(), Some(dir.clone())),
            RepoSource::Toy { .. } => bail!(
                "task {} is a toy task: it runs in process (`--tasks builtin:toy` picks the toy environment)",
                task.id
            ),
        };
        // A folder task's workdir does not exist in the image: the pod starts in `/`.
        let start_dir = if folder.is_some() { "/" } else { &workdir };
        let spec: Pod = pod::pod_spec(config, &self.run_id, episode, &image, start_dir);
        let name = spec.metadata.name.clone().unwrap_or_default();
        self.runtime
            .block_on(self.pods.create(&spec))
            .with_context(|| format!("task {}: starting a pod of {image}", task.id))?;
        // From here on, dropping the sandbox (an error below) deletes the pod.
        let mut sandbox = KubernetesSandbox {
            runtime: self.runtime.clone(),
            pods: self.pods.clone(),
            name,
            workdir,
            limits: config.limits.clone(),
            activate: activate.map(str::to_string),
            closed: false,
        };
        self.runtime
            .block_on(self.pods.wait_running(&sandbox.name, &image))
            .with_context(|| format!("task {}", task.id))?;
        if let Some(dir) = folder {
            sandbox.copy_in(&dir)?;
        }
        run_setup(&mut sandbox, task, &config.limits)?;
        Ok(sandbox)
    }
}

impl Environment for KubernetesEnvironment {
    fn name(&self) -> &'static str {
        "kubernetes"
    }

    fn limits(&self) -> &Limits {
        &self.pods.config.limits
    }

    fn start(&self, task: &Task, episode: &str) -> Result<Box<dyn Sandbox>> {
        Ok(Box::new(self.start_sandbox(
            task,
            episode,
            task.activate.as_deref(),
        )?))
    }
}

pub struct KubernetesSandbox {
    runtime: Arc<Runtime>,
    pods: Pods,
    name: String,
    workdir: String,
    limits: Limits,
    /// Shell lines run before every command, in its shell (a task's environment activation).
    activate: Option<String>,
    closed: bool,
}

impl KubernetesSandbox {
    /// The pod's name.
    pub fn pod(&self) -> &str {
        &self.name
    }
}

impl Sandbox for KubernetesSandbox {
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
            bail!("the pod {} is deleted", self.name);
        }
        let script = command_script(self.activate.as_deref(), command);
        let request = exec::ExecRequest {
            script: &script,
            stdin,
            timeout,
            output_bytes,
            dir: &self.workdir,
        };
        self.runtime
            .block_on(exec::exec(&self.pods, &self.name, &request, &self.limits))
    }

    fn copy_in(&mut self, host_dir: &Path) -> Result<()> {
        if self.closed {
            bail!("the pod {} is deleted", self.name);
        }
        self.runtime.block_on(files::copy_in(
            &self.pods,
            &self.name,
            host_dir,
            &self.workdir,
            &self.limits,
        ))
    }

    fn close(&mut self) -> Result<()> {
        if self.closed {
            return Ok(());
        }
        self.closed = true;
        self.runtime
            .block_on(self.pods.delete_confirmed(&self.name))
    }
}

impl Drop for KubernetesSandbox {
    fn drop(&mut self) {
        let _ = self.close();
    }
}
