//! An episode's pod: its name, labels and spec, and what its status says about its start.

use super::config::{cpu_quantity, KubernetesConfig};
use super::RUN_LABEL;
use k8s_openapi::api::core::v1::{
    Capabilities, Container, EmptyDirVolumeSource, LocalObjectReference, Pod, PodSpec,
    ResourceRequirements, SecurityContext, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use std::collections::BTreeMap;

/// The label naming the episode (its id made a label value; the annotation of the same name
/// keeps it whole).
pub const EPISODE_LABEL: &str = "swerve.episode";

/// The one container of every pod.
pub const CONTAINER: &str = "sandbox";

/// 32-bit FNV-1a, for names that must stay distinct after being shortened.
fn fnv32(text: &str) -> u32 {
    text.bytes().fold(0x811c_9dc5, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    })
}

/// The pod of episode `episode` of run `run`: `swerve-` and both made lowercase DNS characters,
/// at most 63 characters in all, ending in a hash of the originals (two episodes whose ids
/// differ only in case or punctuation get different pods).
pub fn pod_name(run: &str, episode: &str) -> String {
    let mut safe: String = format!("{run}-{episode}")
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect();
    safe.truncate(46);
    let safe = safe.trim_matches('-');
    format!("swerve-{safe}-{:08x}", fnv32(&format!("{run}\n{episode}")))
}

/// `text` as a label value: other characters made `-`, at most 63, alphanumeric at both ends.
pub fn label_value(text: &str) -> String {
    let mut safe: String = text
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "-_.".contains(c) {
                c
            } else {
                '-'
            }
        })
        .collect();
    safe.truncate(63);
    safe.trim_matches(|c: char| !c.is_ascii_alphanumeric())
        .to_string()
}

fn quantities(cpu: f64, memory: u64) -> BTreeMap<String, Quantity> {
    BTreeMap::from([
        ("cpu".to_string(), Quantity(cpu_quantity(cpu))),
        ("memory".to_string(), Quantity(memory.to_string())),
    ])
}

/// The pod of one episode: `image` kept alive by `sleep infinity`, working in `workdir`.
pub fn pod_spec(
    config: &KubernetesConfig,
    run: &str,
    episode: &str,
    image: &str,
    workdir: &str,
) -> Pod {
    let options = &config.options;
    let memory = config.limits.memory_bytes;
    let container = Container {
        name: CONTAINER.to_string(),
        image: Some(image.to_string()),
        image_pull_policy: Some("IfNotPresent".to_string()),
        command: Some(vec!["sleep".to_string()]),
        args: Some(vec!["infinity".to_string()]),
        working_dir: Some(workdir.to_string()),
        // Memory requested as much as allowed: an episode is not evicted for using what it was
        // given. CPU: the request reserves, the limit throttles.
        resources: Some(ResourceRequirements {
            requests: Some(quantities(options.cpu_request, memory)),
            limits: Some(quantities(options.cpu_limit, memory)),
            ..ResourceRequirements::default()
        }),
        // As docker's --cap-drop ALL and --security-opt no-new-privileges.
        security_context: Some(SecurityContext {
            allow_privilege_escalation: Some(false),
            privileged: Some(false),
            capabilities: Some(Capabilities {
                drop: Some(vec!["ALL".to_string()]),
                add: None,
            }),
            ..SecurityContext::default()
        }),
        volume_mounts: Some(vec![VolumeMount {
            name: "tmp".to_string(),
            mount_path: "/tmp".to_string(),
            ..VolumeMount::default()
        }]),
        ..Container::default()
    };
    let labels = BTreeMap::from([
        (RUN_LABEL.to_string(), run.to_string()),
        (EPISODE_LABEL.to_string(), label_value(episode)),
    ]);
    Pod {
        metadata: ObjectMeta {
            name: Some(pod_name(run, episode)),
            labels: Some(labels),
            annotations: Some(BTreeMap::from([(
                EPISODE_LABEL.to_string(),
                episode.to_string(),
            )])),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            containers: vec![container],
            restart_policy: Some("Never".to_string()),
            active_deadline_seconds: Some(options.active_deadline.as_secs().max(1) as i64),
            termination_grace_period_seconds: Some(0),
            automount_service_account_token: Some(false),
            enable_service_links: Some(false),
            // The pause container is PID 1 and reaps orphans (docker's --init).
            share_process_namespace: Some(true),
            node_selector: (!options.node_selector.is_empty())
                .then(|| options.node_selector.clone()),
            tolerations: (!options.tolerations.is_empty()).then(|| options.tolerations.clone()),
            image_pull_secrets: (!options.image_pull_secrets.is_empty()).then(|| {
                options
                    .image_pull_secrets
                    .iter()
                    .map(|name| LocalObjectReference { name: name.clone() })
                    .collect()
            }),
            runtime_class_name: options.runtime_class.clone(),
            // As docker's --tmpfs /tmp: memory-backed, bounded, counted in the pod's memory.
            volumes: Some(vec![Volume {
                name: "tmp".to_string(),
                empty_dir: Some(EmptyDirVolumeSource {
                    medium: Some("Memory".to_string()),
                    size_limit: Some(Quantity(config.tmp_bytes.to_string())),
                }),
                ..Volume::default()
            }]),
            ..PodSpec::default()
        }),
        status: None,
    }
}

