//! One `rl` iteration and the RFT phase before the first: rollouts, the trainer's steps over
//! them, the handoff of new weights to the rollouts, the iteration's line and checkpoint.

use super::schedule::{shuffled, tasks_of_iteration, PhaseSchedule};
use super::work_queue::{QueueAddress, QueueClient, QueueServer};
use super::{plot, RlOptions};
use crate::agent::episode::{Deadline, Episode, EpisodeContext, Finish};
use crate::agent::policy::ServerPolicy;
use crate::agent::rollout::{
    episode_seed, episode_stats, episode_times, run_task_groups, GroupPlan,
};
use crate::dist::Collectives;
use crate::engine::EngineHandle;
use crate::env::Task;
use crate::train::data::{group_advantages, group_signal, GroupReward, TrainSequence, Trajectory};
use crate::train::group::Trainer;
use crate::train::loss::Objective;
use crate::train::run_dir::RecordedOptions;
use crate::train::trainer::append_line;
use anyhow::{bail, Context, Result};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Where rollouts come from, and how new weights reach them.
pub(crate) enum Sampler {
    Engine(Arc<EngineHandle>),
    Server { policy: ServerPolicy, url: String },
}

/// What training did with an iteration's episodes.
#[derive(Default)]
struct Trained {
    /// Per episode: its advantage where it became a trajectory, `None` where it failed.
    advantages: Vec<Option<f64>>,
    kept: usize,
    /// Groups among the trajectories, and those dropped whole (every reward equal).
    groups: usize,
    uniform_groups: usize,
    /// Trajectories dropped: in uniform groups; with A = 0 in a group with signal (a reward
    /// equal to the group's mean).
    dropped_uniform: usize,
    dropped_zero_advantage: usize,
    action_tokens: usize,
    /// Optimizer steps taken, and the learning rates of the first and the last.
    steps: u64,
    lr: Option<(f64, f64)>,
    /// max and mean rollout-vs-trainer logprob gap.
    gap: (f64, f64),
}

impl Trained {
    fn took_step(&mut self, lr: f64, action_tokens: usize) {
        self.steps += 1;
        self.lr = Some((self.lr.map_or(lr, |(first, _)| first), lr));
        self.action_tokens += action_tokens;
    }
}

/// One iteration's line of `iterations.jsonl`: the episodes' figures ([`episode_stats`], the same
/// as `rollout.json`'s), then what training kept and did, times and the weight version.
fn iteration_line(
    (iteration, phase): (usize, &str),
    rollouts: &Rollouts,
    trained: &Trained,
    times: Value,
    weight_version: u64,
) -> Value {
    let episodes = &rollouts.episodes;
    let mut line = json!({"iteration": iteration, "phase": phase});
    line.as_object_mut()
        .expect("an object")
        .extend(episode_stats(episodes));
    let failed = crate::agent::rollout::infrastructure_failures(episodes);
    let more = json!({
        "groups": trained.groups,
        "groups_uniform": trained.uniform_groups,
        "trajectories_kept": trained.kept,
        "trajectories_dropped": episodes.len() + rollouts.past_deadline - trained.kept,
        "dropped": {
            "uniform_group": trained.dropped_uniform,
            "zero_advantage": trained.dropped_zero_advantage,
            "infrastructure": failed,
            "deadline": rollouts.past_deadline,
        },
        "episodes_past_deadline": rollouts.stopped,
        "rollout_deadline_s": rollouts.deadline_s,
        "task_groups_by_process": rollouts.groups_by_process,
        "trained_action_tokens": trained.action_tokens,
        "optimizer_steps": trained.steps,
        "lr_first": trained.lr.map(|l| l.0),
        "lr_last": trained.lr.map(|l| l.1),
        "logprob_gap_max": trained.gap.0,
        "logprob_gap_mean": trained.gap.1,
        "time_s": times,
        "weight_version": weight_version,
    });
    line.as_object_mut()
        .expect("an object")
        .extend(more.as_object().expect("an object").clone());
    line
}

/// The iteration's wall-clock phases with the episodes' summed times.
fn times(phases: &[(&str, f64)], episodes: &[Episode]) -> Value {
    let mut times = episode_times(episodes);
    for (name, seconds) in phases {
        times.insert(name.to_string(), json!(seconds));
    }
    Value::Object(times)
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
    /// Optimizer steps taken (RFT's included): the step numbers of `metrics.jsonl`.
    pub step: u64,
    /// DAPO's optimizer steps taken: its schedule counts these.
    pub dapo_step: u64,
    /// Weight updates handed to the rollouts since the base model.
    pub weight_version: u64,
}

