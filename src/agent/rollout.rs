//! Many episodes at once: `tasks x group` episodes on `concurrency` worker threads. Each worker
//! runs one episode at a time, blocking on the policy (the engine batches every worker's
//! requests on its own thread) and on its sandbox (so the engine never waits on a sandbox).
//! Episodes of one task are queued together, so their shared prompt is computed once and served
//! from the prefix cache.
//!
//! Results come back in (task, sample) order whatever order they finish in; seeds depend on the
//! task id, the sample index and `--seed` only.

use super::episode::{run_episode, Episode, EpisodeContext, Finish};
use crate::env::Task;
use crate::progress::Progress;
use crate::rng::{Rng, SplitMix64};
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// The first SplitMix64 output for seed `z`: episode seeds from (seed, task id, sample).
fn mix(z: u64) -> u64 {
    SplitMix64::new(z).next_u64()
}

pub fn episode_seed(seed: u64, task_id: &str, sample: usize) -> u64 {
    let mut h = mix(seed);
    for b in task_id.bytes() {
        h = mix(h ^ b as u64);
    }
    mix(h ^ (sample as u64).wrapping_mul(0xD6E8_FEB8_6659_FD93))
}

/// Runs `group` episodes of every task, `concurrency` at a time.
pub fn run_episodes(
    ctx: &EpisodeContext<'_>,
    tasks: &[Task],
    group: usize,
    concurrency: usize,
    seed: u64,
    label: &str,
) -> Vec<Episode> {
    let jobs: Vec<(usize, usize)> = (0..tasks.len())
        .flat_map(|t| (0..group).map(move |s| (t, s)))
        .collect();
    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<Option<Episode>>> = Mutex::new((0..jobs.len()).map(|_| None).collect());
    let progress = Progress::new(label, jobs.len());
    let tally = Mutex::new((0usize, 0usize, 0usize)); // done, resolved, generated tokens
    std::thread::scope(|scope| {
        for _ in 0..concurrency.clamp(1, jobs.len().max(1)) {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::SeqCst);
                let Some(&(t, sample)) = jobs.get(i) else {
                    break;
                };
                let task = &tasks[t];
                let episode = run_episode(ctx, task, sample, episode_seed(seed, &task.id, sample));
                let (done, resolved, tokens) = {
                    let mut tally = tally.lock().unwrap_or_else(|e| e.into_inner());
                    tally.0 += 1;
                    tally.1 += episode.resolved as usize;
                    tally.2 += episode.generated;
                    *tally
                };
                if let Finish::Error(message) = &episode.finish {
                    eprintln!("\nepisode {} #{sample} failed: {message}", task.id);
                }
                results.lock().unwrap_or_else(|e| e.into_inner())[i] = Some(episode);
                let rate = tokens as f64 / progress.elapsed().as_secs_f64().max(1e-9);
                progress.update(done, &format!("resolved {resolved} · {rate:.0} tok/s"));
            });
        }
    });
    let episodes: Vec<Episode> = results
        .into_inner()
        .unwrap_or_else(|e| e.into_inner())
        .into_iter()
        .map(|e| e.expect("every job ran"))
        .collect();
    let resolved = episodes.iter().filter(|e| e.resolved).count();
    progress.finish(&format!("resolved {resolved} of {}", episodes.len()));
    episodes
}

/// Unbiased pass@k from n samples with c successes (Chen et al., 2021): 1 - C(n-c, k) / C(n, k).
pub fn pass_at_k(n: usize, c: usize, k: usize) -> f64 {
    if k > n || n == 0 {
        return f64::NAN;
    }
    if n - c < k {
        return 1.0;
    }
    let mut fail = 1.0;
    for i in (n - c + 1)..=n {
        fail *= 1.0 - k as f64 / i as f64;
    }
    1.0 - fail
}

/// The figures every report of a set of episodes carries (`rollout.json`, `eval.json`, each line
/// of `iterations.jsonl`): counts, rates, tokens and how episodes finished.
pub fn episode_stats(episodes: &[Episode]) -> Map<String, Value> {
    let n = episodes.len().max(1) as f64;
    let mut finishes: BTreeMap<&str, usize> = BTreeMap::new();
    for e in episodes {
        *finishes.entry(e.finish.as_str()).or_default() += 1;
    }
    let resolved = episodes.iter().filter(|e| e.resolved).count();
    let stats = json!({
        "episodes": episodes.len(),
        "resolved": resolved,
        "resolved_rate": resolved as f64 / n,
        "mean_reward": episodes.iter().map(|e| e.reward).sum::<f64>() / n,
        "mean_turns": episodes.iter().map(|e| e.turns as f64).sum::<f64>() / n,
        "format_errors": episodes.iter().map(|e| e.format_errors).sum::<usize>(),
        "infrastructure_failures": infrastructure_failures(episodes),
        "infrastructure_retries": episodes.iter().map(|e| e.infra_retries).sum::<usize>(),
        "suspicious": suspicious_count(episodes),
        "generated_tokens": episodes.iter().map(|e| e.generated).sum::<usize>(),
        "action_tokens": episodes.iter().map(Episode::action_tokens).sum::<usize>(),
        "finish": finishes,
    });
    match stats {
        Value::Object(map) => map,
        _ => unreachable!("a JSON object literal"),
    }
}