/// Where a starting pod is.
#[derive(Clone, Debug, PartialEq)]
pub enum StartState {
    Running,
    /// Still starting; what it waits for (for the message when the deadline passes).
    Waiting(String),
    /// It will not run: the reason and message.
    Failed(String),
}

/// Container waiting reasons that end a start: the image cannot be pulled or the container made.
const FATAL_WAITING: [&str; 7] = [
    "ErrImagePull",
    "ImagePullBackOff",
    "InvalidImageName",
    "ErrImageNeverPull",
    "CreateContainerConfigError",
    "CreateContainerError",
    "RunContainerError",
];

/// What `pod`'s status says about its start.
pub fn start_state(pod: &Pod) -> StartState {
    let Some(status) = &pod.status else {
        return StartState::Waiting("no status yet".to_string());
    };
    let phase = status.phase.as_deref().unwrap_or("Pending");
    let said = |reason: &Option<String>, message: &Option<String>| {
        let reason = reason.as_deref().unwrap_or("");
        match message.as_deref().filter(|m| !m.is_empty()) {
            Some(message) => format!("{reason}: {message}"),
            None => reason.to_string(),
        }
    };
    let mut container_end = None;
    for c in status.container_statuses.iter().flatten() {
        let state = c.state.as_ref();
        if let Some(w) = state.and_then(|s| s.waiting.as_ref()) {
            if FATAL_WAITING.contains(&w.reason.as_deref().unwrap_or("")) {
                return StartState::Failed(said(&w.reason, &w.message));
            }
        }
        if let Some(t) = state.and_then(|s| s.terminated.as_ref()) {
            container_end = Some(format!(
                "container {} (exit {})",
                said(&t.reason, &t.message),
                t.exit_code
            ));
        }
    }
    // The pod's own reason first (DeadlineExceeded, Evicted), then its container's end.
    let pod_reason = said(&status.reason, &status.message);
    match (phase, container_end) {
        ("Failed" | "Succeeded", end) => StartState::Failed(
            [format!("phase {phase}"), pod_reason]
                .into_iter()
                .chain(end)
                .filter(|s| !s.is_empty())
                .collect::<Vec<_>>()
                .join(", "),
        ),
        (_, Some(end)) => StartState::Failed(end),
        ("Running", None) => StartState::Running,
        _ => {
            let mut why = vec![format!("phase {phase}")];
            for c in status.conditions.iter().flatten() {
                if c.status == "False" && c.reason.is_some() {
                    why.push(format!("{} {}", c.type_, said(&c.reason, &c.message)));
                }
            }
            for c in status.container_statuses.iter().flatten() {
                if let Some(w) = c.state.as_ref().and_then(|s| s.waiting.as_ref()) {
                    why.push(format!("container {}", said(&w.reason, &w.message)));
                }
            }
            StartState::Waiting(why.join("; "))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::env::kubernetes::config::KubernetesOptions;
    use crate::env::Limits;

    #[test]
    fn names_and_labels_are_valid_and_distinct() {
        let a = pod_name("123-456-0", "pytest-dev__pytest-1-0-0a1b2c3d");
        let b = pod_name("123-456-0", "Pytest-dev__pytest-1-0-0a1b2c3d");
        assert_ne!(a, b);
        for name in [&a, &b, &pod_name("r", &"x".repeat(300))] {
            assert!(name.len() <= 63, "{name}");
            assert!(
                crate::env::kubernetes::config::is_dns_subdomain(name),
                "{name}"
            );
        }
        assert_eq!(label_value("task/3 #2"), "task-3--2");
        assert_eq!(label_value("_x_"), "x");
        assert!(crate::env::kubernetes::config::is_label_value(
            &label_value(&"y".repeat(99))
        ));
    }

    #[test]
    fn the_spec_carries_limits_labels_and_hardening() {
        let mut options = KubernetesOptions::default();
        options
            .node_selector
            .insert("pool".into(), "sandbox".into());
        options.image_pull_secrets.push("regcred".into());
        options.runtime_class = Some("gvisor".into());
        let config = KubernetesConfig::new(Limits::default(), options);
        let pod =
            serde_json::to_value(pod_spec(&config, "r1", "e 1", "img:1", "/testbed")).unwrap();
        let spec = &pod["spec"];
        assert_eq!(spec["restartPolicy"], "Never");
        assert_eq!(spec["automountServiceAccountToken"], false);
        assert_eq!(spec["enableServiceLinks"], false);
        assert_eq!(spec["activeDeadlineSeconds"], 21600);
        assert_eq!(spec["nodeSelector"]["pool"], "sandbox");
        assert_eq!(spec["imagePullSecrets"][0]["name"], "regcred");
        assert_eq!(spec["runtimeClassName"], "gvisor");
        let c = &spec["containers"][0];
        assert_eq!(c["image"], "img:1");
        assert_eq!(c["workingDir"], "/testbed");
        assert_eq!(c["command"], serde_json::json!(["sleep"]));
        assert_eq!(c["resources"]["requests"]["cpu"], "500m");
        assert_eq!(c["resources"]["limits"]["cpu"], "2000m");
        assert_eq!(c["resources"]["limits"]["memory"], (8u64 << 30).to_string());
        assert_eq!(c["securityContext"]["allowPrivilegeEscalation"], false);
        assert_eq!(c["securityContext"]["capabilities"]["drop"][0], "ALL");
        assert_eq!(pod["metadata"]["labels"]["swerve.run"], "r1");
        assert_eq!(pod["metadata"]["labels"]["swerve.episode"], "e-1");
        assert_eq!(pod["metadata"]["annotations"]["swerve.episode"], "e 1");
    }

    #[test]
    fn image_pull_errors_and_deadlines_end_a_start() {
        let pod: Pod = serde_json::from_value(serde_json::json!({"status": {"phase": "Pending",
            "containerStatuses": [{"name": "sandbox", "image": "x", "imageID": "", "ready": false,
            "restartCount": 0, "state": {"waiting": {"reason": "ImagePullBackOff",
            "message": "Back-off pulling image \"x\""}}}]}}))
        .unwrap();
        assert_eq!(
            start_state(&pod),
            StartState::Failed("ImagePullBackOff: Back-off pulling image \"x\"".into())
        );
        let pod: Pod = serde_json::from_value(serde_json::json!({"status": {"phase": "Failed",
            "reason": "DeadlineExceeded", "message": "Pod was active too long"}}))
        .unwrap();
        assert!(
            matches!(start_state(&pod), StartState::Failed(m) if m.contains("DeadlineExceeded"))
        );
        let pod: Pod = serde_json::from_value(serde_json::json!({"status": {"phase": "Pending",
            "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
            "message": "0/3 nodes are available"}]}}))
        .unwrap();
        assert!(matches!(start_state(&pod), StartState::Waiting(m) if m.contains("Unschedulable")));
    }
}
