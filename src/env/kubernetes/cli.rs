//! The `--k8s-*` flags of `rollout`, `eval`, `rl` and `envs sweep` (names: [`KubernetesOptions`]'
//! fields with the prefix). Each value is parsed by config.rs's parsers; clap names the flag and
//! the value in the error.

use super::config::{
    parse_cpus, parse_node_selector, parse_object_name, parse_run_id, parse_toleration,
    KubernetesOptions,
};
use k8s_openapi::api::core::v1::Toleration;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

fn positive_seconds(text: &str) -> Result<u64, String> {
    match text.parse::<u64>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(format!(
            "{text:?} is not a whole number of seconds of at least 1"
        )),
    }
}

/// Where and how `--env kubernetes` runs its pods.
#[derive(clap::Args, Clone, Debug)]
pub struct KubernetesArgs {
    /// Namespace of the pods (kubernetes; default: the kubeconfig context's, or the service
    /// account's in a cluster).
    #[arg(long = "k8s-namespace", alias = "namespace", value_parser = parse_object_name)]
    pub k8s_namespace: Option<String>,
    /// nodeSelector of every pod, KEY=VALUE[,KEY=VALUE...] (kubernetes).
    #[arg(long, value_parser = parse_node_selector)]
    pub k8s_node_selector: Option<BTreeMap<String, String>>,
    /// A toleration of every pod, KEY[=VALUE][:EFFECT] as `kubectl taint` writes taints; no
    /// value: any value; no effect: every effect (kubernetes; repeatable).
    #[arg(long, value_parser = parse_toleration)]
    pub k8s_toleration: Vec<Toleration>,
    /// A secret in the namespace the kubelet pulls task images with (kubernetes; repeatable).
    #[arg(long, value_parser = parse_object_name)]
    pub k8s_image_pull_secret: Vec<String>,
    /// runtimeClassName of every pod, e.g. gvisor (kubernetes).
    #[arg(long, value_parser = parse_object_name)]
    pub k8s_runtime_class: Option<String>,
    /// Kubeconfig file (kubernetes; default: KUBECONFIG, ~/.kube/config, else in-cluster).
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// Kubeconfig context (kubernetes; default: the file's current context).
    #[arg(long)]
    pub kube_context: Option<String>,
    /// CPU cores each pod requests (kubernetes).
    #[arg(long, default_value = "0.5", value_parser = parse_cpus)]
    pub k8s_cpu_request: f64,
    /// CPU cores each pod may use at most (kubernetes).
    #[arg(long, default_value = "2", value_parser = parse_cpus)]
    pub k8s_cpu_limit: f64,
    /// Seconds a pod may take to be Running (scheduling, image pull) before its episode fails
    /// as an infrastructure failure (kubernetes).
    #[arg(long, default_value = "600", value_parser = positive_seconds)]
    pub k8s_start_timeout: u64,
    /// activeDeadlineSeconds of every pod: the kubelet kills it this long after its start, even
    /// if the runner died (kubernetes).
    #[arg(long, default_value = "21600", value_parser = positive_seconds)]
    pub k8s_active_deadline: u64,
    /// The run id (the swerve.run label of its pods); pods already carrying it are deleted at
    /// the start (kubernetes; default: a fresh id, printed at the start).
    #[arg(long, value_parser = parse_run_id)]
    pub k8s_run_id: Option<String>,
}

impl KubernetesArgs {
    pub fn options(&self) -> KubernetesOptions {
        KubernetesOptions {
            namespace: self.k8s_namespace.clone(),
            node_selector: self.k8s_node_selector.clone().unwrap_or_default(),
            tolerations: self.k8s_toleration.clone(),
            image_pull_secrets: self.k8s_image_pull_secret.clone(),
            runtime_class: self.k8s_runtime_class.clone(),
            kubeconfig: self.kubeconfig.clone(),
            context: self.kube_context.clone(),
            cpu_request: self.k8s_cpu_request,
            cpu_limit: self.k8s_cpu_limit,
            start_timeout: Duration::from_secs(self.k8s_start_timeout),
            active_deadline: Duration::from_secs(self.k8s_active_deadline),
            run_id: self.k8s_run_id.clone(),
        }
    }
}
