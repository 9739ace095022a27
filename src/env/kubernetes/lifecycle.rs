//! A pod's life: created (a name that exists is deleted and the pod created again), watched
//! until Running (failures and the deadline end the start), deleted with grace period 0 and
//! confirmed gone.

use super::config::KubernetesConfig;
use super::pod::{start_state, StartState};
use super::retry::{backoff, with_retries, CallError};
use anyhow::{bail, Result};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, PostParams, WatchEvent, WatchParams};
use std::time::{Duration, Instant};

/// The API calls of one namespace's pods, with the config's limits and retries.
#[derive(Clone)]
pub struct Pods {
    pub api: Api<Pod>,
    pub namespace: String,
    pub config: KubernetesConfig,
}

impl Pods {
    /// Creates `pod`. A 409 (its name exists: an earlier try of this create that landed though
    /// its answer was lost, or a pod a crashed run with the same run id left) deletes that pod,
    /// confirmed, and creates it again: the name is this episode's, so the pod there is ours and
    /// in an unknown state. Returns how many pods it replaced.
    pub async fn create(&self, pod: &Pod) -> Result<usize> {
        let name = pod.metadata.name.clone().unwrap_or_default();
        let what = format!("creating the pod {name} in namespace {}", self.namespace);
        let mut replaced = 0;
        let params = PostParams::default();
        loop {
            let created = with_retries(&self.config.retry, self.config.api_timeout, &what, || {
                self.api.create(&params, pod)
            })
            .await;
            match created {
                Ok(_) => return Ok(replaced),
                Err(CallError::Status(409, message)) if replaced < 2 => {
                    eprintln!("kubernetes: {what}: 409 ({message}): deleting that pod and creating it again");
                    self.delete_confirmed(&name).await?;
                    replaced += 1;
                }
                Err(e) => bail!("{what}: {e}"),
            }
        }
    }

    pub async fn get(&self, name: &str) -> Result<Option<Pod>, CallError> {
        let what = format!("reading the pod {name}");
        with_retries(&self.config.retry, self.config.api_timeout, &what, || {
            self.api.get_opt(name)
        })
        .await
    }

    /// Waits until the pod `name` runs. A pod that will not (image pull errors, failed, deleted)
    /// or is not Running by `start_timeout` is an error naming the pod, the image and why.
    pub async fn wait_running(&self, name: &str, image: &str) -> Result<()> {
        let limit = self.config.options.start_timeout;
        let deadline = Instant::now() + limit;
        let fail = |why: &str| {
            anyhow::anyhow!(
                "the pod {name} (image {image}, namespace {}) did not start: {why}: an infrastructure failure",
                self.namespace
            )
        };
        let mut last = "not seen yet".to_string();
        let mut tries = 0;
        while Instant::now() < deadline {
            let pod = match self.get(name).await {
                Ok(Some(pod)) => pod,
                Ok(None) => return Err(fail("it was deleted")),
                Err(e) => return Err(fail(&format!("reading it: {e}"))),
            };
            match start_state(&pod) {
                StartState::Running => return Ok(()),
                StartState::Failed(why) => return Err(fail(&why)),
                StartState::Waiting(why) => last = why,
            }
            let version = pod.metadata.resource_version.clone().unwrap_or_default();
            match self.watch_until_decided(name, &version, deadline).await {
                Ok(Some(StartState::Running)) => return Ok(()),
                Ok(Some(StartState::Failed(why))) => return Err(fail(&why)),
                Ok(Some(StartState::Waiting(why))) => last = why,
                Ok(None) => {}
                Err(e) if e.retryable() && tries < self.config.retry.attempts => {
                    tokio::time::sleep(backoff(&self.config.retry, tries)).await;
                    tries += 1;
                }
                Err(e) => return Err(fail(&format!("watching it: {e}"))),
            }
        }
        Err(fail(&format!(
            "not Running within {:.0} s (last seen: {last})",
            limit.as_secs_f64()
        )))
    }

    /// Watches the pod from `version` until it runs or fails (returned), the watch ends or
    /// the deadline passes (`None`, or the last waiting state seen).
    async fn watch_until_decided(
        &self,
        name: &str,
        version: &str,
        deadline: Instant,
    ) -> Result<Option<StartState>, CallError> {
        let left = deadline.saturating_duration_since(Instant::now());
        let params = WatchParams::default()
            .fields(&format!("metadata.name={name}"))
            .timeout(left.as_secs().clamp(1, 290) as u32);
        let stream =
            tokio::time::timeout(self.config.api_timeout, self.api.watch(&params, version))
                .await
                .map_err(|_| CallError::Transport("the watch did not answer".into()))?
                .map_err(CallError::from_kube)?;
        let mut stream = std::pin::pin!(stream);
        let mut last = None;
        loop {
            let event = tokio::time::timeout_at(deadline.into(), stream.next()).await;
            let pod = match event {
                Err(_) | Ok(None) => return Ok(last),
                Ok(Some(Err(e))) => return Err(CallError::from_kube(e)),
                Ok(Some(Ok(WatchEvent::Added(pod) | WatchEvent::Modified(pod)))) => pod,
                Ok(Some(Ok(WatchEvent::Deleted(_)))) => {
                    return Ok(Some(StartState::Failed("it was deleted".into())))
                }
                // 410 Gone (the version is too old) and the like: read the pod again.
                Ok(Some(Ok(WatchEvent::Error(_)))) => return Ok(last),
                Ok(Some(Ok(WatchEvent::Bookmark(_)))) => continue,
            };
            match start_state(&pod) {
                StartState::Waiting(why) => last = Some(StartState::Waiting(why)),
                decided => return Ok(Some(decided)),
            }
        }
    }

    /// Deletes the pod `name` with grace period 0 and waits until reading it says 404; a pod
    /// still there after `delete_timeout` is an error.
    pub async fn delete_confirmed(&self, name: &str) -> Result<()> {
        let what = format!("deleting the pod {name}");
        let params = DeleteParams::default().grace_period(0);
        match with_retries(&self.config.retry, self.config.api_timeout, &what, || {
            self.api.delete(name, &params)
        })
        .await
        {
            Ok(_) | Err(CallError::Status(404, _)) => {}
            Err(e) => bail!("{what} in namespace {}: {e}", self.namespace),
        }
        self.confirm_gone(name).await
    }

    async fn confirm_gone(&self, name: &str) -> Result<()> {
        let limit = self.config.delete_timeout;
        let started = Instant::now();
        let mut pause = Duration::from_millis(50);
        loop {
            match self.get(name).await {
                Ok(None) => return Ok(()),
                Ok(Some(_)) => {}
                Err(e) => bail!("cannot confirm that the pod {name} is deleted: {e}"),
            }
            if started.elapsed() >= limit {
                bail!(
                    "the pod {name} is still there {:.0} s after its deletion",
                    limit.as_secs_f64()
                );
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_secs(1));
        }
    }

    /// `Ok(())` while the pod `name` runs; else an error saying it is gone and why.
    pub async fn check_alive(&self, name: &str) -> Result<()> {
        let why = match self.get(name).await {
            Ok(Some(pod)) => match start_state(&pod) {
                StartState::Running if pod.metadata.deletion_timestamp.is_none() => return Ok(()),
                StartState::Running => "it is being deleted".to_string(),
                StartState::Failed(why) | StartState::Waiting(why) => why,
            },
            Ok(None) => "deleted".to_string(),
            Err(e) => format!("reading it failed: {e}"),
        };
        bail!("the pod {name} is gone ({why}): an infrastructure failure, not a command result")
    }
}
