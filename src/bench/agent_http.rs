//! `swerve-bench agent --http`: the agent workload of [`super::agent`] through `swerve-serve`'s
//! OpenAI API, as an agent scaffold drives it: one client thread per rollout, each turn a
//! `/v1/completions` request carrying the rollout's whole token history (`prompt` as token ids,
//! `ignore_eos`, its own seed), the answer's `token_ids` appended with the next observation.
//!
//! Reported next to the in-process run on the same model and workload: generated tokens/s,
//! prefix-cache hit rate (from `/metrics`), and **host time per generated token**: wall time
//! minus the engine's model time (`swerve_engine_model_seconds_total`), over the tokens
//! generated. In process that is the engine's scheduling and bookkeeping; through HTTP it adds
//! request parsing, JSON, sockets and the engine's idle gaps between a turn's answer and the
//! client's next request.

use super::agent::AgentWorkload;
use crate::http_client::http_request;
use anyhow::{anyhow, bail, ensure, Context, Result};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Instant;

/// `swerve-serve` as a child process, killed when dropped.
pub struct ServeProcess {
    child: Child,
    pub addr: SocketAddr,
}

impl ServeProcess {
    /// Starts `bin` with `args` (which should include `--port 0`) and waits for the address it
    /// prints; the server's stderr goes to ours.
    pub fn start(bin: &Path, args: &[String]) -> Result<Self> {
        let mut child = Command::new(bin)
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .with_context(|| format!("cannot start {}", bin.display()))?;
        let stdout = child.stdout.take().expect("stdout is piped");
        let mut lines = BufReader::new(stdout);
        let mut line = String::new();
        loop {
            line.clear();
            if lines.read_line(&mut line)? == 0 {
                let status = child.wait()?;
                bail!("{} exited ({status}) before listening", bin.display());
            }
            if let Some(rest) = line.split("listening on http://").nth(1) {
                let addr = rest
                    .split_whitespace()
                    .next()
                    .and_then(|a| a.parse().ok())
                    .ok_or_else(|| anyhow!("cannot read the address in {line:?}"))?;
                // Keep draining stdout so the server never blocks on a full pipe.
                std::thread::spawn(move || std::io::copy(&mut lines, &mut std::io::sink()));
                return Ok(Self { child, addr });
            }
        }
    }
}

impl Drop for ServeProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The server's `/metrics` as (name, first sample value) pairs.
fn metrics(addr: SocketAddr) -> Result<Vec<(String, f64)>> {
    let (status, body) = http_request(&addr.to_string(), "GET", "/metrics", &[], None)?;
    ensure!(status == 200, "GET /metrics: status {status}");
    Ok(String::from_utf8_lossy(&body)
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let mut parts = l.split_whitespace();
            let name = parts.next()?.to_string();
            Some((name, parts.next()?.parse().ok()?))
        })
        .collect())
}

fn metric(samples: &[(String, f64)], name: &str) -> Result<f64> {
    samples
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| *v)
        .ok_or_else(|| anyhow!("the server's /metrics has no {name}"))
}

#[derive(Clone, Debug)]
pub struct HttpAgentReport {
    pub rollouts: usize,
    pub turns: usize,
    pub generated_tokens: u64,
    pub seconds: f64,
    pub tokens_per_second: f64,
    pub prefix_hit_rate: f64,
    /// (wall time - the engine's model time) / generated tokens.
    pub host_seconds_per_token: f64,
}

/// Runs `workload` against the server at `addr` (serving `model` with a `vocab`-token
/// vocabulary and contexts up to `max_context`), one client thread per rollout.
pub fn run_http(
    addr: SocketAddr,
    model: &str,
    workload: &AgentWorkload,
    vocab: usize,
    max_context: usize,
) -> Result<HttpAgentReport> {
    let limit = max_context.min(workload.max_context);
    ensure!(
        workload.prompt_tokens + workload.gen_tokens <= limit,
        "agent workload: prompt {} + turn {} exceed the context {limit}",
        workload.prompt_tokens,
        workload.gen_tokens
    );
    let before = metrics(addr)?;
    let started = Instant::now();
    let rollouts = workload.tasks * workload.group;
    let threads: Vec<_> = (0..rollouts)
        .map(|rollout| {
            let w = workload.clone();
            let model = model.to_string();
            std::thread::spawn(move || -> Result<(usize, u64)> {
                let task = rollout / w.group;
                let mut history =
                    super::agent::pseudo_tokens(task as u64 + 1, w.prompt_tokens, vocab);
                let (mut turns, mut generated) = (0usize, 0u64);
                while history.len() + w.gen_tokens <= limit {
                    let body = json!({
                        "model": model,
                        "prompt": history,
                        "max_tokens": w.gen_tokens,
                        "temperature": 1.0,
                        "seed": rollout * 1000 + turns,
                        "ignore_eos": true,
                    });
                    let (status, answer) = http_request(
                        &addr.to_string(),
                        "POST",
                        "/v1/completions",
                        &[],
                        Some(&body),
                    )?;
                    let answer: Value = serde_json::from_slice(&answer)
                        .with_context(|| format!("rollout {rollout}: the answer is not JSON"))?;
                    ensure!(
                        status == 200,
                        "rollout {rollout}: status {status}: {answer}"
                    );
                    let choice = &answer["choices"][0];
                    let ids: Vec<u32> = choice["token_ids"]
                        .as_array()
                        .ok_or_else(|| anyhow!("rollout {rollout}: no token_ids in {answer}"))?
                        .iter()
                        .filter_map(|v| v.as_u64().map(|x| x as u32))
                        .collect();
                    ensure!(
                        choice["finish_reason"] == "length" && ids.len() == w.gen_tokens,
                        "rollout {rollout}: turn ended with {} after {} tokens",
                        choice["finish_reason"],
                        ids.len()
                    );
                    generated += ids.len() as u64;
                    history.extend(ids);
                    turns += 1;
                    // The same observation as the in-process run's after this turn.
                    history.extend(super::agent::pseudo_tokens(
                        (rollout * 7919 + turns) as u64,
                        w.obs_tokens,
                        vocab,
                    ));
                }
                Ok((turns, generated))
            })
        })
        .collect();
    let (mut turns, mut generated) = (0usize, 0u64);
    for t in threads {
        let (n, g) = t
            .join()
            .map_err(|_| anyhow!("a rollout client thread panicked"))??;
        turns += n;
        generated += g;
    }
    let seconds = started.elapsed().as_secs_f64();
    let after = metrics(addr)?;
    let delta = |name: &str| -> Result<f64> { Ok(metric(&after, name)? - metric(&before, name)?) };
    let model_seconds = delta("swerve_engine_model_seconds_total")?;
    let queried = delta("swerve_prefix_cache_queried_tokens_total")?.max(1.0);
    Ok(HttpAgentReport {
        rollouts,
        turns,
        generated_tokens: generated,
        seconds,
        tokens_per_second: generated as f64 / seconds,
        prefix_hit_rate: delta("swerve_prefix_cache_hit_tokens_total")? / queried,
        host_seconds_per_token: (seconds - model_seconds).max(0.0) / generated.max(1) as f64,
    })
}

pub fn print_http_report(r: &HttpAgentReport) {
    println!(
        "through HTTP: rollouts {}, turns {}, generated {} tokens in {:.1} s: {:.0} tokens/s",
        r.rollouts, r.turns, r.generated_tokens, r.seconds, r.tokens_per_second
    );
    println!(
        "through HTTP: prefix-cache hit rate {:.1}%, host time per generated token {:.1} us",
        100.0 * r.prefix_hit_rate,
        r.host_seconds_per_token * 1e6
    );
}