/// The other processes of a multi-node run (one per node), and where process 0 hands out
/// the rollouts' task groups.
#[derive(Clone, Copy)]
pub(crate) struct Processes<'a> {
    pub comm: &'a dyn Collectives,
    pub queue: &'a QueueAddress,
}

/// An iteration's rollouts as every process ends up with them.
pub(crate) struct Rollouts {
    /// The episodes that finished, in (task, sample) order.
    pub episodes: Vec<Episode>,
    /// Episodes `--rollout-deadline` cost: stopped while running, or never started.
    pub past_deadline: usize,
    /// Of those, the ones that had started.
    pub stopped: usize,
    /// Task groups each process ran.
    pub groups_by_process: Vec<usize>,
    pub deadline_s: Option<f64>,
}

impl Rollouts {
    /// The episodes of every task group in task order; a slot without an episode (or a group
    /// nobody ran) counts as past the deadline.
    fn gather(
        tasks: usize,
        group: usize,
        mut groups: BTreeMap<usize, Vec<Option<Episode>>>,
        stopped: usize,
        groups_by_process: Vec<usize>,
        deadline_s: Option<f64>,
    ) -> Self {
        let mut episodes = Vec::with_capacity(tasks * group);
        for t in 0..tasks {
            episodes.extend(groups.remove(&t).into_iter().flatten().flatten());
        }
        Self {
            past_deadline: tasks * group - episodes.len(),
            episodes,
            stopped,
            groups_by_process,
            deadline_s,
        }
    }
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
    pub processes: Option<Processes<'a>>,
}

