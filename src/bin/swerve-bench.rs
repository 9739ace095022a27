//! swerve-bench: throughput. With no arguments: prefill tokens/s of the embedded default model
//! (built in memory, no download) on the backend in use, as a table.

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use std::io::Write;
use std::path::{Path, PathBuf};
use swerve::backend::{select, Backend, CudaBackend, DeviceChoice, Selected};
use swerve::bench;
use swerve::model::{synthetic, Qwen2Model};

#[derive(Parser)]
#[command(
    name = "swerve-bench",
    version,
    about = "swerve's throughput benchmarks"
)]
#[command(args_conflicts_with_subcommands = true)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    /// With no subcommand: `prefill` with these options.
    #[command(flatten)]
    prefill: PrefillArgs,
}

#[derive(Subcommand)]
enum Command {
    /// Prefill tokens/s and model TFLOP/s of one sequence at each length (the default command).
    Prefill(PrefillArgs),
    /// An agent-shaped rollout workload through the engine: G rollouts per task, multi-turn,
    /// growing contexts; tokens/s, prefix-cache hit rate, step time and host overhead.
    Agent(AgentArgs),
    /// Decode steps over the paged KV cache at several batch sizes (tokens/s, share of the
    /// bandwidth roofline on a GPU), and paged decode attention alone at long contexts.
    Decode(DecodeArgs),
    /// One training step (forward, fused loss, backward, AdamW) on packed tokens: tokens/s,
    /// model TFLOP/s, MFU against the measured GEMM rate and device memory on a GPU.
    Train(TrainArgs),
    /// One RL iteration's time split (rollout, environment, grading, training, handoff) on a
    /// preset model, and the in-memory weight handoff against the size of the weights (GB/s).
    Rl(RlArgs),
    /// Each CUDA kernel against the CPU reference and the card's measured ceilings (needs a GPU).
    Kernels {
        /// Also append one JSON record per row to this file (bench/peers/compare.py reads it).
        #[arg(long)]
        jsonl: Option<PathBuf>,
    },
}

#[derive(clap::Args)]
struct RlArgs {
    /// Model shape with the Qwen2.5 vocabulary (default: tiny on the CPU, qwen2.5-0.5b on a GPU).
    #[arg(long)]
    preset: Option<String>,
    #[arg(long, default_value = "auto")]
    device: DeviceChoice,
    /// Handoffs timed (the median is reported).
    #[arg(long, default_value_t = 3)]
    reps: usize,
    /// Tasks and rollouts per task of the iteration (default: 2 x 2 on the CPU, 8 x 8 on a GPU).
    #[arg(long)]
    tasks: Option<usize>,
    /// Rollouts per task of the iteration.
    #[arg(long)]
    group: Option<usize>,
    #[arg(long, default_value_t = 3)]
    max_turns: usize,
    /// Tokens per reply (default: 16 on the CPU, 256 on a GPU).
    #[arg(long)]
    max_turn_tokens: Option<usize>,
    #[arg(long, default_value_t = 8192)]
    max_context: usize,
    /// Also append the result as one JSON line to this file.
    #[arg(long)]
    jsonl: Option<PathBuf>,
}

#[derive(clap::Args)]
struct AgentArgs {
    /// Model shape (see `prefill --preset`); random weights.
    #[arg(long, default_value = "default")]
    preset: String,
    /// Where the engine runs: auto (the GPU when there is one), cpu, or cuda.
    #[arg(long, default_value = "auto")]
    device: DeviceChoice,
    /// Largest context a rollout grows to (default: 640 on the CPU, 32768 on a GPU).
    #[arg(long)]
    max_context: Option<usize>,
    /// Tasks and rollouts per task (default: 2 x 4 on the CPU, 8 x 10 on a GPU).
    #[arg(long)]
    tasks: Option<usize>,
    /// Rollouts per task (G): they share the task's prompt.
    #[arg(long)]
    group: Option<usize>,
    /// Fraction of free GPU memory given to the KV cache.
    #[arg(long, default_value_t = 0.85)]
    kv_cache_fraction: f64,
    /// Also run the workload through `swerve-serve`'s HTTP API (started from this binary's
    /// folder on the same random model, written to a temporary folder; tensor-parallel size 1
    /// presets only) and report host time per generated token next to the in-process figure.
    #[arg(long)]
    http: bool,
    /// Also append the result as one JSON record to this file.
    #[arg(long)]
    jsonl: Option<PathBuf>,
}

