//! `swerve-train envs prepare`: the container images a task file needs, made ready before a run.
//! Each task's image is the one the docker environment starts it in (its `image`, SWE-bench's
//! name for the instance, or the default image for folder tasks); toy tasks run in process and
//! need none. `docker`: every image not present locally is pulled (the docker CLI, or podman),
//! each pull with a time limit, then every image's size and their sum are reported. `kubernetes`:
//! a DaemonSet manifest that makes every node pull them (one init container per image running a
//! no-op, then a pause container), with sizes from the local daemon where it has the images.
//! Errors name the image and the task lines (`file:line`) that need it.

use super::docker::cli;
use super::task::{RepoSource, Task};
use anyhow::{bail, Context, Result};
use serde_json::{json, Value};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// One image and the task lines that need it.
#[derive(Clone, Debug, PartialEq)]
pub struct ImageNeed {
    pub image: String,
    /// `file:line` of each task that runs in this image, in file order.
    pub origins: Vec<String>,
}

/// The distinct images `tasks` run in, in order of first use; `default_image` for tasks that name
/// none. Toy tasks (played in process) need no image.
pub fn images_needed(tasks: &[Task], default_image: &str) -> Vec<ImageNeed> {
    let mut needs: Vec<ImageNeed> = Vec::new();
    for task in tasks {
        if matches!(task.repo, RepoSource::Toy { .. }) {
            continue;
        }
        let image = task.image.as_deref().unwrap_or(default_image);
        match needs.iter_mut().find(|n| n.image == image) {
            Some(need) => need.origins.push(task.origin.clone()),
            None => needs.push(ImageNeed {
                image: image.to_string(),
                origins: vec![task.origin.clone()],
            }),
        }
    }
    needs
}

/// A run of consecutive lines of one file, or an origin that is not `file:line`.
enum OriginRun {
    Lines { file: String, first: u64, last: u64 },
    Other(String),
}

fn origin_runs(origins: &[String]) -> Vec<OriginRun> {
    let mut runs: Vec<OriginRun> = Vec::new();
    for origin in origins {
        let parsed = origin
            .rsplit_once(':')
            .and_then(|(file, line)| Some((file, line.parse::<u64>().ok()?)));
        let Some((file, line)) = parsed else {
            runs.push(OriginRun::Other(origin.clone()));
            continue;
        };
        match runs.last_mut() {
            Some(OriginRun::Lines {
                file: run_file,
                last,
                ..
            }) if run_file == file && line == *last + 1 => *last = line,
            _ => runs.push(OriginRun::Lines {
                file: file.to_string(),
                first: line,
                last: line,
            }),
        }
    }
    runs
}

/// The lines an error or the report names, per file with runs of lines as ranges
/// (`tasks.jsonl:1-5,9,12-14`); past 12 ranges, how many more lines.
pub fn describe_origins(origins: &[String]) -> String {
    const SHOWN_RANGES: usize = 12;
    let mut parts: Vec<String> = Vec::new();
    let mut current_file: Option<&str> = None;
    let mut lines_shown = 0;
    let runs = origin_runs(origins);
    for run in runs.iter().take(SHOWN_RANGES) {
        let OriginRun::Lines { file, first, last } = run else {
            if let OriginRun::Other(origin) = run {
                parts.push(origin.clone());
            }
            current_file = None;
            lines_shown += 1;
            continue;
        };
        let span = if first == last {
            first.to_string()
        } else {
            format!("{first}-{last}")
        };
        lines_shown += (last - first + 1) as usize;
        match parts.last_mut() {
            Some(part) if current_file == Some(file.as_str()) => write!(part, ",{span}").unwrap(),
            _ => {
                parts.push(format!("{file}:{span}"));
                current_file = Some(file.as_str());
            }
        }
    }
    let mut text = parts.join(", ");
    if origins.len() > lines_shown {
        write!(text, " and {} more lines", origins.len() - lines_shown).unwrap();
    }
    text
}

