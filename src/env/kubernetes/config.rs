//! What `--env kubernetes` is configured with (the command line's `--k8s-*` flags; the field
//! names are the flags' names without the prefix, for a configuration file), the parsers of its
//! text values (each error names the value and what is wrong; clap adds the flag), and the API
//! client built from a kubeconfig or the in-cluster service account.

use super::super::Limits;
use anyhow::{bail, Context, Result};
use k8s_openapi::api::core::v1::Toleration;
use kube::config::{KubeConfigOptions, Kubeconfig};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

/// The options a user gives (flags or a configuration file), before the limits are added.
#[derive(Clone, Debug, PartialEq)]
pub struct KubernetesOptions {
    /// Namespace of the pods; `None`: the kubeconfig context's (or the service account's).
    pub namespace: Option<String>,
    /// `nodeSelector` of every pod.
    pub node_selector: BTreeMap<String, String>,
    pub tolerations: Vec<Toleration>,
    /// Secrets (in the namespace) the kubelet pulls task images with.
    pub image_pull_secrets: Vec<String>,
    /// `runtimeClassName` (gVisor, Kata: a stronger sandbox where the cluster has one).
    pub runtime_class: Option<String>,
    /// A kubeconfig file; `None`: `KUBECONFIG`, `~/.kube/config`, else in-cluster.
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context; `None`: its current context.
    pub context: Option<String>,
    /// CPU cores requested for each pod (the scheduler reserves them).
    pub cpu_request: f64,
    /// CPU cores each pod may use at most.
    pub cpu_limit: f64,
    /// A pod not Running within this long is an infrastructure failure.
    pub start_timeout: Duration,
    /// `activeDeadlineSeconds`: the kubelet kills a pod this long after it started, whatever
    /// the runner does (a crashed runner's pods end by themselves).
    pub active_deadline: Duration,
    /// The `swerve.run` label of this run's pods; `None`: a fresh one. Pods already carrying it
    /// (a run that crashed and is started again with its id) are removed at the start.
    pub run_id: Option<String>,
}

impl Default for KubernetesOptions {
    fn default() -> Self {
        Self {
            namespace: None,
            node_selector: BTreeMap::new(),
            tolerations: Vec::new(),
            image_pull_secrets: Vec::new(),
            runtime_class: None,
            kubeconfig: None,
            context: None,
            cpu_request: 0.5,
            cpu_limit: 2.0,
            start_timeout: Duration::from_secs(600),
            active_deadline: Duration::from_secs(6 * 3600),
            run_id: None,
        }
    }
}

/// Everything the environment runs with.
#[derive(Clone, Debug)]
pub struct KubernetesConfig {
    pub options: KubernetesOptions,
    pub limits: Limits,
    /// Image for tasks that name none (folder tasks), as docker's.
    pub default_image: String,
    /// Size of the memory-backed `/tmp` (it counts towards the pod's memory), as docker's tmpfs.
    pub tmp_bytes: u64,
    /// Time limit of one API call (not of a watch or a command).
    pub api_timeout: Duration,
    /// How long a deleted pod may take to be gone.
    pub delete_timeout: Duration,
    /// Retries of an API call answered 429 or 5xx (or not answered).
    pub retry: RetryPolicy,
}

impl KubernetesConfig {
    pub fn new(limits: Limits, options: KubernetesOptions) -> Self {
        Self {
            options,
            limits,
            default_image: "python:3.11-slim".to_string(),
            tmp_bytes: 1 << 30,
            api_timeout: Duration::from_secs(30),
            delete_timeout: Duration::from_secs(120),
            retry: RetryPolicy::default(),
        }
    }
}

/// Exponential backoff with jitter: attempt n (from 0) waits a random time in
/// `[d/2, d]`, `d = min(cap, base * 2^n)`; at most `attempts` tries in all.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RetryPolicy {
    pub attempts: u32,
    pub base: Duration,
    pub cap: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            attempts: 6,
            base: Duration::from_millis(200),
            cap: Duration::from_secs(5),
        }
    }
}

/// Whether `s` is a label value (or a label name's name part): at most 63 characters,
/// alphanumerics, `-`, `_` and `.`, alphanumeric at both ends; a value may be empty.
pub fn is_label_value(s: &str) -> bool {
    s.is_empty()
        || (s.len() <= 63
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
            && s.starts_with(|c: char| c.is_ascii_alphanumeric())
            && s.ends_with(|c: char| c.is_ascii_alphanumeric()))
}