#[derive(clap::Args)]
struct DecodeArgs {
    /// Model shape (see `prefill --preset`); random weights.
    #[arg(long, default_value = "default")]
    preset: String,
    /// Sequences per step, comma-separated (default: 1,8,32,128 on a GPU, 1,4 on the CPU).
    #[arg(long, value_delimiter = ',')]
    batch_sizes: Vec<usize>,
    /// Tokens already cached per sequence when timing starts (default: 4096 on a GPU, 256 on
    /// the CPU).
    #[arg(long)]
    context: Option<usize>,
    /// Timed steps per batch size (after two warm-ups); the median is reported.
    #[arg(long, default_value_t = 16)]
    steps: usize,
    /// Contexts of the decode-attention rows (GPU only), comma-separated; 0 skips them.
    #[arg(long, value_delimiter = ',', default_values_t = [32768usize, 131072])]
    attention_contexts: Vec<usize>,
    /// Run every step op by op instead of replaying captured CUDA graphs.
    #[arg(long)]
    no_cuda_graphs: bool,
    /// Where the model runs: auto (the GPU when there is one), cpu, or cuda.
    #[arg(long, default_value = "auto")]
    device: DeviceChoice,
    /// Also append one JSON record per row to this file.
    #[arg(long)]
    jsonl: Option<PathBuf>,
}

#[derive(clap::Args)]
struct TrainArgs {
    /// Model shape (see `prefill --preset`); random weights. Tensor-parallel size 1 only.
    #[arg(long, default_value = "default")]
    preset: String,
    /// Packed tokens per step, comma-separated (default: 16384,32768 on a GPU, 256 on the CPU).
    #[arg(long, value_delimiter = ',')]
    tokens: Vec<usize>,
    /// Tokens per packed sequence (default: each step is one sequence).
    #[arg(long)]
    seq_len: Option<usize>,
    /// Timed steps per size (after one warm-up); the median is reported.
    #[arg(long, default_value_t = 3)]
    reps: usize,
    /// Where the model runs: auto (the GPU when there is one), cpu, or cuda.
    #[arg(long, default_value = "auto")]
    device: DeviceChoice,
    /// Also append one JSON record per row to this file.
    #[arg(long)]
    jsonl: Option<PathBuf>,
}

#[derive(clap::Args)]
struct PrefillArgs {
    /// Model shape: default (small, CPU-friendly), qwen2.5-0.5b, -1.5b, -7b, -32b, -72b-tp8 (one
    /// rank of tensor-parallel 8, no collective). Weights are random.
    #[arg(long, default_value = "default")]
    preset: String,
    /// Sequence lengths, comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = [128usize, 512])]
    seq_lens: Vec<usize>,
    /// Timed runs per length (after one warm-up); the median is reported.
    #[arg(long, default_value_t = 3)]
    reps: usize,
    /// Where the model runs: auto (the GPU when there is one), cpu, or cuda.
    #[arg(long, default_value = "auto")]
    device: DeviceChoice,
    /// Also append one JSON record per row to this file (bench/peers/compare.py reads it).
    #[arg(long)]
    jsonl: Option<PathBuf>,
}

fn main() -> Result<()> {
    if let Some(banner) = swerve::backend::cuda::emulation_banner() {
        eprintln!("{banner}");
    }
    let cli = Cli::parse();
    match cli.command.unwrap_or(Command::Prefill(cli.prefill)) {
        Command::Prefill(args) => prefill(args),
        Command::Kernels { jsonl } => kernels(jsonl.as_deref()),
        Command::Agent(args) => agent(args),
        Command::Decode(args) => decode(args),
        Command::Train(args) => train(args),
        Command::Rl(args) => rl(args),
    }
}

fn rl(args: RlArgs) -> Result<()> {
    let (backend, line) = select(args.device)?;
    println!("{line}");
    let gpu = matches!(backend, Selected::Cuda(_));
    let options = swerve::bench::rl::RlBenchOptions {
        preset: args
            .preset
            .clone()
            .unwrap_or_else(|| if gpu { "qwen2.5-0.5b" } else { "tiny" }.into()),
        device: if gpu {
            DeviceChoice::Cuda
        } else {
            DeviceChoice::Cpu
        },
        reps: args.reps,
        tasks_per_iteration: args.tasks.unwrap_or(if gpu { 8 } else { 2 }),
        group: args.group.unwrap_or(if gpu { 8 } else { 2 }),
        max_turns: args.max_turns,
        max_turn_tokens: args.max_turn_tokens.unwrap_or(if gpu { 256 } else { 16 }),
        max_context: args.max_context,
    };
    let work = std::env::temp_dir().join(format!("swerve-bench-rl-{}", std::process::id()));
    let result = match backend {
        Selected::Cpu(b) => swerve::bench::rl::run(&b, &options, &work),
        Selected::Cuda(b) => swerve::bench::rl::run(&*b, &options, &work),
    };
    let _ = std::fs::remove_dir_all(&work);
    let row = result?;
    if let Some(path) = args.jsonl {
        use std::io::Write as _;
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)?;
        writeln!(file, "{row}")?;
    }
    Ok(())
}

