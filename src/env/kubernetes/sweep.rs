//! The sweeper: deletes the pods a run left (a crash, a SIGKILL) by their `swerve.run` label, at
//! the start of a run (its own run id) and from `swerve-train envs sweep`.

use super::lifecycle::Pods;
use super::retry::{with_retries, CallError};
use super::RUN_LABEL;
use anyhow::{bail, Result};
use kube::api::{DeleteParams, ListParams};
use std::time::{Duration, Instant};

/// The label selector of run `run`'s pods, or of every swerve pod when `None`.
pub fn selector(run: Option<&str>) -> String {
    match run {
        Some(run) => format!("{RUN_LABEL}={run}"),
        None => RUN_LABEL.to_string(),
    }
}

/// The names of the pods `selector` picks.
pub async fn list(pods: &Pods, selector: &str) -> Result<Vec<String>> {
    let what = format!(
        "listing the pods {selector} in namespace {}",
        pods.namespace
    );
    let params = ListParams::default().labels(selector);
    let list = with_retries(&pods.config.retry, pods.config.api_timeout, &what, || {
        pods.api.list(&params)
    })
    .await
    .map_err(|e| anyhow::anyhow!("{what}: {e}"))?;
    Ok(list
        .items
        .into_iter()
        .filter_map(|pod| pod.metadata.name)
        .collect())
}

/// Deletes the pods of run `run` (every swerve pod of the namespace when `None`) with grace
/// period 0 and waits until none is listed. Returns how many it deleted.
pub async fn sweep_pods(pods: &Pods, run: Option<&str>) -> Result<usize> {
    let selector = selector(run);
    let names = list(pods, &selector).await?;
    let params = DeleteParams::default().grace_period(0);
    for name in &names {
        let what = format!("deleting the pod {name}");
        match with_retries(&pods.config.retry, pods.config.api_timeout, &what, || {
            pods.api.delete(name, &params)
        })
        .await
        {
            Ok(_) | Err(CallError::Status(404, _)) => {}
            Err(e) => bail!("{what} in namespace {}: {e}", pods.namespace),
        }
    }
    let started = Instant::now();
    let mut pause = Duration::from_millis(50);
    loop {
        let left = list(pods, &selector).await?;
        // Pods a still-running run creates meanwhile are not waited for: only those deleted.
        let waiting: Vec<&String> = left.iter().filter(|n| names.contains(n)).collect();
        if waiting.is_empty() {
            return Ok(names.len());
        }
        if started.elapsed() >= pods.config.delete_timeout {
            bail!(
                "{} pods of {selector} are still there {:.0} s after their deletion: {}",
                waiting.len(),
                pods.config.delete_timeout.as_secs_f64(),
                waiting
                    .iter()
                    .map(|s| s.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_secs(1));
    }
}
