//! One `rl` iteration and the RFT phase before the first: rollouts, the trainer's steps over
//! them, the handoff of new weights to the rollouts, the iteration's line and checkpoint.

use super::{plot, shuffled, tasks_of_iteration, RlOptions};
use crate::agent::episode::{Episode, EpisodeContext, Finish};
use crate::agent::policy::ServerPolicy;
use crate::agent::rollout::{episode_seed, run_episodes};
use crate::dist::Collectives;
use crate::engine::EngineHandle;
use crate::env::Task;
use crate::train::data::{group_advantages, GroupReward, TrainSequence, Trajectory};
use crate::train::group::Trainer;
use crate::train::loss::Objective;
use crate::train::run_dir::RecordedOptions;
use crate::train::trainer::append_line;
use anyhow::{Context, Result};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

/// Where rollouts come from, and how new weights reach them.
pub(crate) enum Sampler {
    Engine(Arc<EngineHandle>),
    Server { policy: ServerPolicy, url: String },
}

/// What training did with an iteration's episodes.
struct Trained {
    kept: usize,
    action_tokens: usize,
    /// max and mean rollout-vs-trainer logprob gap.
    gap: (f64, f64),
}

/// One iteration's line of `iterations.jsonl`.
fn iteration_line(
    (iteration, phase): (usize, &str),
    episodes: &[Episode],
    trained: Trained,
    times: &Value,
    weight_version: u64,
) -> Value {
    let Trained {
        kept,
        action_tokens,
        gap,
    } = trained;
    let n = episodes.len().max(1) as f64;
    let mut finish = serde_json::Map::new();
    for e in episodes {
        let count = finish.entry(e.finish.as_str()).or_insert(json!(0));
        *count = json!(count.as_u64().unwrap_or(0) + 1);
    }
    json!({
        "iteration": iteration,
        "phase": phase,
        "episodes": episodes.len(),
        "reward_mean": episodes.iter().map(|e| e.reward).sum::<f64>() / n,
        "resolved_rate": episodes.iter().filter(|e| e.resolved).count() as f64 / n,
        "mean_turns": episodes.iter().map(|e| e.turns as f64).sum::<f64>() / n,
        "format_errors": episodes.iter().map(|e| e.format_errors).sum::<usize>(),
        "finish": finish,
        "infrastructure_failures": crate::agent::rollout::infrastructure_failures(episodes),
        "infrastructure_retries": episodes.iter().map(|e| e.infra_retries).sum::<usize>(),
        "suspicious": crate::agent::rollout::suspicious_count(episodes),
        "trajectories_kept": kept,
        "trajectories_dropped": episodes.len() - kept,
        "action_tokens": action_tokens,
        "logprob_gap_max": gap.0,
        "logprob_gap_mean": gap.1,
        "time_s": times,
        "weight_version": weight_version,
    })
}

/// An episode as the trainer's trajectory (its group is its task).
pub(crate) fn trajectory(e: &Episode) -> Option<Trajectory> {
    let t = e.transcript.as_ref()?;
    if matches!(e.finish, Finish::Error(_)) || t.tokens.len() < 2 {
        return None;
    }
    Some(Trajectory {
        location: format!("task {} sample {}", e.task_id, e.sample),
        group: Some(e.task_id.clone()),
        tokens: t.tokens.clone(),
        action_mask: t.action_mask.iter().map(|&m| m == 1).collect(),
        rollout_logprobs: t.sampled.then(|| t.logprobs.clone()),
        reward: Some(e.reward),
    })
}

/// Where a run stands: what the next iteration starts from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Progress {
    /// Optimizer steps taken (RFT's included).
    pub step: u64,
    /// Weight updates handed to the rollouts since the base model.
    pub weight_version: u64,
}

/// The iterations' fixed parts and what they update.
pub(crate) struct Loop<'a, T: Trainer> {
    pub options: &'a RlOptions,
    pub learner: T,
    pub sampler: &'a Sampler,
    pub ctx: &'a EpisodeContext<'a>,
    pub tasks: &'a [Task],
    pub model_dir: &'a Path,
    pub record: &'a RecordedOptions,
    pub progress: Progress,
    /// Every iteration's line so far (for the reward plot).
    pub history: Vec<Value>,
    /// The other processes of a multi-node run (one per node), which share each iteration's
    /// rollouts; `None` in one process.
    pub processes: Option<&'a dyn Collectives>,
}