/// Seconds the episodes spent generating, in their environments and being graded (summed over
/// episodes: concurrent ones count each).
pub fn episode_times(episodes: &[Episode]) -> Map<String, Value> {
    let sum = |f: fn(&Episode) -> f64| episodes.iter().map(f).sum::<f64>();
    let mut times = Map::new();
    times.insert("generation".into(), json!(sum(|e| e.generation_s)));
    times.insert("environment".into(), json!(sum(|e| e.environment_s)));
    times.insert("grading".into(), json!(sum(|e| e.grading_s)));
    times
}

/// [`episode_stats`], times, pass@k and a per-task table.
pub fn summarize(tasks: &[Task], episodes: &[Episode], group: usize) -> Value {
    let mut per_task = Vec::new();
    let mut pass = vec![0.0; group + 1];
    for task in tasks {
        let mine: Vec<&Episode> = episodes.iter().filter(|e| e.task_id == task.id).collect();
        let c = mine.iter().filter(|e| e.resolved).count();
        for (k, p) in pass.iter_mut().enumerate().skip(1) {
            *p += pass_at_k(mine.len(), c, k);
        }
        per_task.push(json!({
            "task": task.id,
            "samples": mine.len(),
            "resolved": c,
            "mean_turns": mine.iter().map(|e| e.turns as f64).sum::<f64>() / mine.len().max(1) as f64,
            "mean_reward": mine.iter().map(|e| e.reward).sum::<f64>() / mine.len().max(1) as f64,
        }));
    }
    let mut out = json!({"tasks": tasks.len(), "group": group});
    out.as_object_mut()
        .expect("an object")
        .extend(episode_stats(episodes));
    out["time_s"] = Value::Object(episode_times(episodes));
    out["per_task"] = json!(per_task);
    for k in 1..=group {
        // pass@1 and pass@group always; powers of two between.
        if k == 1 || k == group || k.is_power_of_two() {
            out[format!("pass@{k}")] = json!(pass[k] / tasks.len().max(1) as f64);
        }
    }
    out
}

/// Episodes given up on an infrastructure failure (dropped from training).
pub fn infrastructure_failures(episodes: &[Episode]) -> usize {
    episodes
        .iter()
        .filter(|e| matches!(e.finish, super::episode::Finish::Error(_)))
        .count()
}

/// Episodes whose change is flagged as a likely attempt at the reward.
pub fn suspicious_count(episodes: &[Episode]) -> usize {
    episodes
        .iter()
        .filter(|e| e.patch.as_ref().is_some_and(|d| !d.suspicious.is_empty()))
        .count()
}

/// The per-task table and the headline figures, for the terminal.
pub fn print_summary(summary: &Value) {
    println!(
        "{:<32} {:>7} {:>8} {:>10} {:>11}",
        "task", "samples", "resolved", "mean turns", "mean reward"
    );
    for row in summary["per_task"].as_array().into_iter().flatten() {
        println!(
            "{:<32} {:>7} {:>8} {:>10.1} {:>11.3}",
            row["task"].as_str().unwrap_or(""),
            row["samples"],
            row["resolved"],
            row["mean_turns"].as_f64().unwrap_or(0.0),
            row["mean_reward"].as_f64().unwrap_or(0.0)
        );
    }
    let group = summary["group"].as_u64().unwrap_or(1);
    let pass_k = if group > 1 {
        format!(
            "; pass@{group} {:.3}",
            summary[format!("pass@{group}")]
                .as_f64()
                .unwrap_or(f64::NAN)
        )
    } else {
        String::new()
    };
    println!(
        "resolved {} of {} episodes ({:.1}%); pass@1 {:.3}{pass_k}; mean turns {:.2}; finish {}",
        summary["resolved"],
        summary["episodes"],
        100.0 * summary["resolved_rate"].as_f64().unwrap_or(0.0),
        summary["pass@1"].as_f64().unwrap_or(f64::NAN),
        summary["mean_turns"].as_f64().unwrap_or(0.0),
        summary["finish"]
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pass_at_k_matches_the_closed_form() {
        assert_eq!(pass_at_k(10, 0, 1), 0.0);
        assert!((pass_at_k(10, 3, 1) - 0.3).abs() < 1e-12);
        // 1 - C(7,2)/C(10,2) = 1 - 21/45
        assert!((pass_at_k(10, 3, 2) - (1.0 - 21.0 / 45.0)).abs() < 1e-12);
        assert_eq!(pass_at_k(10, 9, 2), 1.0);
        assert_eq!(pass_at_k(4, 4, 4), 1.0);
        assert!(pass_at_k(2, 1, 3).is_nan());
    }

    #[test]
    fn seeds_depend_on_task_sample_and_seed_only() {
        assert_eq!(episode_seed(1, "a", 0), episode_seed(1, "a", 0));
        assert_ne!(episode_seed(1, "a", 0), episode_seed(1, "a", 1));
        assert_ne!(episode_seed(1, "a", 0), episode_seed(1, "b", 0));
        assert_ne!(episode_seed(1, "a", 0), episode_seed(2, "a", 0));
    }
}