/// Whether `s` is a DNS-1123 subdomain (a namespace, secret or runtime-class name, a label key's
/// prefix): lowercase alphanumerics, `-` and `.`, at most 253, alphanumeric at both ends.
pub fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "-.".contains(c))
        && s.starts_with(|c: char| c.is_ascii_alphanumeric())
        && s.ends_with(|c: char| c.is_ascii_alphanumeric())
}

/// A label key: `[PREFIX/]NAME`, PREFIX a DNS subdomain, NAME a non-empty label value.
fn check_label_key(key: &str) -> std::result::Result<(), String> {
    let (prefix, name) = match key.split_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    if let Some(prefix) = prefix {
        if !is_dns_subdomain(prefix) {
            return Err(format!(
                "the key {key:?} has the prefix {prefix:?}, not a DNS subdomain"
            ));
        }
    }
    if name.is_empty() || !is_label_value(name) {
        return Err(format!(
            "the key {key:?} is not a label key (at most 63 of A-Z a-z 0-9 - _ ., alphanumeric at both ends, after an optional DNS prefix and /)"
        ));
    }
    Ok(())
}

/// `KEY=VALUE,KEY=VALUE` (`--k8s-node-selector`).
pub fn parse_node_selector(text: &str) -> std::result::Result<BTreeMap<String, String>, String> {
    let mut map = BTreeMap::new();
    for pair in text.split(',') {
        let Some((key, value)) = pair.split_once('=') else {
            return Err(format!("{pair:?} is not KEY=VALUE"));
        };
        check_label_key(key)?;
        if !is_label_value(value) {
            return Err(format!(
                "the value {value:?} of {key:?} is not a label value"
            ));
        }
        if map.insert(key.to_string(), value.to_string()).is_some() {
            return Err(format!("the key {key:?} is given twice"));
        }
    }
    Ok(map)
}

/// A toleration as `kubectl taint` writes a taint: `KEY[=VALUE][:EFFECT]` (`--k8s-toleration`).
/// Without a value it tolerates the key with any value (operator Exists), without an effect
/// every effect.
pub fn parse_toleration(text: &str) -> std::result::Result<Toleration, String> {
    let (rest, effect) = match text.rsplit_once(':') {
        Some((rest, effect)) => {
            if !["NoSchedule", "PreferNoSchedule", "NoExecute"].contains(&effect) {
                return Err(format!(
                    "the effect {effect:?} is none of NoSchedule, PreferNoSchedule, NoExecute"
                ));
            }
            (rest, Some(effect.to_string()))
        }
        None => (text, None),
    };
    let (key, value) = match rest.split_once('=') {
        Some((key, value)) => (key, Some(value)),
        None => (rest, None),
    };
    check_label_key(key)?;
    if let Some(value) = value {
        if !is_label_value(value) {
            return Err(format!("the value {value:?} is not a label value"));
        }
    }
    Ok(Toleration {
        key: Some(key.to_string()),
        operator: Some(if value.is_some() { "Equal" } else { "Exists" }.to_string()),
        value: value.map(str::to_string),
        effect,
        toleration_seconds: None,
    })
}

/// A namespace, secret or runtime-class name (a DNS subdomain; namespaces are DNS labels, which
/// the API server checks).
pub fn parse_object_name(text: &str) -> std::result::Result<String, String> {
    if is_dns_subdomain(text) {
        Ok(text.to_string())
    } else {
        Err(format!(
            "{text:?} is not a Kubernetes object name (lowercase a-z 0-9 - ., alphanumeric at both ends, at most 253)"
        ))
    }
}

/// A run id: a label value, not empty (`--k8s-run-id`, `envs sweep --run`).
pub fn parse_run_id(text: &str) -> std::result::Result<String, String> {
    if !text.is_empty() && is_label_value(text) {
        Ok(text.to_string())
    } else {
        Err(format!(
            "{text:?} is not a label value (1 to 63 of A-Z a-z 0-9 - _ ., alphanumeric at both ends)"
        ))
    }
}