impl<T: Trainer> Loop<'_, T> {
    fn out(&self) -> &Path {
        &self.options.agent.out
    }

    /// Whether this process writes the run's files (the first of a multi-node run).
    fn writer(&self) -> bool {
        self.processes.is_none_or(|p| p.rank() == 0)
    }

    /// `group` episodes of every task, in the order [`run_episodes`] gives. Across processes each
    /// runs the tasks `i` with `i % processes == rank` on its own engine, and they exchange their
    /// episodes: every process ends with all of them, in the same order. An episode's seed
    /// depends on its task and sample only, so where it runs changes nothing.
    fn rollouts(
        &self,
        tasks: &[Task],
        group: usize,
        seed: u64,
        label: &str,
    ) -> Result<Vec<Episode>> {
        let concurrency = self.options.agent.concurrency;
        let Some(processes) = self.processes.filter(|p| p.size() > 1) else {
            return Ok(run_episodes(
                self.ctx,
                tasks,
                group,
                concurrency,
                seed,
                label,
            ));
        };
        let (rank, size) = (processes.rank(), processes.size());
        let mine: Vec<Task> = tasks.iter().skip(rank).step_by(size).cloned().collect();
        let episodes = run_episodes(self.ctx, &mine, group, concurrency, seed, label);
        let bytes = serde_json::to_vec(&episodes).context("serialising this process's episodes")?;
        let mut shares = Vec::with_capacity(size);
        for (r, part) in processes.all_gather_bytes(&bytes)?.iter().enumerate() {
            let share: Vec<Episode> = serde_json::from_slice(part)
                .with_context(|| format!("the episodes of process {r}"))?;
            shares.push(share.into_iter());
        }
        let mut all = Vec::with_capacity(tasks.len() * group);
        for t in 0..tasks.len() {
            let share = &mut shares[t % size];
            for _ in 0..group {
                all.push(
                    share
                        .next()
                        .context("a process returned too few episodes")?,
                );
            }
        }
        Ok(all)
    }

    /// `--rft-first K`: K rollouts per task with the base model, then RFT on the resolved ones;
    /// its line is iteration 0.
    pub fn rft_phase(&mut self, k: usize) -> Result<()> {
        let (options, agent) = (self.options, &self.options.agent);
        let started = Instant::now();
        let episodes = self.rollouts(self.tasks, k, agent.seed ^ 0x0052_4654, "rft rollouts")?;
        let rollout_s = started.elapsed().as_secs_f64();
        let resolved: Vec<TrainSequence> = episodes
            .iter()
            .filter(|e| e.resolved)
            .filter_map(trajectory)
            .map(|t| TrainSequence::from_trajectory(&t, 1.0))
            .collect();
        let train_started = Instant::now();
        let mut action_tokens = 0;
        if resolved.is_empty() {
            eprintln!("rl: --rft-first {k}: no rollout resolved its task; DAPO starts from the base model");
        }
        for epoch in 0..options.rft_epochs {
            if resolved.is_empty() {
                break;
            }
            let order = shuffled(resolved.len(), agent.seed ^ 0x0052_4654 ^ epoch as u64);
            for chunk in order.chunks(options.batch_size) {
                let batch: Vec<&TrainSequence> = chunk.iter().map(|&i| &resolved[i]).collect();
                let olds: Vec<&[f32]> = vec![&[]; batch.len()];
                let report =
                    self.learner
                        .step(&batch, &olds, &Objective::MaskedCe, options.rft_lr)?;
                action_tokens += report.metrics["action_tokens"].as_u64().unwrap_or(0) as usize;
                self.progress.step += 1;
                if self.writer() {
                    let metrics = self.out().join("metrics.jsonl");
                    append_step(&metrics, self.progress.step, 0, report.metrics)?;
                }
            }
        }
        let training_s = train_started.elapsed().as_secs_f64();
        let handoff_s = handoff(&self.learner, self.sampler, self.model_dir, self.out())?;
        self.progress.weight_version += 1;
        let line = iteration_line(
            (0, "rft"),
            &episodes,
            Trained {
                kept: resolved.len(),
                action_tokens,
                gap: (0.0, 0.0),
            },
            &json!({"rollout": rollout_s, "environment": env_time(&episodes), "grading": grade_time(&episodes), "training": training_s, "handoff": handoff_s}),
            self.progress.weight_version,
        );
        if self.writer() {
            append_line(&self.out().join("iterations.jsonl"), &line)?;
        }
        self.history.push(line);
        self.checkpoint(0)?;
        Ok(())
    }

    /// Iteration `iteration` (1-based): rollouts, group advantages, DAPO steps, handoff, line,
    /// plot, and a checkpoint every `--save-every`.
    pub fn iteration(&mut self, iteration: usize) -> Result<()> {
        let (options, agent) = (self.options, &self.options.agent);
        let picked: Vec<Task> = tasks_of_iteration(
            self.tasks.len(),
            options.tasks_per_iteration,
            agent.seed,
            iteration,
        )
        .into_iter()
        .map(|i| self.tasks[i].clone())
        .collect();
        let picked = dedup_groups(picked);
        let started = Instant::now();
        let label = format!("iteration {iteration}/{}", options.iterations);
        let seed = episode_seed(agent.seed, "iteration", iteration);
        let episodes = self.rollouts(&picked, agent.group, seed, &label)?;
        let rollout_s = started.elapsed().as_secs_f64();
        let train_started = Instant::now();
        // The engine's KV cache gives its memory to the trainer while it runs.
        if let Sampler::Engine(handle) = self.sampler {
            handle.release_kv_cache()?;
        }
        let trained = self.train_on(iteration, &episodes)?;
        let training_s = train_started.elapsed().as_secs_f64();
        let handoff_s = if trained.kept == 0 {
            0.0
        } else {
            self.progress.weight_version += 1;
            handoff(&self.learner, self.sampler, self.model_dir, self.out())?
        };
        let restore_started = Instant::now();
        if let Sampler::Engine(handle) = self.sampler {
            // The trainer's gradients give their memory to the rollouts (the next step
            // allocates them again).
            self.learner.release_gradients()?;
            handle.restore_kv_cache()?;
        }
        let kv_restore_s = restore_started.elapsed().as_secs_f64();
        let (kept, gap) = (trained.kept, trained.gap);
        let line = iteration_line(
            (iteration, "dapo"),
            &episodes,
            trained,
            &json!({"rollout": rollout_s, "environment": env_time(&episodes), "grading": grade_time(&episodes), "training": training_s, "handoff": handoff_s, "kv_cache_restore": kv_restore_s}),
            self.progress.weight_version,
        );
        if self.writer() {
            append_line(&self.out().join("iterations.jsonl"), &line)?;
        }
        eprintln!(
            "iteration {iteration}: reward {:.3} resolved {:.3} turns {:.2} kept {}/{} gap {:.1e} | rollout {:.1}s train {:.1}s handoff {:.3}s",
            line["reward_mean"].as_f64().unwrap_or(0.0),
            line["resolved_rate"].as_f64().unwrap_or(0.0),
            line["mean_turns"].as_f64().unwrap_or(0.0),
            kept,
            episodes.len(),
            gap.0,
            rollout_s,
            training_s,
            handoff_s
        );
        self.history.push(line);
        if self.writer() {
            plot::write_reward_plot(&self.out().join("reward.png"), &self.history)?;
            eprintln!("{}", plot::sparkline(&self.history));
        }
        if options.save_every > 0
            && (iteration.is_multiple_of(options.save_every) || iteration == options.iterations)
        {
            self.checkpoint(iteration)?;
        }
        Ok(())
    }

    /// DAPO over an iteration's episodes: group advantages, A = 0 dropped, `logp_old` the
    /// trainer's own logprobs under the weights that produced the rollouts, then optimizer
    /// steps in seeded batches.
    fn train_on(&mut self, iteration: usize, episodes: &[Episode]) -> Result<Trained> {
        let (options, agent) = (self.options, &self.options.agent);
        let trajectories: Vec<Trajectory> = episodes.iter().filter_map(trajectory).collect();
        let groups: Vec<GroupReward<'_>> = trajectories
            .iter()
            .map(|t| GroupReward {
                group: t.group.as_deref(),
                reward: t.reward,
            })
            .collect();
        let advantages = group_advantages(&groups, |i| trajectories[i].location.clone())?;
        let kept: Vec<TrainSequence> = trajectories
            .iter()
            .zip(&advantages)
            .filter(|(_, &a)| a != 0.0)
            .map(|(t, &a)| TrainSequence::from_trajectory(t, a))
            .collect();
        let refs: Vec<&TrainSequence> = kept.iter().collect();
        let olds = self.learner.logprobs(&refs)?;
        let gap = logprob_gap(&kept, &olds);
        let dapo = Objective::Dapo {
            eps_low: options.eps_low,
            eps_high: options.eps_high,
            tis_cap: options.tis_cap,
        };
        let order = shuffled(kept.len(), episode_seed(agent.seed, "batches", iteration));
        let mut action_tokens = 0;
        for chunk in order.chunks(options.batch_size) {
            let batch: Vec<&TrainSequence> = chunk.iter().map(|&i| &kept[i]).collect();
            let batch_olds: Vec<&[f32]> = chunk.iter().map(|&i| olds[i].as_slice()).collect();
            self.progress.step += 1;
            let step = self.progress.step;
            let lr = if step <= options.warmup_steps {
                options.lr * step as f64 / options.warmup_steps as f64
            } else {
                options.lr
            };
            let report = self.learner.step(&batch, &batch_olds, &dapo, lr)?;
            action_tokens += report.metrics["action_tokens"].as_u64().unwrap_or(0) as usize;
            if self.writer() {
                let metrics = self.out().join("metrics.jsonl");
                append_step(&metrics, step, iteration, report.metrics)?;
            }
        }
        Ok(Trained {
            kept: kept.len(),
            action_tokens,
            gap,
        })
    }

    /// `OUT/iteration-N/`: weights, optimizer state and where the run stands.
    fn checkpoint(&self, iteration: usize) -> Result<PathBuf> {
        let dir = self.out().join(format!("iteration-{iteration:06}"));
        let state = json!({
            "iteration": iteration,
            "step": self.progress.step,
            "updates": self.learner.updates(),
            "weight_version": self.progress.weight_version,
            "options": self.record.to_json(),
        });
        self.learner.save(self.model_dir, &dir, &state)?;
        Ok(dir)
    }
}

