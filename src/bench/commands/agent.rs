//! `swerve-bench agent`: the agent-shaped rollout workload ([`crate::bench::agent`]) through the
//! engine in process on a preset model with random weights, its KV cache sized for the workload,
//! and with `http` the same workload through a `swerve-serve` child process on the same model
//! ([`crate::bench::agent_http`]).

use super::{append_jsonl, random_model};
use crate::backend::{select, Backend, DeviceChoice, Selected};
use crate::bench::agent::{print_report, run, AgentWorkload};
use crate::bench::agent_http::{print_http_report, run_http, ServeProcess};
use crate::bench::slow_env::SlowEnvOptions;
use crate::config::ModelConfig;
use crate::engine::{Engine, EngineConfig};
use crate::model::{synthetic, PagedKv};
use anyhow::{bail, Context, Result};
use std::path::PathBuf;

pub struct AgentOptions {
    /// A `synthetic::preset` name.
    pub preset: String,
    pub device: DeviceChoice,
    /// Largest context a rollout grows to (`None`: 640 on the CPU, 32768 on a GPU).
    pub max_context: Option<usize>,
    /// Tasks (`None`: 2 on the CPU, 8 on a GPU).
    pub tasks: Option<usize>,
    /// Rollouts per task, sharing the task's prompt (`None`: 4 on the CPU, 10 on a GPU).
    pub group: Option<usize>,
    /// Fraction of free GPU memory given to the KV cache.
    pub kv_cache_fraction: f64,
    /// Also run the workload through `swerve-serve`'s HTTP API (from this executable's folder).
    pub http: bool,
    /// Also append the results as JSON records to this file.
    pub jsonl: Option<PathBuf>,
    /// `(start_s, command_s)`: run the slow-environment comparison instead
    /// ([`crate::bench::slow_env`]).
    pub slow_env: Option<(f64, f64)>,
}

impl AgentOptions {
    /// `default` with the flags given applied.
    fn workload(&self, mut default: AgentWorkload) -> AgentWorkload {
        if let Some(c) = self.max_context {
            default.max_context = c;
        }
        if let Some(t) = self.tasks {
            default.tasks = t;
        }
        if let Some(g) = self.group {
            default.group = g;
        }
        default
    }
}

pub fn agent(options: &AgentOptions) -> Result<()> {
    let (config, tp_size) = synthetic::preset(&options.preset)?;
    let (backend, line) = select(options.device)?;
    println!("{line}");
    if let Some((start_s, command_s)) = options.slow_env {
        let gpu = matches!(backend, Selected::Cuda(_));
        drop(backend);
        return slow_env(options, gpu, start_s, command_s);
    }
    match backend {
        Selected::Cpu(b) => {
            let workload = options.workload(AgentWorkload::cpu());
            // Every rollout at its largest context, plus slack: no preemption needed.
            let tokens = workload.tasks * workload.group * (workload.max_context + 16);
            let num_blocks = agent_on(b, config.clone(), tp_size, options, &workload, tokens)?;
            agent_http(options, &config, tp_size, &workload, num_blocks, "cpu")
        }
        Selected::Cuda(b) => {
            let workload = options.workload(AgentWorkload::full(32768.min(config.max_context())));
            let (free, _) = b.device.ctx.mem_get_info()?;
            let local = config.local_sizes(tp_size)?;
            let weights = config.num_parameters() / tp_size * 2;
            let per_token = PagedKv::<()>::bytes_per_token(&config, &local, 2);
            // Activations of an 8,192-token step stay well inside the last 15 % and 4 GiB.
            let budget = (free.saturating_sub(weights) as f64 * options.kv_cache_fraction) as usize;
            let tokens = budget.saturating_sub(4 << 30) / per_token;
            let num_blocks = agent_on(*b, config.clone(), tp_size, options, &workload, tokens)?;
            agent_http(options, &config, tp_size, &workload, num_blocks, "cuda")
        }
    }
}

/// The workload in process on an engine with `kv_tokens` tokens of KV cache; returns the
/// cache's size in blocks (the HTTP run gets the same).
fn agent_on<B: Backend>(
    backend: B,
    config: ModelConfig,
    tp_size: usize,
    options: &AgentOptions,
    workload: &AgentWorkload,
    kv_tokens: usize,
) -> Result<usize> {
    if workload.max_context > config.max_context() {
        bail!(
            "--max-context {} exceeds the model's context of {}",
            workload.max_context,
            config.max_context()
        );
    }
    let model = random_model(&backend, config, tp_size)?;
    let mut engine_config = EngineConfig::for_model(workload.max_context, 0);
    engine_config.num_blocks = kv_tokens / engine_config.block_size + 1;
    if engine_config.num_blocks < workload.max_context / engine_config.block_size + 2 {
        bail!(
            "only {kv_tokens} tokens of KV cache fit: not one rollout of {} tokens",
            workload.max_context
        );
    }
    println!(
        "model: preset {}, random weights; KV cache {} blocks of {}; workload: {}",
        options.preset,
        engine_config.num_blocks,
        engine_config.block_size,
        workload.describe()
    );
    let num_blocks = engine_config.num_blocks;
    let mut engine = Engine::new(backend, model, engine_config)?;
    let report = run(&mut engine, workload)?;
    print_report(&report);
    if let Some(path) = &options.jsonl {
        append_jsonl(
            path,
            &[serde_json::json!({
                "table": "agent", "impl": "swerve", "key": format!("preset={} {}", options.preset, workload.describe()),
                "tokens_per_s": report.tokens_per_second, "prefix_hit_rate": report.prefix_hit_rate,
                "mean_step_ms": report.mean_step_ms, "host_overhead": report.host_overhead_fraction,
                "steps": report.steps, "preemptions": report.preemptions, "note": engine.backend.name(),
                "host_us_per_token": report.host_seconds_per_token * 1e6,
            })],
        )?;
    }
    Ok(num_blocks)
}

