//! `swerve-bench agent --slow-env START_S,COMMAND_S`: what separate knobs and warm pools do when
//! the environment is slow. Episodes run through the rollout machinery (`run_episodes`: worker
//! threads, the job queue, warm-pool fillers) against the in-process engine on a preset model,
//! in an environment whose sandboxes take START_S to start and whose commands take COMMAND_S.
//!
//! ```text
//!   every turn:  the engine generates `gen_tokens` (real decode steps, batched across episodes)
//!                then the episode runs one command (a sleep of COMMAND_S)
//!   episode:     sandbox start (START_S) ─ `turns` turns ─ grading (one more command)
//!
//!   coupled        --sandboxes = --concurrency = B    (one knob: sleeping episodes hold slots)
//!   separate       --sandboxes 4B, --concurrency B    (the engine's queue stays full)
//!   separate+warm  the same, --warm-pool B            (start-up off the episodes' path)
//! ```
//!
//! Per configuration: wall time, the engine's busy fraction (its step time over the wall time:
//! on a GPU, how busy the GPU is kept), the mean batch of a step, the mean episode wall time,
//! and the start-up exposed (episodes waited) and hidden (a filler started it ahead).

use crate::agent::episode::{EpisodeConfig, EpisodeContext, Finish};
use crate::agent::policy::{
    tool_call_text, EnginePolicy, Policy, Script, ScriptedPolicy, TurnInput, TurnOutput,
};
use crate::agent::rollout::{episode_times, run_episodes, Workers};
use crate::agent::sampling::launch_rollout_engine;
use crate::backend::DeviceChoice;
use crate::chat::ChatTemplate;
use crate::env::{builtin, load_tasks, CommandOutput, Environment, Limits, Sandbox, Task};
use crate::tokenizer::Tokenizer;
use anyhow::{bail, Result};
use serde_json::{json, Value};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub struct SlowEnvOptions {
    pub preset: String,
    pub device: DeviceChoice,
    /// Seconds a sandbox takes to start (its setup included).
    pub start_s: f64,
    /// Seconds every command takes.
    pub command_s: f64,
    /// The engine's batch limit (B).
    pub batch: usize,
    /// Tasks and samples per task: `tasks * group` episodes per configuration.
    pub tasks: usize,
    pub group: usize,
    /// Commands per episode (then a submit).
    pub turns: usize,
    /// Tokens the engine generates per turn.
    pub gen_tokens: usize,
}

/// Sandboxes that start in `start` and run every command in `command` (a sleep).
struct SlowEnvironment {
    start: Duration,
    command: Duration,
    limits: Limits,
}

struct SlowSandbox {
    command: Duration,
    limits: Limits,
}

impl Environment for SlowEnvironment {
    fn name(&self) -> &'static str {
        "slow"
    }

    fn start(&self, _task: &Task, _episode: &str) -> Result<Box<dyn Sandbox>> {
        std::thread::sleep(self.start);
        Ok(Box::new(SlowSandbox {
            command: self.command,
            limits: self.limits.clone(),
        }))
    }

    fn limits(&self) -> &Limits {
        &self.limits
    }
}

impl Sandbox for SlowSandbox {
    fn workdir(&self) -> &str {
        "/workspace"
    }

    fn limits(&self) -> &Limits {
        &self.limits
    }

    fn exec(&mut self, _: &str, _: Option<&[u8]>, _: Duration, _: usize) -> Result<CommandOutput> {
        std::thread::sleep(self.command);
        Ok(CommandOutput {
            output: "ok\n".into(),
            exit_code: Some(0),
            elapsed: self.command,
            ..CommandOutput::default()
        })
    }

    fn copy_in(&mut self, _: &Path) -> Result<()> {
        Ok(())
    }

    fn close(&mut self) -> Result<()> {
        Ok(())
    }
}

/// The model generates a turn's tokens (the GPU work), then a script writes the reply: a
/// command on every turn but the last, then a submit. The engine sees the transcript's ids
/// modulo its vocabulary (a preset's random model may have a smaller one than the Qwen2.5
/// tokenizer writing the transcript): the same lengths and prefixes, so the same work.
struct GenerateThenCommand {
    model: EnginePolicy,
    script: ScriptedPolicy,
    gen_tokens: usize,
    vocab: u32,
}

impl Policy for GenerateThenCommand {
    fn name(&self) -> String {
        "model-then-script".into()
    }

    fn generate(&self, input: &TurnInput<'_>) -> Result<TurnOutput> {
        let prompt: Vec<u32> = input.tokens.iter().map(|&t| t % self.vocab).collect();
        let generated = self.model.generate(&TurnInput {
            tokens: &prompt,
            max_tokens: self.gen_tokens,
            ..*input
        })?;
        if generated.tokens.len() != self.gen_tokens {
            bail!(
                "the engine generated {} tokens of {}",
                generated.tokens.len(),
                self.gen_tokens
            );
        }
        self.script.generate(input)
    }

    fn abort_in_flight(&self) {
        self.model.abort_in_flight();
    }
}