/// Tasks picked twice in one iteration become separate groups (`ID#2`).
fn dedup_groups(mut tasks: Vec<Task>) -> Vec<Task> {
    let mut seen: Vec<String> = Vec::new();
    for t in tasks.iter_mut() {
        let count = seen.iter().filter(|s| **s == t.id).count();
        seen.push(t.id.clone());
        if count > 0 {
            t.id = format!("{}#{}", t.id, count + 1);
        }
    }
    tasks
}

fn env_time(episodes: &[Episode]) -> f64 {
    episodes.iter().map(|e| e.environment_s).sum()
}

fn grade_time(episodes: &[Episode]) -> f64 {
    episodes.iter().map(|e| e.grading_s).sum()
}

/// max and mean |sampler logprob - trainer logprob| over action tokens with a sampler logprob.
fn logprob_gap(sequences: &[TrainSequence], olds: &[Vec<f32>]) -> (f64, f64) {
    let (mut max, mut sum, mut count) = (0.0f64, 0.0f64, 0usize);
    for (s, old) in sequences.iter().zip(olds) {
        if !s.has_rollout_logprobs {
            continue;
        }
        let rows = s.action_mask.iter().zip(&s.rollout_logprobs).zip(old);
        for ((&action, &sampled), &trainer) in rows {
            if action {
                let gap = (sampled - trainer).abs() as f64;
                max = max.max(gap);
                sum += gap;
                count += 1;
            }
        }
    }
    (max, sum / count.max(1) as f64)
}

