//! swerve-serve: the OpenAI-compatible rollout server. Parses arguments (`--config FILE.toml`
//! too: docs/config.md) and runs [`swerve::server::run`]; exits 0 after a graceful stop on
//! SIGTERM.

use anyhow::Result;
use std::path::PathBuf;
use std::time::Duration;
use swerve::backend::DeviceChoice;
use swerve::cli::ConfigSpec;
use swerve::server::{run, ServeOptions};

/// `--config FILE.toml` on the command itself (it has no output folder to record it in).
const CONFIG: ConfigSpec = ConfigSpec {
    subcommands: &[],
    not_recorded: &[],
};

/// A finite number of seconds, at least 0 (clap names the flag in the error).
fn non_negative_seconds(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 => Ok(v),
        Ok(v) => Err(format!("{v} is not a non-negative number of seconds")),
        Err(e) => Err(format!("{text:?} is not a number: {e}")),
    }
}

#[derive(clap::Parser)]
#[command(
    name = "swerve-serve",
    version,
    about = "swerve's OpenAI-compatible rollout server"
)]
struct Cli {
    /// Model folder: config.json plus model.safetensors or a sharded index (tokenizer files
    /// optional: the embedded Qwen2.5 tokenizer otherwise).
    #[arg(long)]
    model: PathBuf,
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// 0 picks a free port; the address is printed on stdout.
    #[arg(long, default_value_t = 8000)]
    port: u16,
    /// Where the model runs: auto (the GPU when there is one), cpu, or cuda.
    #[arg(long, default_value = "auto")]
    device: DeviceChoice,
    /// Longest prompt + completion in tokens (default: the model's context).
    #[arg(long)]
    max_model_len: Option<usize>,
    /// On a GPU: the fraction of the device memory free after loading the weights given to the
    /// KV cache. On the CPU the cache is sized for --max-num-seqs sequences of --max-model-len
    /// tokens plus a quarter for the prefix cache, and this is the most of the available memory
    /// it may take.
    #[arg(long, default_value_t = 0.9)]
    kv_cache_fraction: f64,
    /// KV-cache size in blocks of 16 tokens, instead of the default sizing.
    #[arg(long)]
    num_kv_blocks: Option<usize>,
    /// Sequences scheduled together at most.
    #[arg(long, default_value_t = 256)]
    max_num_seqs: usize,
    /// Tokens computed per engine step at most (chunked prefill).
    #[arg(long, default_value_t = 8192)]
    max_num_batched_tokens: usize,
    /// Sequences that may wait beyond --max-num-seqs; past that, requests get 429.
    #[arg(long, default_value_t = 1024)]
    max_queue_len: usize,
    /// The model name clients send (default: the --model argument).
    #[arg(long)]
    served_model_name: Option<String>,
    /// Require `Authorization: Bearer KEY` on /v1/*.
    #[arg(long)]
    api_key: Option<String>,
    /// Use generation_config.json's sampling defaults (off: RL needs temperature 1, no filters).
    #[arg(long)]
    use_generation_config: bool,
    /// Seconds in-flight requests get to finish after SIGTERM before they are aborted.
    #[arg(long, default_value_t = 30.0, value_parser = non_negative_seconds)]
    shutdown_grace_seconds: f64,
    /// Seeds the samplers of requests that bring no seed.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Tensor-parallel ranks, a thread and GPU each (on the CPU they share the cores): the
    /// model's heads, MLP columns and vocabulary split over them, every rank's engine stepped in
    /// lockstep. On GPUs the ranks talk through NCCL when libnccl is found.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    tensor_parallel: u64,
    /// GEMMs that keep one K order per shape class at every batch size, so that the logprobs
    /// served equal swerve's trainer's bit for bit on GPUs (docs/training.md, "Exact on-policy
    /// logprobs"); on by default (`--exact-logprobs` alone also means true). `false`: cuBLASLt's
    /// per-shape choice, split-K included.
    #[arg(long, default_value_t = true, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    exact_logprobs: bool,
}

fn main() -> Result<()> {
    if let Some(banner) = swerve::backend::cuda::emulation_banner() {
        eprintln!("{banner}");
    }
    let cli: Cli = swerve::cli::parse_or_exit(&CONFIG).cli;
    if swerve::parse_only::requested()? {
        println!("swerve-serve: the arguments parse");
        return Ok(());
    }
    swerve::backend::cuda::gemm::set_exact_logprobs(cli.exact_logprobs);
    run(ServeOptions {
        model: cli.model,
        host: cli.host,
        port: cli.port,
        device: cli.device,
        max_model_len: cli.max_model_len,
        kv_cache_fraction: cli.kv_cache_fraction,
        num_kv_blocks: cli.num_kv_blocks,
        max_num_seqs: cli.max_num_seqs,
        max_num_batched_tokens: cli.max_num_batched_tokens,
        max_queue_len: cli.max_queue_len,
        served_model_name: cli.served_model_name,
        api_key: cli.api_key,
        use_generation_config: cli.use_generation_config,
        shutdown_grace: Duration::from_secs_f64(cli.shutdown_grace_seconds),
        seed: cli.seed,
        tensor_parallel: cli.tensor_parallel as usize,
    })
}