/// Runs the three configurations on `model_dir` (a preset's folder) and returns their records.
pub fn run(options: &SlowEnvOptions, model_dir: &Path) -> Result<Vec<Value>> {
    if options.batch == 0 || options.tasks == 0 || options.group == 0 || options.gen_tokens == 0 {
        bail!("--slow-env: the batch, --tasks, --group and the tokens per turn must be at least 1");
    }
    let tokenizer = Arc::new(Tokenizer::for_model_dir(model_dir)?);
    let mut tasks = load_tasks(&builtin::resolve_tasks("builtin:toy")?)?;
    tasks.truncate(options.tasks);
    if tasks.len() < options.tasks {
        bail!("--tasks {}: the toy set has {}", options.tasks, tasks.len());
    }
    let bench = Bench {
        options,
        model_dir,
        vocab: crate::config::ModelConfig::from_dir(model_dir)?.vocab_size as u32,
        template: ChatTemplate::for_tokenizer(&tokenizer)?,
        tokenizer,
        tasks,
        env: SlowEnvironment {
            start: Duration::from_secs_f64(options.start_s),
            command: Duration::from_secs_f64(options.command_s),
            limits: Limits::default(),
        },
    };
    let b = options.batch;
    [
        ("coupled", b, 0),
        ("separate", 4 * b, 0),
        ("separate+warm", 4 * b, b),
    ]
    .into_iter()
    .map(|(name, sandboxes, warm_pool)| {
        bench.configuration(
            name,
            Workers {
                sandboxes,
                warm_pool,
            },
        )
    })
    .collect()
}

/// What every configuration shares.
struct Bench<'a> {
    options: &'a SlowEnvOptions,
    model_dir: &'a Path,
    vocab: u32,
    tokenizer: Arc<Tokenizer>,
    template: ChatTemplate,
    tasks: Vec<Task>,
    env: SlowEnvironment,
}

impl Bench<'_> {
    /// One configuration on a fresh engine: its record.
    fn configuration(&self, name: &str, workers: Workers) -> Result<Value> {
        let options = self.options;
        let engine = Arc::new(launch_rollout_engine(
            self.model_dir,
            options.device,
            4096,
            options.batch,
            0,
            1,
        )?);
        let command = tool_call_text("bash", &json!({"command": "sleep"}));
        let policy = GenerateThenCommand {
            model: EnginePolicy {
                engine: engine.clone(),
                stop_ids: Vec::new(),
                temperature: 1.0,
            },
            script: ScriptedPolicy {
                tokenizer: self.tokenizer.clone(),
                script: Script::Replies(vec![command; options.turns]),
            },
            gen_tokens: options.gen_tokens,
            vocab: self.vocab,
        };
        let config = EpisodeConfig {
            max_turns: options.turns + 1,
            max_context: 4096,
            max_turn_tokens: options.gen_tokens.max(256),
            ..EpisodeConfig::default()
        };
        let ctx = EpisodeContext {
            env: &self.env,
            policy: &policy,
            tokenizer: &self.tokenizer,
            template: &self.template,
            config: &config,
        };
        let before = engine.stats()?;
        let started = Instant::now();
        let episodes = run_episodes(&ctx, &self.tasks, options.group, workers, 0, name);
        let wall = started.elapsed().as_secs_f64();
        let after = engine.stats()?;
        drop(policy);
        if let Ok(handle) = Arc::try_unwrap(engine) {
            handle.shutdown();
        }
        if let Some(message) = episodes.iter().find_map(|e| match &e.finish {
            Finish::Error(message) => Some(message),
            _ => None,
        }) {
            bail!("{name}: an episode failed, so the figures would mean nothing: {message}");
        }
        let steps = (after.steps - before.steps).max(1);
        let times = episode_times(&episodes);
        let episode_wall: f64 = episodes
            .iter()
            .map(|e| e.generation_s + e.environment_s + e.grading_s)
            .sum::<f64>()
            / episodes.len().max(1) as f64;
        Ok(json!({
            "bench": "agent-slow-env",
            "preset": options.preset,
            "configuration": name,
            "sandboxes": workers.sandboxes,
            "warm_pool": workers.warm_pool,
            "engine_batch": options.batch,
            "episodes": episodes.len(),
            "start_s": options.start_s,
            "command_s": options.command_s,
            "wall_s": wall,
            "engine_busy_fraction": (after.total_step_seconds - before.total_step_seconds) / wall,
            "mean_step_batch": (after.generated_tokens - before.generated_tokens) as f64 / steps as f64,
            "episode_wall_mean_s": episode_wall,
            "startup_exposed_s": times["startup_exposed"],
            "startup_hidden_s": times["startup_hidden"],
        }))
    }
}

/// The records as a table.
pub fn print(records: &[Value]) {
    println!(
        "{:<14} {:>9} {:>5} {:>6} {:>8} {:>11} {:>10} {:>12} {:>10} {:>10}",
        "config",
        "sandboxes",
        "warm",
        "batch",
        "wall s",
        "engine busy",
        "step batch",
        "episode s",
        "exposed s",
        "hidden s"
    );
    for r in records {
        println!(
            "{:<14} {:>9} {:>5} {:>6} {:>8.2} {:>10.1}% {:>10.2} {:>12.2} {:>10.2} {:>10.2}",
            r["configuration"].as_str().unwrap_or(""),
            r["sandboxes"].as_u64().unwrap_or(0),
            r["warm_pool"].as_u64().unwrap_or(0),
            r["engine_batch"].as_u64().unwrap_or(0),
            r["wall_s"].as_f64().unwrap_or(0.0),
            100.0 * r["engine_busy_fraction"].as_f64().unwrap_or(0.0),
            r["mean_step_batch"].as_f64().unwrap_or(0.0),
            r["episode_wall_mean_s"].as_f64().unwrap_or(0.0),
            r["startup_exposed_s"].as_f64().unwrap_or(0.0),
            r["startup_hidden_s"].as_f64().unwrap_or(0.0),
        );
    }
}
