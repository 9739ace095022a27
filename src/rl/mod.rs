//! `swerve-train rl`: the method in one process (RL-SPEC.md; DESIGN.md decision 14).
//!
//! ```text
//!   [--rft-first K: K rollouts per task with the base model, keep the resolved, RFT on them]
//!   for each iteration:
//!     tasks  = the next --tasks-per-iteration of a seeded order over the task file
//!     rollouts: --group episodes per task through the in-process engine (or --server)
//!     rewards ─ group advantages ─ drop A = 0 (and episodes that failed for infrastructure)
//!     logp_old = the trainer's own logprobs under the rollout weights (the gap to the
//!                sampler's logprobs is measured: the same backend promises 0)
//!     DAPO: optimizer steps over the kept trajectories in batches of --batch-size
//!     (the engine's KV cache is released while the trainer runs, allocated again after)
//!     handoff: the trainer's compute weights go to the engine in memory (prefix cache reset,
//!              weight version + 1), or through /v1/weights/reload with --server
//!     iterations.jsonl, metrics.jsonl, reward.png; a checkpoint every --save-every
//! ```
//!
//! Everything random is seeded by (--seed, iteration), so `--resume` continues exactly: the same
//! tasks, the same sampling streams, the same batches.

pub mod plot;

use crate::agent::command::{environment_for, AgentRunOptions};
use crate::agent::episode::{Episode, EpisodeConfig, EpisodeContext, Finish};
use crate::agent::policy::{EnginePolicy, Policy, ServerPolicy};
use crate::agent::rollout::{episode_seed, run_episodes};
use crate::backend::grad::BackendGrad;
use crate::chat::ChatTemplate;
use crate::config::ModelConfig;
use crate::engine::launch::{launch_engine, EngineLaunch};
use crate::engine::EngineHandle;
use crate::env::{builtin, load_tasks, Task};
use crate::tokenizer::Tokenizer;
use crate::train::checkpoint;
use crate::train::data::{group_advantages, TrainSequence, Trajectory};
use crate::train::learner::Learner;
use crate::train::loss::Objective;
use crate::train::optimizer::AdamWConfig;
use crate::train::trainer::append_line;
use anyhow::{anyhow, bail, Context, Result};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

/// Everything `swerve-train rl` takes.
#[derive(Clone, Debug)]
pub struct RlOptions {
    /// Rollout side: model, tasks, output, group, episode limits, environment, concurrency,
    /// seed, device, --server.
    pub agent: AgentRunOptions,
    pub iterations: usize,
    pub tasks_per_iteration: usize,
    /// Trajectories per optimizer step.
    pub batch_size: usize,
    pub lr: f64,
    pub warmup_steps: u64,
    pub weight_decay: f32,
    pub grad_clip: Option<f64>,
    pub eps_low: f32,
    pub eps_high: f32,
    pub tis_cap: Option<f32>,
    pub micro_batch_tokens: usize,
    pub save_every: usize,
    pub resume: bool,
    /// RFT first: rollouts per task with the base model, then RFT on the resolved ones.
    pub rft_first: Option<usize>,
    pub rft_lr: f64,
    pub rft_epochs: usize,
}

/// Settings `rl` uses where a flag is not given: the paper's stage 1 (RL-SPEC.md), or, for
/// `builtin:toy`, a schedule the toy model learns in minutes on a CPU.
#[derive(Clone, Debug, PartialEq)]
pub struct RlDefaults {
    pub iterations: usize,
    pub tasks_per_iteration: usize,
    pub group: usize,
    pub batch_size: usize,
    pub lr: f64,
    pub warmup_steps: u64,
    pub eps_high: f32,
    pub max_turns: usize,
    pub turn_threshold: usize,
    pub max_turn_tokens: usize,
    pub concurrency: usize,
    pub rft_first: Option<usize>,
    pub rft_lr: f64,
}

