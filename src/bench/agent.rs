//! `swerve-bench agent`: an agent-shaped rollout workload through the engine, in process.
//!
//! `tasks` tasks, each with `group` rollouts (GRPO/DAPO groups) sharing the task's prompt. A
//! rollout is a multi-turn loop: generate `gen_tokens` (temperature 1, its own seed, no stop
//! token), append an `obs_tokens` observation (deterministic pseudo-random ids, as a tool's output
//! would be), submit the whole history again, until the next turn would pass `max_context`. Every
//! turn after the first should find its history in the prefix cache, and every rollout after the
//! first of its group should find the task prompt there.
//!
//! Reported: generated tokens/s, prefix-cache hit rate (hit / looked-up prompt tokens), steps and
//! mean step time split into model work and host overhead.

use crate::backend::Backend;
use crate::engine::{Engine, EngineEvent, GenerationRequest, SamplingParams};
use anyhow::{ensure, Result};
use std::collections::HashMap;
use std::time::Instant;

#[derive(Clone, Debug)]
pub struct AgentWorkload {
    pub tasks: usize,
    pub group: usize,
    pub prompt_tokens: usize,
    pub gen_tokens: usize,
    pub obs_tokens: usize,
    pub max_context: usize,
}

impl AgentWorkload {
    /// The shape: 8 tasks x 10 rollouts, ~300-token turns, ~1,000-token observations.
    pub fn full(max_context: usize) -> Self {
        Self {
            tasks: 8,
            group: 10,
            prompt_tokens: 2000,
            gen_tokens: 300,
            obs_tokens: 1000,
            max_context,
        }
    }

    /// Scaled down for the CPU backend (a few minutes with the default model on two cores).
    pub fn cpu() -> Self {
        Self {
            tasks: 2,
            group: 4,
            prompt_tokens: 192,
            gen_tokens: 24,
            obs_tokens: 64,
            max_context: 640,
        }
    }

    pub fn describe(&self) -> String {
        format!(
            "{} tasks x {} rollouts, prompt {}, turns of {} generated + {} observation tokens, context to {}",
            self.tasks, self.group, self.prompt_tokens, self.gen_tokens, self.obs_tokens, self.max_context
        )
    }
}

#[derive(Clone, Debug)]
pub struct AgentReport {
    pub rollouts: usize,
    pub turns: usize,
    pub generated_tokens: u64,
    pub seconds: f64,
    pub tokens_per_second: f64,
    pub prefix_hit_rate: f64,
    pub steps: u64,
    pub mean_step_ms: f64,
    pub host_overhead_fraction: f64,
    pub preemptions: u64,
    /// (wall time - the engine's model time) / generated tokens.
    pub host_seconds_per_token: f64,
}

pub(crate) fn pseudo_tokens(seed: u64, n: usize, vocab: usize) -> Vec<u32> {
    use crate::rng::{Rng, XorShift64};
    let mut rng = XorShift64::new(seed);
    (0..n).map(|_| rng.below(vocab) as u32).collect()
}

/// Runs the workload to completion on `engine` (which should start empty).
pub fn run<B: Backend>(engine: &mut Engine<B>, workload: &AgentWorkload) -> Result<AgentReport> {
    let vocab = engine.model.config.vocab_size;
    let limit = engine.config().max_model_len.min(workload.max_context);
    ensure!(
        workload.prompt_tokens + workload.gen_tokens <= limit,
        "agent workload: prompt {} + turn {} exceed the context {limit}",
        workload.prompt_tokens,
        workload.gen_tokens
    );
    let before = engine.stats();
    let started = Instant::now();
    // request id -> (rollout index, history before this turn)
    let mut in_flight: HashMap<u64, (usize, Vec<u32>)> = HashMap::new();
    let submit = |engine: &mut Engine<B>, rollout: usize, history: Vec<u32>, turn: usize| {
        let request = GenerationRequest {
            prompt: history.clone(),
            params: SamplingParams {
                seed: Some((rollout * 1000 + turn) as u64),
                ..Default::default()
            },
            max_tokens: workload.gen_tokens,
            stop_ids: vec![],
            prompt_logprobs: None,
        };
        engine
            .add_request(request)
            .map(|id| (id, (rollout, history)))
    };
    let mut turns_done = vec![0usize; workload.tasks * workload.group];
    for task in 0..workload.tasks {
        let prompt = pseudo_tokens(task as u64 + 1, workload.prompt_tokens, vocab);
        for g in 0..workload.group {
            let rollout = task * workload.group + g;
            let (id, entry) = submit(engine, rollout, prompt.clone(), 0)?;
            in_flight.insert(id, entry);
        }
    }
    while engine.has_unfinished() {
        for event in engine.step()? {
            let EngineEvent::Finished(record) = event else {
                continue;
            };
            let (rollout, mut history) = in_flight
                .remove(&record.id)
                .expect("every request is a rollout turn");
            ensure!(
                record.finish_reason.as_str() == "length",
                "rollout {rollout}: turn ended with {:?}",
                record.finish_reason
            );
            turns_done[rollout] += 1;
            history.extend(&record.output_tokens);
            history.extend(pseudo_tokens(
                (rollout * 7919 + turns_done[rollout]) as u64,
                workload.obs_tokens,
                vocab,
            ));
            if history.len() + workload.gen_tokens <= limit {
                let (id, entry) = submit(engine, rollout, history, turns_done[rollout])?;
                in_flight.insert(id, entry);
            }
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    let after = engine.stats();
    let generated = after.generated_tokens - before.generated_tokens;
    let steps = after.steps - before.steps;
    let step_seconds = after.total_step_seconds - before.total_step_seconds;
    let model_seconds = after.total_model_seconds - before.total_model_seconds;
    let queries = (after.prefix_query_tokens - before.prefix_query_tokens).max(1);
    Ok(AgentReport {
        rollouts: workload.tasks * workload.group,
        turns: turns_done.iter().sum(),
        generated_tokens: generated,
        seconds,
        tokens_per_second: generated as f64 / seconds,
        prefix_hit_rate: (after.prefix_hit_tokens - before.prefix_hit_tokens) as f64
            / queries as f64,
        steps,
        mean_step_ms: step_seconds / steps.max(1) as f64 * 1e3,
        host_overhead_fraction: if step_seconds > 0.0 {
            (step_seconds - model_seconds) / step_seconds
        } else {
            0.0
        },
        preemptions: after.preemptions - before.preemptions,
        host_seconds_per_token: (seconds - model_seconds).max(0.0) / generated.max(1) as f64,
    })
}

pub fn print_report(r: &AgentReport) {
    println!(
        "rollouts {}, turns {}, generated {} tokens in {:.1} s: {:.0} tokens/s",
        r.rollouts, r.turns, r.generated_tokens, r.seconds, r.tokens_per_second
    );
    println!(
        "prefix-cache hit rate {:.1}%, {} steps, mean step {:.2} ms ({:.1}% host overhead), {} preemptions",
        100.0 * r.prefix_hit_rate,
        r.steps,
        r.mean_step_ms,
        100.0 * r.host_overhead_fraction,
        r.preemptions
    );
    println!(
        "host time per generated token {:.1} us (wall time minus model time)",
        r.host_seconds_per_token * 1e6
    );
}