/// With `http`: the same workload through `swerve-serve` on the same random model, written to a
/// temporary folder (removed afterwards).
fn agent_http(
    options: &AgentOptions,
    config: &ModelConfig,
    tp_size: usize,
    workload: &AgentWorkload,
    num_blocks: usize,
    device: &str,
) -> Result<()> {
    if !options.http {
        return Ok(());
    }
    if tp_size != 1 {
        bail!(
            "--http needs a preset of tensor-parallel size 1; {} is one rank of {tp_size}",
            options.preset
        );
    }
    let dir = std::env::temp_dir().join(format!("swerve-bench-model-{}", std::process::id()));
    synthetic::write_model_dir(config, 0x5EED, &dir)?;
    let result = serve_and_run(options, config, workload, num_blocks, device, &dir);
    let _ = std::fs::remove_dir_all(&dir);
    result
}

/// Starts `swerve-serve` on the model folder `model_dir` and runs the workload through it.
fn serve_and_run(
    options: &AgentOptions,
    config: &ModelConfig,
    workload: &AgentWorkload,
    num_blocks: usize,
    device: &str,
    model_dir: &std::path::Path,
) -> Result<()> {
    let bin = std::env::current_exe()?.with_file_name("swerve-serve");
    let name = "swerve-bench";
    let server_args: Vec<String> = [
        "--model",
        model_dir
            .to_str()
            .context("temporary folder path is not UTF-8")?,
        "--port",
        "0",
        "--device",
        device,
        "--served-model-name",
        name,
    ]
    .iter()
    .map(|s| s.to_string())
    .chain([
        "--max-model-len".to_string(),
        workload.max_context.to_string(),
        "--num-kv-blocks".to_string(),
        num_blocks.to_string(),
    ])
    .collect();
    let server = ServeProcess::start(&bin, &server_args)?;
    let report = run_http(
        server.addr,
        name,
        workload,
        config.vocab_size,
        workload.max_context,
    )?;
    print_http_report(&report);
    if let Some(path) = &options.jsonl {
        append_jsonl(
            path,
            &[serde_json::json!({
                "table": "agent_http", "impl": "swerve",
                "key": format!("preset={} {}", options.preset, workload.describe()),
                "tokens_per_s": report.tokens_per_second, "prefix_hit_rate": report.prefix_hit_rate,
                "host_us_per_token": report.host_seconds_per_token * 1e6, "note": device,
            })],
        )?;
    }
    Ok(())
}

/// `--slow-env START_S,COMMAND_S`: coupled knobs, separate knobs, separate knobs with a warm
/// pool, on the preset's model written to a temporary folder.
fn slow_env(options: &AgentOptions, gpu: bool, start_s: f64, command_s: f64) -> Result<()> {
    let work = std::env::temp_dir().join(format!("swerve-bench-slow-env-{}", std::process::id()));
    let model = PathBuf::from(format!("preset:{}", options.preset));
    let result = crate::model::model_arg::resolve_model_arg(&model, &work).and_then(|dir| {
        let bench = SlowEnvOptions {
            preset: options.preset.clone(),
            device: options.device,
            start_s,
            command_s,
            batch: if gpu { 16 } else { 2 },
            tasks: options.tasks.unwrap_or(if gpu { 4 } else { 2 }),
            group: options.group.unwrap_or(if gpu { 16 } else { 8 }),
            turns: if gpu { 5 } else { 3 },
            gen_tokens: if gpu { 128 } else { 8 },
        };
        println!(
            "slow environment: sandboxes start in {start_s} s, commands take {command_s} s; {} tasks x {} episodes, {} turns of {} generated tokens, engine batch {}",
            bench.tasks, bench.group, bench.turns, bench.gen_tokens, bench.batch
        );
        crate::bench::slow_env::run(&bench, &dir)
    });
    let _ = std::fs::remove_dir_all(&work);
    let records = result?;
    crate::bench::slow_env::print(&records);
    if let Some(path) = &options.jsonl {
        append_jsonl(path, &records)?;
    }
    Ok(())
}