impl RlDefaults {
    pub fn for_tasks(tasks: &str) -> Self {
        if tasks == "builtin:toy" {
            // Measured on 2 cores, seeds 0-3: resolved 0.35-0.46 at the first iteration, 0.9 or
            // more from iteration 22-26, 0.98 over iterations 140-150, ~0.2 s an iteration.
            // Rejected: lr 3e-4 (stalled at 0.25), 6 turns with threshold 3 and a required
            // submit after "correct" (collapsed to deterministic partial policies at 0.5-0.75).
            Self {
                iterations: 60,
                tasks_per_iteration: 8,
                group: 16,
                batch_size: 32,
                lr: 1e-3,
                warmup_steps: 0,
                eps_high: 0.3,
                max_turns: 8,
                turn_threshold: 4,
                max_turn_tokens: 1,
                concurrency: 64,
                rft_first: Some(64),
                rft_lr: 1e-3,
            }
        } else {
            Self {
                iterations: 100,
                tasks_per_iteration: 300,
                group: 10,
                batch_size: 128,
                lr: 1e-6,
                warmup_steps: 10,
                eps_high: 0.3,
                max_turns: 40,
                turn_threshold: 10,
                max_turn_tokens: 4096,
                concurrency: 64,
                rft_first: None,
                rft_lr: 5e-6,
            }
        }
    }
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
fn trajectory(e: &Episode) -> Option<Trajectory> {
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

/// The tasks of `iteration` (1-based): the next `per_iteration` of an endless sequence of seeded
/// shuffles of the task file, one shuffle per pass.
pub fn tasks_of_iteration(
    n: usize,
    per_iteration: usize,
    seed: u64,
    iteration: usize,
) -> Vec<usize> {
    let start = (iteration - 1) * per_iteration;
    (start..start + per_iteration)
        .map(|k| {
            let pass = (k / n) as u64;
            let order = shuffled(n, seed ^ pass.wrapping_mul(0xA076_1D64_78BD_642F));
            order[k % n]
        })
        .collect()
}

fn shuffled(n: usize, seed: u64) -> Vec<usize> {
    let mut state = seed;
    let mut order: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        state = episode_seed(state, "shuffle", i);
        order.swap(i, (state % (i as u64 + 1)) as usize);
    }
    order
}

/// Where rollouts come from, and how new weights reach them.
enum Sampler {
    Engine(Arc<EngineHandle>),
    Server { policy: ServerPolicy, url: String },
}

/// Runs `rl` on the trainer's backend.
pub fn run<B: BackendGrad>(backend: &B, options: &RlOptions) -> Result<()> {
    let agent = &options.agent;
    if options.iterations == 0 || options.tasks_per_iteration == 0 || options.batch_size == 0 {
        bail!("--iterations, --tasks-per-iteration and --batch-size must be at least 1");
    }
    for (name, v) in [("--lr", options.lr), ("--rft-lr", options.rft_lr)] {
        if !(v.is_finite() && v > 0.0) {
            bail!("{name} {v}: expected a positive number");
        }
    }
    std::fs::create_dir_all(&agent.out)
        .with_context(|| format!("creating {}", agent.out.display()))?;
    let model_arg = agent
        .model
        .as_ref()
        .ok_or_else(|| anyhow!("rl needs --model DIR or --model preset:NAME"))?;
    let model_dir = crate::model::synthetic::resolve_model_arg(model_arg, &agent.out)?;
    let tasks_path = builtin::resolve_tasks(&agent.tasks)?;
    let tasks = load_tasks(&tasks_path)?;
    let tokenizer = Arc::new(Tokenizer::for_model_dir(&model_dir)?);
    let template = ChatTemplate::for_tokenizer(&tokenizer)?;
    let config = ModelConfig::from_dir(&model_dir)?;
    let mut episode_config: EpisodeConfig = agent.episode.clone();
    episode_config.max_context = match agent.max_context {
        Some(n) if n > config.max_context() => bail!(
            "--max-context {n} is beyond the model's context of {} tokens",
            config.max_context()
        ),
        Some(n) => n,
        None => config.max_context().min(65_536),
    };
    let stop_ids: Vec<u32> = tokenizer
        .stop_ids()
        .iter()
        .copied()
        .filter(|&t| (t as usize) < config.vocab_size)
        .collect();

    let mut learner = Learner::new(
        backend,
        &model_dir,
        AdamWConfig {
            weight_decay: options.weight_decay,
            max_grad_norm: options.grad_clip,
            ..AdamWConfig::default()
        },
        options.micro_batch_tokens,
        true,
    )?;
    let iterations_path = agent.out.join("iterations.jsonl");
    let metrics_path = agent.out.join("metrics.jsonl");
    let mut first_iteration = 1;
    let mut step = 0u64;
    let mut resumed_version = 0u64;
    let mut rft_done = options.rft_first.is_none();
    if options.resume {
        if let Some(dir) = checkpoint::latest_named(&agent.out, "iteration-")? {
            let state = learner.restore(&dir)?;
            let done = state["iteration"]
                .as_u64()
                .context("trainer_state.json: no iteration")? as usize;
            step = state["step"].as_u64().unwrap_or(0);
            resumed_version = state["weight_version"].as_u64().unwrap_or(0);
            first_iteration = done + 1;
            rft_done = true;
            keep_lines(&iterations_path, "iteration", done as u64)?;
            keep_lines(&metrics_path, "step", step)?;
            eprintln!("rl: resuming after iteration {done} from {}", dir.display());
        } else {
            // Killed before its first checkpoint: nothing to continue, so start over.
            for path in [&iterations_path, &metrics_path] {
                if path.exists() {
                    std::fs::remove_file(path)
                        .with_context(|| format!("removing {}", path.display()))?;
                }
            }
            eprintln!(
                "rl: --resume: no checkpoint in {} yet; starting from the beginning",
                agent.out.display()
            );
        }
    } else {
        for path in [&iterations_path, &metrics_path] {
            if path.exists() {
                bail!(
                    "{} exists: pass --resume to continue that run, or choose another --out",
                    path.display()
                );
            }
        }
    }

    let sampler = match &agent.server {
        Some(url) => Sampler::Server {
            policy: ServerPolicy::new(url, agent.api_key.clone(), stop_ids.clone())?,
            url: url.clone(),
        },
        None => Sampler::Engine(Arc::new(launch_engine(&EngineLaunch {
            model: model_dir.clone(),
            device: agent.device,
            max_model_len: episode_config.max_context,
            kv_cache_fraction: 0.9,
            num_kv_blocks: None,
            max_num_seqs: agent.concurrency,
            max_num_batched_tokens: 8192,
            seed: agent.seed,
        })?)),
    };
    let env = environment_for(&tasks, agent)?;
    // The policy's version: weight updates handed to the rollouts since the base model (the
    // engine's own counter restarts with the process; this one is checkpointed).
    let mut weight_version = resumed_version;
    if first_iteration > 1 {
        // The engine starts from the base model: hand it the resumed weights.
        handoff(&learner, &sampler, &model_dir, &agent.out)?;
    }
    let engine_policy;
    let policy: &dyn Policy = match &sampler {
        Sampler::Engine(handle) => {
            engine_policy = EnginePolicy {
                engine: handle.clone(),
                stop_ids: stop_ids.clone(),
                temperature: 1.0,
            };
            &engine_policy
        }
        Sampler::Server { policy, .. } => policy,
    };
    let ctx = EpisodeContext {
        env: env.as_ref(),
        policy,
        tokenizer: &tokenizer,
        template: &template,
        config: &episode_config,
    };
    eprintln!(
        "rl: {} tasks from {}, {} per iteration x {} rollouts, {} iterations, batch {}, lr {}, environment {}, context {}",
        tasks.len(),
        agent.tasks,
        options.tasks_per_iteration,
        agent.group,
        options.iterations,
        options.batch_size,
        options.lr,
        env.name(),
        episode_config.max_context
    );
    let dapo = Objective::Dapo {
        eps_low: options.eps_low,
        eps_high: options.eps_high,
        tis_cap: options.tis_cap,
    };
    let mut history = read_history(&iterations_path)?;

    if !rft_done {
        let k = options.rft_first.expect("checked");
        let started = Instant::now();
        let episodes = run_episodes(
            &ctx,
            &tasks,
            k,
            agent.concurrency,
            agent.seed ^ 0x0052_4654,
            "rft rollouts",
        );
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
        } else {
            for epoch in 0..options.rft_epochs {
                let order = shuffled(resolved.len(), agent.seed ^ 0x0052_4654 ^ epoch as u64);
                for chunk in order.chunks(options.batch_size) {
                    let batch: Vec<&TrainSequence> = chunk.iter().map(|&i| &resolved[i]).collect();
                    let olds: Vec<&[f32]> = vec![&[]; batch.len()];
                    step += 1;
                    let report =
                        learner.step(&batch, &olds, &Objective::MaskedCe, options.rft_lr)?;
                    action_tokens += report.metrics["action_tokens"].as_u64().unwrap_or(0) as usize;
                    append_step(&metrics_path, step, 0, report.metrics)?;
                }
            }
        }
        let training_s = train_started.elapsed().as_secs_f64();
        let handoff_s = handoff(&learner, &sampler, &model_dir, &agent.out)?;
        weight_version += 1;
        let line = iteration_line(
            (0, "rft"),
            &episodes,
            Trained {
                kept: resolved.len(),
                action_tokens,
                gap: (0.0, 0.0),
            },
            &json!({"rollout": rollout_s, "environment": env_time(&episodes), "grading": grade_time(&episodes), "training": training_s, "handoff": handoff_s}),
            weight_version,
        );
        append_line(&iterations_path, &line)?;
        history.push(line);
        checkpoint_iteration(&learner, &model_dir, &agent.out, 0, step, weight_version)?;
    }

