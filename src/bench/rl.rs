//! `swerve-bench rl`: what one RL iteration costs on a preset model, and the in-memory weight
//! handoff from the trainer to the engine against the size of the weights.
//!
//! ```text
//!   handoff:    trainer compute weights -> engine, device to device on a GPU, one tensor at a
//!               time through the host on the CPU (prefix cache reset, version + 1), timed
//!               `reps` times: seconds and GB/s of weights moved
//!   iteration:  `swerve-train rl` for one iteration on built-in Python tasks through the local
//!               sandbox (the model is random, so its turns are format errors: the point is
//!               the time split), read back from iterations.jsonl
//!   gap:        every sampled token of that iteration's episodes (`--save-rollouts`), kept or
//!               not, scored by the trainer under the same weights: max and mean |sampler
//!               logprob - trainer logprob| (0 where the engine and the trainer are exact)
//! ```

use crate::agent::command::AgentRunOptions;
use crate::agent::episode::EpisodeConfig;
use crate::agent::rollout::Workers;
use crate::backend::grad::BackendGrad;
use crate::backend::DeviceChoice;
use crate::engine::launch::{launch_engine, EngineLaunch};
use crate::env::{EnvKind, Limits};
use crate::rl::RlOptions;
use crate::train::learner::Learner;
use crate::train::optimizer::AdamWConfig;
use anyhow::{Context, Result};
use serde_json::{json, Value};
use std::path::Path;
use std::time::Instant;

pub struct RlBenchOptions {
    pub preset: String,
    pub device: DeviceChoice,
    pub reps: usize,
    pub tasks_per_iteration: usize,
    pub group: usize,
    pub max_turns: usize,
    pub max_turn_tokens: usize,
    pub max_context: usize,
}

/// Runs both measurements on `backend` (the trainer's); the engine gets its own on `device`.
pub fn run<B: BackendGrad>(backend: &B, options: &RlBenchOptions, work: &Path) -> Result<Value> {
    let model_arg = std::path::PathBuf::from(format!("preset:{}", options.preset));
    let model_dir = crate::model::model_arg::resolve_model_arg(&model_arg, work)?;
    let config = crate::config::ModelConfig::from_dir(&model_dir)?;
    let handoff = measure_handoff(backend, options, &model_dir, config.num_parameters())?;
    let out = work.join("rl-iteration");
    let _ = std::fs::remove_dir_all(&out);
    let rl = iteration_options(options, &model_dir, config.max_context(), &out);
    let (wall, time_s) = run_iteration(backend, options, &rl)?;
    let (gap_max, gap_mean, gap_tokens) = measure_gap(backend, &model_dir, &config, &out)?;
    Ok(json!({
        "bench": "rl",
        "preset": options.preset,
        "handoff_s": handoff.median_s,
        "handoff_gb_per_s": handoff.engine_bytes as f64 / 1e9 / handoff.median_s,
        "weights_gb": handoff.engine_bytes as f64 / 1e9,
        "iteration_wall_s": wall,
        "iteration_time_s": time_s,
        "logprob_gap_max": gap_max,
        "logprob_gap_mean": gap_mean,
        "logprob_gap_tokens": gap_tokens,
    }))
}

/// The trainer's logprobs of every sampled token of the iteration's saved episodes against the
/// sampler's: (max gap, mean gap, tokens compared).
fn measure_gap<B: BackendGrad>(
    backend: &B,
    model_dir: &Path,
    config: &crate::config::ModelConfig,
    out: &Path,
) -> Result<(f64, f64, usize)> {
    // The one iteration's episodes, sampled under the weights in `model_dir` (a fresh learner
    // loads those, whatever the iteration trained afterwards).
    let dir = out.join("rollouts");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    files.sort();
    let path = files
        .first()
        .with_context(|| format!("no saved rollouts in {}", dir.display()))?
        .clone();
    let data = crate::train::data::read_trajectories(
        &path,
        model_dir,
        config.vocab_size,
        config.max_context(),
        false,
    )?;
    let episodes = &data.trajectories;
    let sequences: Vec<_> = (0..episodes.len())
        .filter(|&i| episodes.has_rollout_logprobs(i))
        .map(|i| episodes.train_sequence(i, 0.0))
        .collect();
    let learner = Learner::new(backend, model_dir, AdamWConfig::default(), 16384, true)?;
    let refs: Vec<_> = sequences.iter().collect();
    let trainer = learner.logprobs(&refs)?;
    let (max, mean) = crate::rl::iteration::logprob_gap(&sequences, &trainer);
    let tokens: usize = sequences.iter().map(|s| s.num_action_tokens()).sum();
    println!(
        "logprob gap, sampler vs trainer over every sampled token ({tokens} in {} episodes): max {max:.3e}, mean {mean:.3e}",
        sequences.len()
    );
    Ok((max, mean, tokens))
}

/// The weight handoff's median time and the bytes the engine holds.
struct Handoff {
    median_s: f64,
    engine_bytes: usize,
}

