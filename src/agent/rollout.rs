//! Many episodes at once: `tasks x group` episodes on `sandboxes` worker threads. Each worker
//! runs one episode at a time, blocking on the policy (the engine batches every worker's
//! requests on its own thread) and on its sandbox (so the engine never waits on a sandbox).
//! Episodes of one task are queued together, so their shared prompt is computed once and served
//! from the prefix cache.
//!
//! Results come back in (task, sample) order whatever order they finish in; seeds depend on the
//! task id, the sample index and `--seed` only.

use super::episode::{run_episode_until, sandbox_name, Deadline, Episode, EpisodeContext, Finish};
use super::sandbox_pool::{Job, JobQueue, QueueSource};
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

/// Runs `group` episodes of every task, `sandboxes` at a time, `warm_pool` sandboxes started
/// ahead.
pub fn run_episodes(
    ctx: &EpisodeContext<'_>,
    tasks: &[Task],
    group: usize,
    workers: Workers,
    seed: u64,
    label: &str,
) -> Vec<Episode> {
    let next = AtomicUsize::new(0);
    let next_group = || -> anyhow::Result<Option<usize>> {
        Ok(Some(next.fetch_add(1, Ordering::SeqCst)).filter(|&t| t < tasks.len()))
    };
    let plan = GroupPlan {
        tasks,
        group,
        workers,
        seed,
        label,
        deadline: Deadline(None),
    };
    let ran = run_task_groups(ctx, &plan, &next_group).expect("a local list never fails");
    ran.groups
        .into_values()
        .flatten()
        .map(|e| e.expect("no deadline"))
        .collect()
}

/// How many episodes run at once, and how many sandboxes start ahead of them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Workers {
    /// Episodes at once (worker threads, each with its sandbox): `--sandboxes`. Independent of
    /// the engine's batch limit: a worker waiting on a slow command holds a sandbox, never a
    /// batch slot, and more sandboxes than batch slots keep the engine's queue full.
    pub sandboxes: usize,
    /// Sandboxes of the next episodes started while these run (`--warm-pool`; 0: none).
    pub warm_pool: usize,
}

/// What [`run_task_groups`] runs.
pub struct GroupPlan<'a> {
    pub tasks: &'a [Task],
    /// Episodes per task.
    pub group: usize,
    pub workers: Workers,
    pub seed: u64,
    /// The progress line's label.
    pub label: &'a str,
    /// Past it no episode starts, and those running stop (see [`run_episode_until`]).
    pub deadline: Deadline,
}

/// The task groups one process ran.
pub struct GroupsRun {
    /// Per task index: its episodes in sample order; `None` where the deadline stopped one or
    /// came before it started.
    pub groups: BTreeMap<usize, Vec<Option<Episode>>>,
    /// Episodes the deadline stopped while they ran.
    pub stopped: usize,
}