    for iteration in first_iteration..=options.iterations {
        let picked: Vec<Task> = tasks_of_iteration(
            tasks.len(),
            options.tasks_per_iteration,
            agent.seed,
            iteration,
        )
        .into_iter()
        .map(|i| tasks[i].clone())
        .collect();
        let picked = dedup_groups(picked);
        let started = Instant::now();
        let label = format!("iteration {iteration}/{}", options.iterations);
        let episodes = run_episodes(
            &ctx,
            &picked,
            agent.group,
            agent.concurrency,
            episode_seed(agent.seed, "iteration", iteration),
            &label,
        );
        let rollout_s = started.elapsed().as_secs_f64();

        let trajectories: Vec<Trajectory> = episodes.iter().filter_map(trajectory).collect();
        let advantages = if trajectories.is_empty() {
            Vec::new()
        } else {
            group_advantages(&trajectories)?
        };
        let kept: Vec<TrainSequence> = trajectories
            .iter()
            .zip(&advantages)
            .filter(|(_, &a)| a != 0.0)
            .map(|(t, &a)| TrainSequence::from_trajectory(t, a))
            .collect();
        let train_started = Instant::now();
        // The engine's KV cache gives its memory to the trainer while it runs.
        if let Sampler::Engine(handle) = &sampler {
            handle.release_kv_cache()?;
        }
        let refs: Vec<&TrainSequence> = kept.iter().collect();
        // logp_old: the trainer's logprobs under the weights that produced the rollouts.
        let olds = learner.logprobs(&refs)?;
        let gap = logprob_gap(&kept, &olds);
        let order = shuffled(kept.len(), episode_seed(agent.seed, "batches", iteration));
        let mut action_tokens = 0;
        for chunk in order.chunks(options.batch_size) {
            let batch: Vec<&TrainSequence> = chunk.iter().map(|&i| &kept[i]).collect();
            let batch_olds: Vec<&[f32]> = chunk.iter().map(|&i| olds[i].as_slice()).collect();
            step += 1;
            let lr = if step <= options.warmup_steps {
                options.lr * step as f64 / options.warmup_steps as f64
            } else {
                options.lr
            };
            let report = learner.step(&batch, &batch_olds, &dapo, lr)?;
            action_tokens += report.metrics["action_tokens"].as_u64().unwrap_or(0) as usize;
            append_step(&metrics_path, step, iteration, report.metrics)?;
        }
        let training_s = train_started.elapsed().as_secs_f64();
        let handoff_s = if kept.is_empty() {
            0.0
        } else {
            weight_version += 1;
            handoff(&learner, &sampler, &model_dir, &agent.out)?
        };
        let restore_started = Instant::now();
        if let Sampler::Engine(handle) = &sampler {
            handle.restore_kv_cache()?;
        }
        let kv_restore_s = restore_started.elapsed().as_secs_f64();
        let line = iteration_line(
            (iteration, "dapo"),
            &episodes,
            Trained {
                kept: kept.len(),
                action_tokens,
                gap,
            },
            &json!({"rollout": rollout_s, "environment": env_time(&episodes), "grading": grade_time(&episodes), "training": training_s, "handoff": handoff_s, "kv_cache_restore": kv_restore_s}),
            weight_version,
        );
        append_line(&iterations_path, &line)?;
        eprintln!(
            "iteration {iteration}: reward {:.3} resolved {:.3} turns {:.2} kept {}/{} gap {:.1e} | rollout {:.1}s train {:.1}s handoff {:.3}s",
            line["reward_mean"].as_f64().unwrap_or(0.0),
            line["resolved_rate"].as_f64().unwrap_or(0.0),
            line["mean_turns"].as_f64().unwrap_or(0.0),
            kept.len(),
            episodes.len(),
            gap.0,
            rollout_s,
            training_s,
            handoff_s
        );
        history.push(line);
        plot::write_reward_plot(&agent.out.join("reward.png"), &history)?;
        eprintln!("{}", plot::sparkline(&history));
        if options.save_every > 0
            && (iteration % options.save_every == 0 || iteration == options.iterations)
        {
            checkpoint_iteration(
                &learner,
                &model_dir,
                &agent.out,
                iteration,
                step,
                weight_version,
            )?;
        }
    }
    Ok(())
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
fn handoff<B: BackendGrad>(
    learner: &Learner<'_, B>,
    sampler: &Sampler,
    model_dir: &Path,
    out: &Path,
) -> Result<f64> {
    let started = Instant::now();
    match sampler {
        Sampler::Engine(handle) => match learner.compute_weight_spans()? {
            // Same device: the engine copies the trainer's bf16 buffers device to device.
            // SAFETY: the learner is borrowed (nothing trains) until the engine has replied.
            Some(spans) => {
                unsafe { handle.update_weights_from_device(spans) }?;
            }
            None => {
                handle.update_weights_from(learner.compute_weights()?)?;
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

fn checkpoint_iteration<B: BackendGrad>(
    learner: &Learner<'_, B>,
    model_dir: &Path,
    out: &Path,
    iteration: usize,
    step: u64,
    weight_version: u64,
) -> Result<PathBuf> {
    let dir = out.join(format!("iteration-{iteration:06}"));
    let state = json!({"iteration": iteration, "step": step, "updates": learner.updates(), "weight_version": weight_version});
    learner.save(model_dir, &dir, &state)?;
    Ok(dir)
}

/// Keeps the lines of `path` whose `key` is at most `last` (a resumed run rewrites the rest).
fn keep_lines(path: &Path, key: &str, last: u64) -> Result<()> {
    let Ok(text) = std::fs::read_to_string(path) else {
        return Ok(());
    };
    let kept: String = text
        .lines()
        .filter(|l| {
            serde_json::from_str::<Value>(l)
                .ok()
                .and_then(|v| v[key].as_u64())
                .is_some_and(|v| v <= last)
        })
        .map(|l| format!("{l}\n"))
        .collect();
    std::fs::write(path, kept).with_context(|| format!("rewriting {}", path.display()))
}

fn read_history(path: &Path) -> Result<Vec<Value>> {
    let Ok(text) = std::fs::read_to_string(path) else {
        return Ok(Vec::new());
    };
    text.lines()
        .map(|l| serde_json::from_str(l).with_context(|| format!("{}: a bad line", path.display())))
        .collect()
}