/// Times `reps` handoffs of the learner's weights to a fresh engine (device to device where the
/// learner has device spans, through the host otherwise) and prints the median.
fn measure_handoff<B: BackendGrad>(
    backend: &B,
    options: &RlBenchOptions,
    model_dir: &Path,
    params: usize,
) -> Result<Handoff> {
    let learner = Learner::new(backend, model_dir, AdamWConfig::default(), 8192, true)?;
    let engine = launch_engine(&EngineLaunch {
        model: model_dir.to_path_buf(),
        device: options.device,
        max_model_len: 256,
        kv_cache_fraction: 0.5,
        num_kv_blocks: Some(64),
        max_num_seqs: 4,
        max_num_batched_tokens: 2048,
        seed: 0,
        tensor_parallel: 1,
    })?;
    let mut seconds = Vec::new();
    for _ in 0..options.reps.max(1) {
        let started = Instant::now();
        match learner.compute_weight_spans()? {
            // SAFETY: the learner is not trained while the engine copies.
            Some(rank) => unsafe { engine.update_weights_from_device(vec![rank]) }?,
            None => engine.update_weights_streamed(|out| learner.send_compute_weights(out))?,
        };
        seconds.push(started.elapsed().as_secs_f64());
    }
    drop(engine);
    drop(learner);
    seconds.sort_by(f64::total_cmp);
    let median = seconds[seconds.len() / 2];
    // What the engine holds: bf16 on a GPU, f32 on the CPU reference.
    let engine_bytes = params
        * if options.device == DeviceChoice::Cpu {
            4
        } else {
            2
        };
    println!(
        "handoff: {} parameters ({:.2} GB in the engine), median {:.3} s of {} -> {:.2} GB/s",
        params,
        engine_bytes as f64 / 1e9,
        median,
        seconds.len(),
        engine_bytes as f64 / 1e9 / median
    );
    Ok(Handoff {
        median_s: median,
        engine_bytes,
    })
}

/// `swerve-train rl` for one iteration on the built-in Python tasks, writing into `out`.
fn iteration_options(
    options: &RlBenchOptions,
    model_dir: &Path,
    model_max_context: usize,
    out: &Path,
) -> RlOptions {
    RlOptions {
        agent: AgentRunOptions {
            model: Some(model_dir.to_path_buf()),
            tasks: "builtin:python-bugs".into(),
            out: out.to_path_buf(),
            group: options.group,
            episode: EpisodeConfig {
                max_turns: options.max_turns,
                turn_threshold: 10,
                max_context: options.max_context,
                max_turn_tokens: options.max_turn_tokens,
                observation_bytes: 16 * 1024,
                infra_retries: 2,
                suspicious_reward: Default::default(),
            },
            max_context: Some(options.max_context.min(model_max_context)),
            env: EnvKind::Local,
            limits: Limits::default(),
            sandbox_binds: Vec::new(),
            docker_image: String::new(),
            docker_cli: "docker".into(),
            kubernetes: Default::default(),
            concurrency: options.tasks_per_iteration * options.group,
            workers: Workers {
                sandboxes: options.tasks_per_iteration * options.group,
                warm_pool: 0,
            },
            seed: 0,
            policy: "model".into(),
            swebench_rules: Default::default(),
            resolved_config: None,
            server: None,
            api_key: None,
            device: options.device,
            only_resolved: false,
            limit_tasks: None,
        },
        iterations: 1,
        tasks_per_iteration: options.tasks_per_iteration,
        batch_size: 8,
        lr: 1e-6,
        warmup_steps: 0,
        weight_decay: 0.1,
        grad_clip: Some(1.0),
        eps_low: 0.2,
        eps_high: 0.3,
        tis_cap: None,
        micro_batch_tokens: 16384,
        save_every: 0,
        start: crate::train::run_dir::RunStart::Fresh,
        rft_first: None,
        rft_lr: 5e-6,
        rft_warmup_steps: 10,
        rft_batch_size: 64,
        rft_epochs: 1,
        save_rollouts: true,
        tensor_parallel: 1,
        offload_optimizer: false,
        rollout_deadline: None,
    }
}

/// Runs the iteration and prints its time split, read back from `iterations.jsonl`: the wall
/// time and the iteration's `time_s` object.
fn run_iteration<B: BackendGrad>(
    backend: &B,
    options: &RlBenchOptions,
    rl: &RlOptions,
) -> Result<(f64, Value)> {
    let out = &rl.agent.out;
    let started = Instant::now();
    crate::rl::run(backend, rl)?;
    let wall = started.elapsed().as_secs_f64();
    let text = std::fs::read_to_string(out.join("iterations.jsonl"))
        .with_context(|| format!("reading {}", out.display()))?;
    let line: Value = serde_json::from_str(text.lines().next().unwrap_or("{}"))?;
    let t = &line["time_s"];
    println!(
        "iteration ({} tasks x {} rollouts, {} turns of at most {} tokens): {:.2} s wall; rollout {:.2} s (environment {:.2} s and grading {:.2} s summed over episodes), training {:.2} s, handoff {:.3} s",
        options.tasks_per_iteration,
        options.group,
        options.max_turns,
        options.max_turn_tokens,
        wall,
        t["rollout"].as_f64().unwrap_or(0.0),
        t["environment"].as_f64().unwrap_or(0.0),
        t["grading"].as_f64().unwrap_or(0.0),
        t["training"].as_f64().unwrap_or(0.0),
        t["handoff"].as_f64().unwrap_or(0.0),
    );
    Ok((wall, t.clone()))
}