/// Runs whole task groups (a task with its `group` samples) as `next_group` hands them out:
/// a worker that finds nothing queued here pulls the next group and queues its samples, so
/// the group's shared prompt is computed once, and a process with idle workers pulls more.
/// Warm-pool fillers start the queued episodes' sandboxes ahead ([`JobQueue`]).
///
/// ```text
///   next_group() ─► task t ─► queue (t,0) (t,1) ... (t,G-1) ◄─ idle workers take
///                                     └─ fillers start their sandboxes ahead
/// ```
///
/// Past `plan.deadline` no episode starts; while any still runs, the policy's generations are
/// aborted every [`ABORT_SWEEP`] (episodes stop at their next turn at the latest). An error
/// from `next_group` stops the pulling and is returned once the running episodes end.
pub fn run_task_groups(
    ctx: &EpisodeContext<'_>,
    plan: &GroupPlan<'_>,
    next_group: &(dyn Fn() -> anyhow::Result<Option<usize>> + Sync),
) -> anyhow::Result<GroupsRun> {
    let group = plan.group;
    let results: Mutex<BTreeMap<usize, Vec<Option<Episode>>>> = Mutex::new(BTreeMap::new());
    let (stopped, running) = (AtomicUsize::new(0), AtomicUsize::new(0));
    let total = plan.tasks.len() * group;
    let progress = Progress::new(plan.label, total);
    let tally = Mutex::new((0usize, 0usize, 0usize)); // done, resolved, generated tokens
    let on_pull = |t: usize| {
        lock(&results).insert(t, (0..group).map(|_| None).collect());
    };
    let seed_of = |t: usize, sample: usize| episode_seed(plan.seed, &plan.tasks[t].id, sample);
    let name_of = |(t, sample): Job| sandbox_name(&plan.tasks[t], sample, seed_of(t, sample), 0);
    let queue = JobQueue::new(QueueSource {
        tasks: plan.tasks,
        group,
        next_group,
        on_pull: &on_pull,
        warm_pool: plan.workers.warm_pool,
        env: ctx.env,
        sandbox_name: &name_of,
    });
    let next_job = || {
        if plan.deadline.passed() {
            queue.close();
            return None;
        }
        queue.next_job()
    };
    let workers = plan.workers.sandboxes.clamp(1, total.max(1));
    running.store(workers, Ordering::SeqCst);
    std::thread::scope(|scope| {
        if plan.deadline.0.is_some() {
            scope.spawn(|| {
                while running.load(Ordering::SeqCst) > 0 {
                    if plan.deadline.passed() {
                        queue.close();
                        ctx.policy.abort_in_flight();
                    }
                    std::thread::sleep(ABORT_SWEEP);
                }
            });
        }
        for _ in 0..plan.workers.warm_pool.min(total) {
            scope.spawn(|| queue.fill());
        }
        for _ in 0..workers {
            scope.spawn(|| {
                while let Some((t, sample)) = next_job() {
                    let task = &plan.tasks[t];
                    let warm = queue.take_sandbox((t, sample));
                    let seed = seed_of(t, sample);
                    let Some(episode) =
                        run_episode_until(ctx, task, sample, seed, plan.deadline, warm)
                    else {
                        stopped.fetch_add(1, Ordering::SeqCst);
                        continue;
                    };
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
                    lock(&results).get_mut(&t).expect("pulled")[sample] = Some(episode);
                    let rate = tokens as f64 / progress.elapsed().as_secs_f64().max(1e-9);
                    progress.update(done, &format!("resolved {resolved} · {rate:.0} tok/s"));
                }
                if running.fetch_sub(1, Ordering::SeqCst) == 1 {
                    queue.close(); // the last worker: fillers stop
                }
            });
        }
    });
    if let Some(e) = queue.take_failure() {
        return Err(e);
    }
    drop(queue); // closes the sandboxes started ahead that no episode took (a deadline)
    let groups = results.into_inner().unwrap_or_else(|e| e.into_inner());
    let (done, resolved, _) = tally.into_inner().unwrap_or_else(|e| e.into_inner());
    let stopped = stopped.into_inner();
    let past = if plan.deadline.passed() {
        format!("; {stopped} stopped at the deadline")
    } else {
        String::new()
    };
    progress.finish(&format!("resolved {resolved} of {done}{past}"));
    Ok(GroupsRun { groups, stopped })
}

/// How often generations are aborted once the deadline has passed, while episodes still run
/// (one may submit its request just after a sweep).
const ABORT_SWEEP: std::time::Duration = std::time::Duration::from_millis(50);

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
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
        "tampered": episodes.iter().filter(|e| e.tampered()).count(),
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
    // Sandbox start-up (setup included): what episodes waited for, and what a warm pool
    // started while other episodes ran.
    times.insert("startup_exposed".into(), json!(sum(|e| e.sandbox_wait_s)));
    times.insert(
        "startup_hidden".into(),
        json!(sum(|e| (e.sandbox_start_s - e.sandbox_wait_s).max(0.0))),
    );
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