fn prefill(args: PrefillArgs) -> Result<()> {
    if args.seq_lens.is_empty() || args.seq_lens.contains(&0) {
        bail!("--seq-lens needs positive lengths");
    }
    let (config, tp_size) = synthetic::preset(&args.preset)?;
    if let Some(&too_long) = args.seq_lens.iter().find(|&&n| n > config.max_context()) {
        bail!(
            "--seq-lens {too_long} exceeds the model's context of {}",
            config.max_context()
        );
    }
    let (backend, line) = select(args.device)?;
    println!("{line}");
    match backend {
        Selected::Cpu(b) => {
            let param_bytes = config.num_parameters() / tp_size * 4;
            if let Some(available) = available_memory_bytes() {
                if param_bytes > available / 2 {
                    bail!(
                        "preset {} needs {:.1} GiB of f32 weights on the CPU backend but only {:.1} GiB is available; \
                         presets this large are for GPU runs",
                        args.preset,
                        param_bytes as f64 / (1u64 << 30) as f64,
                        available as f64 / (1u64 << 30) as f64
                    );
                }
            }
            prefill_on(&b, config, tp_size, &args)
        }
        Selected::Cuda(b) => prefill_on(&*b, config, tp_size, &args),
    }
}

fn prefill_on<B: Backend>(
    backend: &B,
    config: swerve::config::ModelConfig,
    tp_size: usize,
    args: &PrefillArgs,
) -> Result<()> {
    let local = config.local_sizes(tp_size)?;
    let host = synthetic::random_params(&config, &local, 0x5EED)?;
    let model = Qwen2Model::from_host_params(backend, config, local, &host)?;
    drop(host);
    println!(
        "model: preset {} ({} layers, hidden {}, heads {}/{} kv, vocab {}, tp {} rank 0), random weights",
        args.preset,
        model.config.num_hidden_layers,
        model.config.hidden_size,
        model.local.heads_local,
        model.local.kv_heads_local,
        model.local.vocab_local,
        tp_size
    );
    let rows = bench::prefill(backend, &model, &args.seq_lens, args.reps)?;
    bench::print_prefill_table(&rows);
    if let Some(path) = &args.jsonl {
        let records: Vec<serde_json::Value> = rows
            .iter()
            .map(|r| {
                serde_json::json!({
                    "table": "prefill",
                    "impl": "swerve",
                    "key": format!("preset={} len={}", args.preset, r.seq_len),
                    "median_ms": r.median_seconds * 1e3,
                    "tflops": r.tflops,
                    "tokens_per_s": r.tokens_per_second,
                    "note": backend.name(),
                })
            })
            .collect();
        append_jsonl(path, &records)?;
    }
    Ok(())
}