/// An image's size on the local daemon (`docker image inspect`), None when it is not there.
pub fn local_size(docker: &Path, image: &str, timeout: Duration) -> Result<Option<u64>> {
    let args = [
        "image".to_string(),
        "inspect".to_string(),
        "--format".to_string(),
        "{{.Size}}".to_string(),
        image.to_string(),
    ];
    let out = cli(docker, &args, timeout)?;
    if !out.status.success() {
        return Ok(None);
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let size = text.trim().parse::<u64>().with_context(|| {
        format!(
            "`{} image inspect {image}` printed {:?}, not a size in bytes",
            docker.display(),
            text.trim()
        )
    })?;
    Ok(Some(size))
}

/// What `prepare` found for one image.
#[derive(Clone, Debug, PartialEq)]
pub struct PreparedImage {
    pub need: ImageNeed,
    /// Bytes on the local daemon; None: unknown (not there, or no daemon to ask).
    pub size: Option<u64>,
    /// Pulled by this call (it was not present).
    pub pulled: bool,
}

/// Pulls (with `pull_timeout` each) the images not present locally. Every image is tried; the
/// error lists each failed one with the lines that need it.
pub fn pull_missing(
    docker: &Path,
    needs: &[ImageNeed],
    pull_timeout: Duration,
    cli_timeout: Duration,
) -> Result<Vec<PreparedImage>> {
    let mut prepared = Vec::new();
    let mut errors = Vec::new();
    for need in needs {
        let present = local_size(docker, &need.image, cli_timeout)?;
        if let Some(size) = present {
            prepared.push(PreparedImage {
                need: need.clone(),
                size: Some(size),
                pulled: false,
            });
            continue;
        }
        eprintln!("pulling {} ...", need.image);
        match pull(docker, &need.image, pull_timeout)
            .and_then(|()| local_size(docker, &need.image, cli_timeout))
        {
            Ok(size) => prepared.push(PreparedImage {
                need: need.clone(),
                size,
                pulled: true,
            }),
            Err(e) => errors.push(format!(
                "image {} (needed by {}): {e:#}",
                need.image,
                describe_origins(&need.origins)
            )),
        }
    }
    if !errors.is_empty() {
        bail!(
            "{} of {} images could not be pulled:\n  {}",
            errors.len(),
            needs.len(),
            errors.join("\n  ")
        );
    }
    Ok(prepared)
}

fn pull(docker: &Path, image: &str, timeout: Duration) -> Result<()> {
    let args = ["pull".to_string(), image.to_string()];
    let out = cli(docker, &args, timeout).map_err(|e| {
        anyhow::anyhow!(
            "pull did not finish within the pull timeout ({} s; --pull-timeout): {e:#}",
            timeout.as_secs()
        )
    })?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        bail!(
            "`{} pull {image}` failed ({}): {}",
            docker.display(),
            out.status,
            stderr.trim()
        );
    }
    Ok(())
}

/// Sizes from the local daemon for the Kubernetes report: unknown where the daemon lacks an
/// image or there is no daemon (an error of the CLI is not an error of the manifest).
pub fn local_sizes(docker: &Path, needs: &[ImageNeed], timeout: Duration) -> Vec<PreparedImage> {
    needs
        .iter()
        .map(|need| PreparedImage {
            need: need.clone(),
            size: local_size(docker, &need.image, timeout).unwrap_or(None),
            pulled: false,
        })
        .collect()
}

/// Where the pre-pull DaemonSet goes and how it is scheduled.
#[derive(Clone, Debug)]
pub struct DaemonSetOptions {
    pub name: String,
    pub namespace: String,
    /// The long-running container once every image is pulled.
    pub pause_image: String,
    /// `key=value` node labels the DaemonSet is limited to (none: every node).
    pub node_selector: Vec<(String, String)>,
    pub image_pull_secrets: Vec<String>,
}