fn append_step(path: &Path, step: u64, iteration: usize, metrics: Value) -> Result<()> {
    let mut line = json!({"step": step, "iteration": iteration});
    for (k, v) in metrics.as_object().expect("an object") {
        line[k] = v.clone();
    }
    append_line(path, &line)
}

/// New weights to the rollouts: in memory to the engine, or written and reloaded through the
/// server. Returns the new weight version and the seconds it took.
pub(crate) fn handoff<T: Trainer>(
    learner: &T,
    sampler: &Sampler,
    model_dir: &Path,
    out: &Path,
) -> Result<f64> {
    let started = Instant::now();
    match sampler {
        // Each learner rank's shard to the engine rank of the same index, never the whole model
        // (crate::model::handoff).
        Sampler::Engine(handle) => match learner.compute_weight_spans()? {
            // Same GPUs: each engine rank copies its learner rank's bf16 buffers device to device.
            // SAFETY: the learner is borrowed (nothing trains) until the engine has replied.
            Some(ranks) => {
                unsafe { handle.update_weights_from_device(ranks) }?;
            }
            // Host memory: rank by rank, one tensor at a time, each written in place.
            None => {
                handle.update_weights_streamed(|out| learner.send_compute_weights(out))?;
            }
        },
        Sampler::Server { policy, url } => {
            // A separate server reads weights from disk: an HF folder it can load.
            let dir = out.join("handoff");
            learner.save(model_dir, &dir, &json!({"handoff": true}))?;
            policy
                .post_json("/v1/weights/reload", &json!({"path": dir}))
                .with_context(|| format!("reloading {url} with {}", dir.display()))?;
        }
    }
    Ok(started.elapsed().as_secs_f64())
}