impl<T: Trainer> Loop<'_, T> {
    fn out(&self) -> &Path {
        &self.options.agent.out
    }

    /// Whether this process writes the run's files (the first of a multi-node run).
    fn writer(&self) -> bool {
        self.processes.is_none_or(|p| p.comm.rank() == 0)
    }

    /// `group` episodes of every task, in (task, sample) order, less those that
    /// `--rollout-deadline` cost. Across processes, process 0 hands out task groups (a task with
    /// its `group` samples) from a queue ([`super::work_queue`]) and every process runs the next
    /// one whenever a worker of its is idle, so a fast node takes more and no collective runs
    /// while episodes do; once all have finished they exchange their episodes, and every process
    /// ends with all of them in the same order. An episode's seed depends on its task and
    /// sample only, so where it runs changes nothing.
    ///
    /// ```text
    ///   process 0: queue + workers ─ pulls 0 3 4 ...  ┐  finished? ─► exchange the episodes
    ///   process 1: workers ───────── pulls 1 2 5 ...  ┘  (all_gather, (task, sample) order)
    /// ```
    fn rollouts(&self, tasks: &[Task], group: usize, seed: u64, label: &str) -> Result<Rollouts> {
        let rollouts = self.run_rollouts(tasks, group, seed, label)?;
        if let (Some(s), true) = (rollouts.deadline_s, rollouts.past_deadline > 0) {
            eprintln!(
                "rl: {label}: --rollout-deadline {s} s dropped {} of {} episodes ({} stopped while running, the rest never started)",
                rollouts.past_deadline,
                tasks.len() * group,
                rollouts.stopped
            );
        }
        Ok(rollouts)
    }

    fn run_rollouts(
        &self,
        tasks: &[Task],
        group: usize,
        seed: u64,
        label: &str,
    ) -> Result<Rollouts> {
        let deadline_s = self.options.rollout_deadline;
        let plan = GroupPlan {
            tasks,
            group,
            workers: self.options.agent.workers,
            seed,
            label,
            deadline: Deadline(deadline_s.map(|s| Instant::now() + Duration::from_secs_f64(s))),
        };
        let Some(processes) = self.processes.filter(|p| p.comm.size() > 1) else {
            let next = AtomicUsize::new(0);
            let next_group = || -> Result<Option<usize>> {
                Ok(Some(next.fetch_add(1, Ordering::SeqCst)).filter(|&t| t < tasks.len()))
            };
            let ran = run_task_groups(self.ctx, &plan, &next_group)?;
            let groups_by_process = vec![ran.groups.len()];
            return Ok(Rollouts::gather(
                tasks.len(),
                group,
                ran.groups,
                ran.stopped,
                groups_by_process,
                deadline_s,
            ));
        };
        let (rank, size) = (processes.comm.rank(), processes.comm.size());
        let at = &processes.queue;
        // The round is the rollout's seed: the RFT phase's and each iteration's differ.
        let _server = match rank {
            0 => Some(QueueServer::start(
                &at.host,
                at.port,
                seed,
                tasks.len(),
                size,
            )?),
            _ => None,
        };
        let client = QueueClient::connect(&at.host, at.port, seed, rank, at.connect_timeout)?;
        let ran = run_task_groups(self.ctx, &plan, &|| client.next_unit())?;
        let groups_by_process = client.finish_and_wait()?;
        eprintln!(
            "rl: {label}: process {rank} ran {} of {} task groups (by process: {groups_by_process:?})",
            ran.groups.len(),
            tasks.len()
        );
        // Every process has finished: this exchange waits on nobody's episodes.
        let mine: Vec<(usize, Vec<Option<Episode>>)> = ran.groups.into_iter().collect();
        let bytes = serde_json::to_vec(&(ran.stopped, mine))
            .context("serialising this process's episodes")?;
        let (mut groups, mut stopped) = (BTreeMap::new(), 0);
        for (r, part) in processes.comm.all_gather_bytes(&bytes)?.iter().enumerate() {
            type Share = (usize, Vec<(usize, Vec<Option<Episode>>)>);
            let (their_stopped, share): Share = serde_json::from_slice(part)
                .with_context(|| format!("the episodes of process {r}"))?;
            stopped += their_stopped;
            for (t, episodes) in share {
                if t >= tasks.len() || episodes.len() != group || groups.contains_key(&t) {
                    bail!("process {r} returned task group {t} twice, or out of range, or not {group} long");
                }
                groups.insert(t, episodes);
            }
        }
        Ok(Rollouts::gather(
            tasks.len(),
            group,
            groups,
            stopped,
            groups_by_process,
            deadline_s,
        ))
    }

    /// `--rft-first K`: K rollouts per task with the base model, then RFT on the resolved ones
    /// on its own schedule ([`PhaseSchedule::rft`]); its line is iteration 0.
    pub fn rft_phase(&mut self, k: usize) -> Result<()> {
        let (options, agent) = (self.options, &self.options.agent);
        let started = Instant::now();
        let seed = agent.seed ^ 0x0052_4654;
        let rollouts = self.rollouts(self.tasks, k, seed, "rft rollouts")?;
        let episodes = &rollouts.episodes;
        let rollout_s = started.elapsed().as_secs_f64();
        let mut trained = Trained::default();
        let mut resolved = Vec::new();
        for e in episodes {
            let t = trajectory(e);
            trained.advantages.push(t.as_ref().map(|_| 1.0));
            if let (true, Some(t)) = (e.resolved, t) {
                resolved.push(TrainSequence::from_trajectory(&t, 1.0));
            }
        }
        trained.kept = resolved.len();
        let train_started = Instant::now();
        self.memory_to_trainer()?;
        let schedule = PhaseSchedule::rft(
            options.rft_lr,
            options.rft_warmup_steps,
            options.rft_batch_size,
            options.rft_epochs,
            resolved.len(),
        );
        if resolved.is_empty() {
            eprintln!("rl: --rft-first {k}: no rollout resolved its task; DAPO starts from the base model");
        } else {
            eprintln!(
                "rl: RFT on {} resolved rollouts: {}",
                resolved.len(),
                schedule.describe()
            );
        }
        for epoch in 0..options.rft_epochs {
            let order = shuffled(resolved.len(), seed ^ epoch as u64);
            for chunk in order.chunks(schedule.batch_size) {
                let batch: Vec<&TrainSequence> = chunk.iter().map(|&i| &resolved[i]).collect();
                let olds: Vec<&[f32]> = vec![&[]; batch.len()];
                let lr = schedule.lr(trained.steps + 1);
                let report = self.learner.step(&batch, &olds, &Objective::MaskedCe, lr)?;
                trained.took_step(lr, action_tokens(&report.metrics));
                self.progress.step += 1;
                self.append_step(0, report.metrics)?;
            }
        }
        let training_s = train_started.elapsed().as_secs_f64();
        let handoff_s = handoff(&self.learner, self.sampler, self.model_dir, self.out())?;
        self.progress.weight_version += 1;
        self.memory_to_rollouts()?;
        self.save_rollouts(0, episodes, &trained)?;
        let line = iteration_line(
            (0, "rft"),
            &rollouts,
            &trained,
            times(
                &[
                    ("rollout", rollout_s),
                    ("training", training_s),
                    ("handoff", handoff_s),
                ],
                episodes,
            ),
            self.progress.weight_version,
        );
        self.record_line(line)?;
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
        let rollouts = self.rollouts(&picked, agent.group, seed, &label)?;
        let episodes = &rollouts.episodes;
        let rollout_s = started.elapsed().as_secs_f64();
        let train_started = Instant::now();
        self.memory_to_trainer()?;
        let trained = self.train_on(iteration, episodes)?;
        let training_s = train_started.elapsed().as_secs_f64();
        let handoff_s = if trained.kept == 0 {
            0.0
        } else {
            self.progress.weight_version += 1;
            handoff(&self.learner, self.sampler, self.model_dir, self.out())?
        };
        let restore_started = Instant::now();
        self.memory_to_rollouts()?;
        let kv_restore_s = restore_started.elapsed().as_secs_f64();
        self.save_rollouts(iteration, episodes, &trained)?;
        let line = iteration_line(
            (iteration, "dapo"),
            &rollouts,
            &trained,
            times(
                &[
                    ("rollout", rollout_s),
                    ("training", training_s),
                    ("handoff", handoff_s),
                    ("kv_cache_restore", kv_restore_s),
                ],
                episodes,
            ),
            self.progress.weight_version,
        );
        eprintln!(
            "iteration {iteration}: reward {:.3} resolved {:.3} turns {:.2} kept {}/{} ({} of {} groups uniform) steps {} gap {:.1e} | rollout {:.1}s train {:.1}s handoff {:.3}s",
            line["mean_reward"].as_f64().unwrap_or(0.0),
            line["resolved_rate"].as_f64().unwrap_or(0.0),
            line["mean_turns"].as_f64().unwrap_or(0.0),
            trained.kept,
            episodes.len(),
            trained.uniform_groups,
            trained.groups,
            trained.steps,
            trained.gap.0,
            rollout_s,
            training_s,
            handoff_s
        );
        self.record_line(line)?;
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

    /// DAPO over an iteration's episodes: group advantages, A = 0 dropped (whole groups whose
    /// rewards are all equal), `logp_old` the trainer's own logprobs under the weights that
    /// produced the rollouts, then optimizer steps in seeded batches on DAPO's schedule.
    fn train_on(&mut self, iteration: usize, episodes: &[Episode]) -> Result<Trained> {
        let (options, agent) = (self.options, &self.options.agent);
        let per_episode: Vec<Option<Trajectory>> = episodes.iter().map(trajectory).collect();
        let trajectories: Vec<&Trajectory> = per_episode.iter().flatten().collect();
        let groups: Vec<GroupReward<'_>> = trajectories
            .iter()
            .map(|t| GroupReward {
                group: t.group.as_deref(),
                reward: t.reward,
            })
            .collect();
        let advantages = group_advantages(&groups, |i| trajectories[i].location.clone())?;
        let signal = group_signal(&groups);
        let mut trained = Trained {
            groups: signal.len(),
            uniform_groups: signal.values().filter(|&&none| none).count(),
            ..Trained::default()
        };
        let mut next = advantages.iter();
        for t in &per_episode {
            trained
                .advantages
                .push(t.as_ref().map(|_| *next.next().expect("one each")));
        }
        let mut kept = Vec::new();
        for ((t, g), &a) in trajectories.iter().zip(&groups).zip(&advantages) {
            if a != 0.0 {
                kept.push(TrainSequence::from_trajectory(t, a));
            } else if signal[g.group.unwrap_or("")] {
                trained.dropped_uniform += 1;
            } else {
                trained.dropped_zero_advantage += 1;
            }
        }
        trained.kept = kept.len();
        let refs: Vec<&TrainSequence> = kept.iter().collect();
        let olds = self.learner.logprobs(&refs)?;
        trained.gap = logprob_gap(&kept, &olds);
        let dapo = Objective::Dapo {
            eps_low: options.eps_low,
            eps_high: options.eps_high,
            tis_cap: options.tis_cap,
        };
        let schedule = PhaseSchedule::dapo(options.lr, options.warmup_steps, options.batch_size);
        let order = shuffled(kept.len(), episode_seed(agent.seed, "batches", iteration));
        for chunk in order.chunks(schedule.batch_size) {
            let batch: Vec<&TrainSequence> = chunk.iter().map(|&i| &kept[i]).collect();
            let batch_olds: Vec<&[f32]> = chunk.iter().map(|&i| olds[i].as_slice()).collect();
            self.progress.dapo_step += 1;
            let lr = schedule.lr(self.progress.dapo_step);
            let report = self.learner.step(&batch, &batch_olds, &dapo, lr)?;
            trained.took_step(lr, action_tokens(&report.metrics));
            self.progress.step += 1;
            self.append_step(iteration, report.metrics)?;
        }
        Ok(trained)
    }

    /// Before training: the engine's KV cache gives its memory to the trainer.
    fn memory_to_trainer(&self) -> Result<()> {
        if let Sampler::Engine(handle) = self.sampler {
            handle.release_kv_cache()?;
        }
        Ok(())
    }

    /// After the handoff: the trainer's gradients (and, with `--offload-optimizer`, its
    /// optimizer state) give their memory to the rollouts' KV cache; the next step takes them
    /// back.
    fn memory_to_rollouts(&mut self) -> Result<()> {
        if let Sampler::Engine(handle) = self.sampler {
            self.learner.release_training_memory()?;
            handle.restore_kv_cache()?;
        }
        Ok(())
    }

    /// Appends a step's metrics to `metrics.jsonl` (the writing process only).
    fn append_step(&self, iteration: usize, metrics: Value) -> Result<()> {
        if !self.writer() {
            return Ok(());
        }
        let mut line = json!({"step": self.progress.step, "iteration": iteration});
        for (k, v) in metrics.as_object().expect("an object") {
            line[k] = v.clone();
        }
        append_line(&self.out().join("metrics.jsonl"), &line)
    }

    /// Appends the iteration's line to `iterations.jsonl` (the writing process only) and to
    /// the history the plot reads.
    fn record_line(&mut self, line: Value) -> Result<()> {
        if self.writer() {
            append_line(&self.out().join("iterations.jsonl"), &line)?;
        }
        self.history.push(line);
        Ok(())
    }

    /// With `--save-rollouts`: `OUT/rollouts/iteration-N.jsonl`, every episode as `rollout`
    /// writes it plus `advantage` (`null` for one that failed) and `kept` (trained on).
    fn save_rollouts(
        &self,
        iteration: usize,
        episodes: &[Episode],
        trained: &Trained,
    ) -> Result<()> {
        if !self.options.save_rollouts || !self.writer() {
            return Ok(());
        }
        let dir = self.out().join("rollouts");
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let path = dir.join(format!("iteration-{iteration:06}.jsonl"));
        crate::jsonl::write_atomically(&path, |write| {
            for (e, advantage) in episodes.iter().zip(&trained.advantages) {
                let mut line = e.to_json();
                line["advantage"] = json!(advantage);
                line["kept"] = json!(match advantage {
                    Some(_) if iteration == 0 => e.resolved,
                    Some(a) => *a != 0.0,
                    None => false,
                });
                write(&line)?;
            }
            Ok(())
        })
    }

    /// `OUT/iteration-N/`: weights, optimizer state and where the run stands.
    fn checkpoint(&self, iteration: usize) -> Result<PathBuf> {
        let dir = self.out().join(format!("iteration-{iteration:06}"));
        let state = json!({
            "iteration": iteration,
            "step": self.progress.step,
            "dapo_step": self.progress.dapo_step,
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

/// The action tokens a step's metrics report.
fn action_tokens(metrics: &Value) -> usize {
    metrics["action_tokens"].as_u64().unwrap_or(0) as usize
}

/// max and mean |sampler logprob - trainer logprob| over action tokens with a sampler logprob.
pub(crate) fn logprob_gap(sequences: &[TrainSequence], olds: &[Vec<f32>]) -> (f64, f64) {
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