/// The DaemonSet: one init container per image (in the order the task file first uses them)
/// running `sh -c "exit 0"`, so the kubelet pulls each before the next; then a pause container
/// keeps the pod (and the images, which the kubelet's garbage collection keeps while a container
/// uses them) on every node. It tolerates every taint, so GPU nodes pull them too.
pub fn daemonset(needs: &[ImageNeed], options: &DaemonSetOptions) -> Value {
    let small = json!({"requests": {"cpu": "10m", "memory": "16Mi"},
                       "limits": {"cpu": "100m", "memory": "64Mi"}});
    let init: Vec<Value> = needs
        .iter()
        .enumerate()
        .map(|(i, need)| {
            json!({"name": format!("pull-{i}"), "image": need.image,
                   "imagePullPolicy": "IfNotPresent", "command": ["sh", "-c", "exit 0"],
                   "resources": small})
        })
        .collect();
    let labels = json!({"app.kubernetes.io/name": options.name,
                        "app.kubernetes.io/part-of": "swerve"});
    let mut pod_spec = json!({
        "initContainers": init,
        "containers": [{"name": "pause", "image": options.pause_image,
                        "imagePullPolicy": "IfNotPresent", "resources": small}],
        "tolerations": [{"operator": "Exists"}],
        "automountServiceAccountToken": false,
        "terminationGracePeriodSeconds": 0,
    });
    if !options.node_selector.is_empty() {
        let selector: serde_json::Map<String, Value> = options
            .node_selector
            .iter()
            .map(|(k, v)| (k.clone(), Value::from(v.clone())))
            .collect();
        pod_spec["nodeSelector"] = Value::Object(selector);
    }
    if !options.image_pull_secrets.is_empty() {
        pod_spec["imagePullSecrets"] = options
            .image_pull_secrets
            .iter()
            .map(|name| json!({"name": name}))
            .collect();
    }
    json!({
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": options.name, "namespace": options.namespace, "labels": labels},
        "spec": {
            "selector": {"matchLabels": {"app.kubernetes.io/name": options.name}},
            "updateStrategy": {"type": "RollingUpdate"},
            "template": {"metadata": {"labels": labels}, "spec": pod_spec},
        },
    })
}

/// The report: one row per image (size, pulled or present, the lines that need it) and the disk
/// estimate, the sum of the known sizes (an upper bound: layers images share are stored once).
pub fn report(prepared: &[PreparedImage], tasks_path: &Path) -> String {
    let mut text = String::new();
    let lines: usize = prepared.iter().map(|p| p.need.origins.len()).sum();
    writeln!(
        text,
        "{} image(s) for {lines} task line(s) of {}:",
        prepared.len(),
        tasks_path.display()
    )
    .unwrap();
    for p in prepared {
        let size = p.size.map_or("unknown".to_string(), gib);
        let how = if p.pulled { ", pulled" } else { "" };
        writeln!(
            text,
            "  {}  {size}{how}  ({} line(s): {})",
            p.need.image,
            p.need.origins.len(),
            describe_origins(&p.need.origins)
        )
        .unwrap();
    }
    let known: u64 = prepared.iter().filter_map(|p| p.size).sum();
    let unknown = prepared.iter().filter(|p| p.size.is_none()).count();
    write!(
        text,
        "disk estimate: {} ({} bytes; the sum of the image sizes, an upper bound as shared layers are stored once)",
        gib(known),
        known
    )
    .unwrap();
    if unknown > 0 {
        write!(text, "; {unknown} image size(s) unknown, not counted").unwrap();
    }
    text.push('\n');
    text
}

fn gib(bytes: u64) -> String {
    format!("{:.2} GiB", bytes as f64 / f64::from(1u32 << 30))
}

/// What `envs prepare` is asked to do.
#[derive(Clone, Debug)]
pub enum PrepareTarget {
    Docker {
        pull_timeout: Duration,
    },
    Kubernetes {
        manifest: PathBuf,
        daemonset: DaemonSetOptions,
    },
}

/// `envs prepare`: the images `tasks` need, pulled or written into a DaemonSet manifest; the
/// report to print.
pub fn prepare(
    tasks: &[Task],
    tasks_path: &Path,
    default_image: &str,
    docker: &Path,
    target: &PrepareTarget,
) -> Result<String> {
    let needs = images_needed(tasks, default_image);
    if needs.is_empty() {
        bail!(
            "{}: no task needs a container image (toy tasks run in process)",
            tasks_path.display()
        );
    }
    let cli_timeout = Duration::from_secs(60);
    match target {
        PrepareTarget::Docker { pull_timeout } => {
            let prepared = pull_missing(docker, &needs, *pull_timeout, cli_timeout)?;
            Ok(report(&prepared, tasks_path))
        }
        PrepareTarget::Kubernetes {
            manifest,
            daemonset: options,
        } => {
            let value = daemonset(&needs, options);
            let text = serde_json::to_string_pretty(&value).expect("a JSON value serializes");
            std::fs::write(manifest, text + "\n").with_context(|| {
                format!("writing the DaemonSet manifest {}", manifest.display())
            })?;
            let prepared = local_sizes(docker, &needs, cli_timeout);
            Ok(format!(
                "{}wrote {} (DaemonSet {}/{}: {} image(s) pulled on every node; `kubectl apply -f {}`)\n",
                report(&prepared, tasks_path),
                manifest.display(),
                options.namespace,
                options.name,
                needs.len(),
                manifest.display()
            ))
        }
    }
}
