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
    /// Each CUDA kernel against the CPU reference and the card's measured ceilings (needs a GPU).
    Kernels {
        /// Also append one JSON record per row to this file (bench/peers/compare.py reads it).
        #[arg(long)]
        jsonl: Option<PathBuf>,
    },
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
    let cli = Cli::parse();
    match cli.command.unwrap_or(Command::Prefill(cli.prefill)) {
        Command::Prefill(args) => prefill(args),
        Command::Kernels { jsonl } => kernels(jsonl.as_deref()),
    }
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

/// MemAvailable from /proc/meminfo, where there is one.
fn available_memory_bytes() -> Option<usize> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: usize = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}