fn append_jsonl(path: &Path, records: &[serde_json::Value]) -> Result<()> {
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .with_context(|| format!("opening {} for appending", path.display()))?;
    for r in records {
        writeln!(file, "{r}").with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

fn kernels(jsonl: Option<&Path>) -> Result<()> {
    let backend = CudaBackend::open_default()
        .map_err(|reason| anyhow::anyhow!("swerve-bench kernels needs a GPU: {reason}"))?;
    println!("device: {}", backend.name());
    let (ceilings, rows) = bench::kernels::run_all(&backend).context("kernel benchmarks")?;
    bench::kernels::print_kernel_table(&ceilings, &rows);
    if let Some(path) = jsonl {
        let mut records = vec![serde_json::json!({
            "table": "device", "impl": "swerve", "name": backend.device.name,
            "copy_gb_per_s": ceilings.copy_gb_per_s, "gemm_tflops": ceilings.gemm_tflops,
        })];
        records.extend(bench::kernels::jsonl_records(&rows));
        append_jsonl(path, &records)?;
    }
    Ok(())
}

fn agent(args: AgentArgs) -> Result<()> {
    let (config, tp_size) = synthetic::preset(&args.preset)?;
    let (backend, line) = select(args.device)?;
    println!("{line}");
    match backend {
        Selected::Cpu(b) => {
            let workload = agent_workload(&args, bench::agent::AgentWorkload::cpu());
            // Every rollout at its largest context, plus slack: no preemption needed.
            let tokens = workload.tasks * workload.group * (workload.max_context + 16);
            let num_blocks = agent_on(b, config.clone(), tp_size, &args, &workload, tokens)?;
            agent_http(&args, &config, tp_size, &workload, num_blocks, "cpu")
        }
        Selected::Cuda(b) => {
            let workload = agent_workload(
                &args,
                bench::agent::AgentWorkload::full(32768.min(config.max_context())),
            );
            let (free, _) = b.device.ctx.mem_get_info()?;
            let local = config.local_sizes(tp_size)?;
            let weights = config.num_parameters() / tp_size * 2;
            let per_token = swerve::model::PagedKv::<()>::bytes_per_token(&config, &local, 2);
            // Activations of an 8,192-token step stay well inside the last 15 % and 4 GiB.
            let budget = (free.saturating_sub(weights) as f64 * args.kv_cache_fraction) as usize;
            let tokens = budget.saturating_sub(4 << 30) / per_token;
            let num_blocks = agent_on(*b, config.clone(), tp_size, &args, &workload, tokens)?;
            agent_http(&args, &config, tp_size, &workload, num_blocks, "cuda")
        }
    }
}

fn agent_workload(
    args: &AgentArgs,
    mut workload: bench::agent::AgentWorkload,
) -> bench::agent::AgentWorkload {
    if let Some(c) = args.max_context {
        workload.max_context = c;
    }
    if let Some(t) = args.tasks {
        workload.tasks = t;
    }
    if let Some(g) = args.group {
        workload.group = g;
    }
    workload
}

fn agent_on<B: Backend>(
    backend: B,
    config: swerve::config::ModelConfig,
    tp_size: usize,
    args: &AgentArgs,
    workload: &bench::agent::AgentWorkload,
    kv_tokens: usize,
) -> Result<usize> {
    if workload.max_context > config.max_context() {
        bail!(
            "--max-context {} exceeds the model's context of {}",
            workload.max_context,
            config.max_context()
        );
    }
    let local = config.local_sizes(tp_size)?;
    let host = synthetic::random_params(&config, &local, 0x5EED)?;
    let model = Qwen2Model::from_host_params(&backend, config, local, &host)?;
    drop(host);
    let mut engine_config = swerve::engine::EngineConfig::for_model(workload.max_context, 0);
    engine_config.num_blocks = kv_tokens / engine_config.block_size + 1;
    if engine_config.num_blocks < workload.max_context / engine_config.block_size + 2 {
        bail!(
            "only {kv_tokens} tokens of KV cache fit: not one rollout of {} tokens",
            workload.max_context
        );
    }
    println!(
        "model: preset {}, random weights; KV cache {} blocks of {}; workload: {}",
        args.preset,
        engine_config.num_blocks,
        engine_config.block_size,
        workload.describe()
    );
    let num_blocks = engine_config.num_blocks;
    let mut engine = swerve::engine::Engine::new(backend, model, engine_config)?;
    let report = bench::agent::run(&mut engine, workload)?;
    bench::agent::print_report(&report);
    if let Some(path) = &args.jsonl {
        append_jsonl(
            path,
            &[serde_json::json!({
                "table": "agent", "impl": "swerve", "key": format!("preset={} {}", args.preset, workload.describe()),
                "tokens_per_s": report.tokens_per_second, "prefix_hit_rate": report.prefix_hit_rate,
                "mean_step_ms": report.mean_step_ms, "host_overhead": report.host_overhead_fraction,
                "steps": report.steps, "preemptions": report.preemptions, "note": engine.backend.name(),
                "host_us_per_token": report.host_seconds_per_token * 1e6,
            })],
        )?;
    }
    Ok(num_blocks)
}

/// With `--http`: the same workload through `swerve-serve` on the same random model.
fn agent_http(
    args: &AgentArgs,
    config: &swerve::config::ModelConfig,
    tp_size: usize,
    workload: &bench::agent::AgentWorkload,
    num_blocks: usize,
    device: &str,
) -> Result<()> {
    if !args.http {
        return Ok(());
    }
    if tp_size != 1 {
        bail!(
            "--http needs a preset of tensor-parallel size 1; {} is one rank of {tp_size}",
            args.preset
        );
    }
    let dir = std::env::temp_dir().join(format!("swerve-bench-model-{}", std::process::id()));
    synthetic::write_model_dir(config, 0x5EED, &dir)?;
    let result = (|| -> Result<()> {
        let bin = std::env::current_exe()?.with_file_name("swerve-serve");
        let name = "swerve-bench";
        let server_args: Vec<String> = [
            "--model",
            dir.to_str().context("temporary folder path is not UTF-8")?,
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
        let server = bench::agent_http::ServeProcess::start(&bin, &server_args)?;
        let report = bench::agent_http::run_http(
            server.addr,
            name,
            workload,
            config.vocab_size,
            workload.max_context,
        )?;
        bench::agent_http::print_http_report(&report);
        if let Some(path) = &args.jsonl {
            append_jsonl(
                path,
                &[serde_json::json!({
                    "table": "agent_http", "impl": "swerve",
                    "key": format!("preset={} {}", args.preset, workload.describe()),
                    "tokens_per_s": report.tokens_per_second, "prefix_hit_rate": report.prefix_hit_rate,
                    "host_us_per_token": report.host_seconds_per_token * 1e6, "note": device,
                })],
            )?;
        }
        Ok(())
    })();
    let _ = std::fs::remove_dir_all(&dir);
    result
}

fn decode(args: DecodeArgs) -> Result<()> {
    let (config, tp_size) = synthetic::preset(&args.preset)?;
    if args.batch_sizes.contains(&0) || args.context == Some(0) || args.steps == 0 {
        bail!("--batch-sizes, --context and --steps must be positive");
    }
    let (backend, line) = select(args.device)?;
    println!("{line}");
    match backend {
        Selected::Cpu(b) => {
            let batches = or_default(&args.batch_sizes, &[1, 4]);
            decode_on(
                &b,
                config,
                tp_size,
                &args,
                &batches,
                args.context.unwrap_or(256),
                4,
                None,
            )
        }
        Selected::Cuda(b) => {
            let batches = or_default(&args.batch_sizes, &[1, 8, 32, 128]);
            let bandwidth = bench::decode::copy_bandwidth(&b)?;
            println!("measured copy bandwidth: {bandwidth:.0} GB/s (read + write)");
            let context = args.context.unwrap_or(4096);
            decode_on(
                &*b,
                config.clone(),
                tp_size,
                &args,
                &batches,
                context,
                2,
                Some(bandwidth),
            )?;
            let local = config.local_sizes(tp_size)?;
            let mut rows = Vec::new();
            for &context in args.attention_contexts.iter().filter(|&&c| c > 0) {
                for seqs in [1, 8] {
                    let row = bench::decode::decode_attention(
                        &b,
                        seqs,
                        context,
                        local.heads_local,
                        local.kv_heads_local,
                    )?;
                    println!(
                        "decode attention {}: {:.3} ms, {:.0} GB/s of K/V = {:.1}% of copy bandwidth",
                        row.key,
                        row.median_ms,
                        row.gb_per_s,
                        100.0 * row.gb_per_s / bandwidth
                    );
                    rows.push(row);
                }
            }
            if let Some(path) = &args.jsonl {
                let records: Vec<serde_json::Value> = rows
                    .iter()
                    .map(|r| {
                        serde_json::json!({
                            "table": "decode_attention", "impl": "swerve", "key": r.key,
                            "median_ms": r.median_ms, "gb_per_s": r.gb_per_s,
                            "copy_fraction": r.gb_per_s / bandwidth, "note": b.name(),
                        })
                    })
                    .collect();
                append_jsonl(path, &records)?;
            }
            Ok(())
        }
    }
}

fn or_default(given: &[usize], default: &[usize]) -> Vec<usize> {
    if given.is_empty() {
        default.to_vec()
    } else {
        given.to_vec()
    }
}

#[allow(clippy::too_many_arguments)]
fn decode_on<B: Backend>(
    backend: &B,
    config: swerve::config::ModelConfig,
    tp_size: usize,
    args: &DecodeArgs,
    batches: &[usize],
    context: usize,
    elem_bytes: usize,
    copy_gb_per_s: Option<f64>,
) -> Result<()> {
    let local = config.local_sizes(tp_size)?;
    let host = synthetic::random_params(&config, &local, 0x5EED)?;
    let model = Qwen2Model::from_host_params(backend, config, local, &host)?;
    drop(host);
    println!(
        "model: preset {} ({} layers, hidden {}), random weights; {context} tokens cached per sequence",
        args.preset, model.config.num_hidden_layers, model.config.hidden_size
    );
    let rows = batches
        .iter()
        .map(|&batch| {
            let graphs = !args.no_cuda_graphs;
            bench::decode::decode(
                backend, &model, batch, context, args.steps, elem_bytes, graphs,
            )
        })
        .collect::<Result<Vec<_>>>()?;
    bench::decode::print_decode_table(&rows, copy_gb_per_s);
    if let Some(path) = &args.jsonl {
        let records: Vec<serde_json::Value> = rows
            .iter()
            .map(|r| serde_json::json!({
                "table": "decode", "impl": "swerve",
                "key": format!("preset={} batch={} context={}", args.preset, r.batch, r.context),
                "median_ms": r.median_step_seconds * 1e3, "tokens_per_s": r.tokens_per_second,
                "bytes_per_step": r.bytes_per_step, "cuda_graphs": r.graph_steps > 0,
                "roofline_fraction": copy_gb_per_s.map(|bw| r.roofline_fraction(bw)),
                "note": backend.name(),
            }))
            .collect();
        append_jsonl(path, &records)?;
    }
    Ok(())
}

fn train(args: TrainArgs) -> Result<()> {
    let (config, tp_size) = synthetic::preset(&args.preset)?;
    if tp_size != 1 {
        bail!(
            "train: preset {} is one rank of tensor-parallel {tp_size}; training runs TP = 1",
            args.preset
        );
    }
    if args.tokens.contains(&0) || args.seq_len == Some(0) || args.reps == 0 {
        bail!("--tokens, --seq-len and --reps must be positive");
    }
    let (backend, line) = select(args.device)?;
    println!("{line}");
    match backend {
        Selected::Cpu(b) => {
            let sizes = or_default(&args.tokens, &[256]);
            train_on(&b, config, &args, &sizes, None)?;
        }
        Selected::Cuda(b) => {
            let ceilings = bench::kernels::measure_ceilings(&b)?;
            println!(
                "measured bf16 GEMM rate: {:.0} TFLOP/s",
                ceilings.gemm_tflops
            );
            let sizes = or_default(&args.tokens, &[16384, 32768]);
            train_on(&*b, config, &args, &sizes, Some(ceilings.gemm_tflops))?;
            let (free, total) = b.device.ctx.mem_get_info()?;
            println!(
                "device memory in use after the steps (the caching pool's high-water mark included): {:.1} GiB of {:.1} GiB",
                (total - free) as f64 / (1u64 << 30) as f64,
                total as f64 / (1u64 << 30) as f64
            );
        }
    }
    Ok(())
}

fn train_on<B: swerve::backend::BackendGrad>(
    backend: &B,
    config: swerve::config::ModelConfig,
    args: &TrainArgs,
    sizes: &[usize],
    gemm_tflops: Option<f64>,
) -> Result<()> {
    let local = config.local_sizes(1)?;
    let host = synthetic::random_params(&config, &local, 0x5EED)?;
    let mut model = Qwen2Model::from_host_params(backend, config, local, &host)?;
    drop(host);
    println!(
        "model: preset {} ({} layers, hidden {}), random weights; masked cross-entropy on every token, activation checkpointing on",
        args.preset, model.config.num_hidden_layers, model.config.hidden_size
    );
    let rows = sizes
        .iter()
        .map(|&tokens| {
            let seq_len = args.seq_len.unwrap_or(tokens);
            bench::train::train_step(backend, &mut model, tokens, seq_len, args.reps)
        })
        .collect::<Result<Vec<_>>>()?;
    bench::train::print_train_table(&rows, gemm_tflops);
    if let Some(path) = &args.jsonl {
        let records: Vec<serde_json::Value> = rows
            .iter()
            .map(|r| serde_json::json!({
                "table": "train", "impl": "swerve",
                "key": format!("preset={} tokens={} seq_len={}", args.preset, r.tokens, r.seq_len),
                "step_ms": r.step_seconds() * 1e3, "fwd_bwd_ms": r.fwd_bwd_seconds * 1e3,
                "tokens_per_s": r.tokens_per_second, "tflops": r.tflops,
                "mfu": gemm_tflops.map(|g| r.mfu(g)), "note": backend.name(),
            }))
            .collect();
        append_jsonl(path, &records)?;
    }
    Ok(())
}

/// MemAvailable from /proc/meminfo, where there is one.
fn available_memory_bytes() -> Option<usize> {
    swerve::sysmem::available_memory_bytes()
}