/// CPU cores, at least a millicore (`--k8s-cpu-request`, `--k8s-cpu-limit`).
pub fn parse_cpus(text: &str) -> std::result::Result<f64, String> {
    match text.parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.001 => Ok(v),
        _ => Err(format!(
            "{text:?} is not a number of CPU cores of at least 0.001"
        )),
    }
}

/// `cores` as a quantity in millicores (`500m`).
pub fn cpu_quantity(cores: f64) -> String {
    format!("{}m", (cores * 1000.0).round() as u64)
}

/// Checks the options as a whole (what single values cannot show).
pub fn check_options(options: &KubernetesOptions) -> Result<()> {
    if options.cpu_request > options.cpu_limit {
        bail!(
            "--k8s-cpu-request {} is above --k8s-cpu-limit {}",
            options.cpu_request,
            options.cpu_limit
        );
    }
    if options.start_timeout.is_zero() || options.active_deadline.is_zero() {
        bail!("--k8s-start-timeout and --k8s-active-deadline must be at least 1 s");
    }
    Ok(())
}

/// The API client and the namespace to use: from `options.kubeconfig` (and context) when given,
/// else `KUBECONFIG` / `~/.kube/config`, else the in-cluster service account.
pub async fn connect(options: &KubernetesOptions) -> Result<(kube::Client, String)> {
    let context = KubeConfigOptions {
        context: options.context.clone(),
        ..KubeConfigOptions::default()
    };
    let config = match (&options.kubeconfig, &options.context) {
        (Some(path), _) => {
            let file = Kubeconfig::read_from(path)
                .with_context(|| format!("reading the kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(file, &context)
                .await
                .with_context(|| format!("the kubeconfig {}", path.display()))?
        }
        (None, Some(name)) => kube::Config::from_kubeconfig(&context)
            .await
            .with_context(|| format!("the kubeconfig context {name:?} (KUBECONFIG or ~/.kube/config)"))?,
        (None, None) => kube::Config::infer().await.context(
            "no Kubernetes configuration: no KUBECONFIG, no ~/.kube/config and not in a cluster (--kubeconfig names a file)",
        )?,
    };
    let namespace = options
        .namespace
        .clone()
        .unwrap_or_else(|| config.default_namespace.clone());
    let client = kube::Client::try_from(config).context("building the Kubernetes client")?;
    Ok((client, namespace))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_selectors_and_tolerations_parse_or_say_what_is_wrong() {
        let map = parse_node_selector("pool=sandbox,kubernetes.io/arch=amd64").unwrap();
        assert_eq!(map["pool"], "sandbox");
        assert_eq!(map["kubernetes.io/arch"], "amd64");
        assert!(parse_node_selector("pool")
            .unwrap_err()
            .contains("KEY=VALUE"));
        assert!(parse_node_selector("a=b,a=c")
            .unwrap_err()
            .contains("twice"));
        assert!(parse_node_selector("a=b c")
            .unwrap_err()
            .contains("\"b c\""));
        assert!(parse_node_selector("Bad_/x=1")
            .unwrap_err()
            .contains("prefix"));

        let t = parse_toleration("gpu=no:NoSchedule").unwrap();
        assert_eq!(
            (t.key.as_deref(), t.operator.as_deref(), t.value.as_deref()),
            (Some("gpu"), Some("Equal"), Some("no"))
        );
        assert_eq!(t.effect.as_deref(), Some("NoSchedule"));
        let t = parse_toleration("sandbox").unwrap();
        assert_eq!((t.operator.as_deref(), t.effect), (Some("Exists"), None));
        assert!(parse_toleration("a:Sometimes")
            .unwrap_err()
            .contains("Sometimes"));
    }

    #[test]
    fn names_cpus_and_run_ids() {
        assert!(parse_object_name("swerve-sandboxes").is_ok());
        assert!(parse_object_name("Swerve")
            .unwrap_err()
            .contains("\"Swerve\""));
        assert_eq!(parse_run_id("123-456-0").unwrap(), "123-456-0");
        assert!(parse_run_id("-x").is_err() && parse_run_id("").is_err());
        assert_eq!(parse_cpus("0.5").unwrap(), 0.5);
        assert!(parse_cpus("0").unwrap_err().contains("0.001"));
        assert!(parse_cpus("two").is_err());
        assert_eq!(cpu_quantity(0.5), "500m");
        assert_eq!(cpu_quantity(2.0), "2000m");
    }
}
