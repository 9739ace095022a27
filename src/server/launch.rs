//! Starting and stopping the server: load the tokenizer and the model, size the KV cache, start
//! the engine thread, serve until SIGTERM (or Ctrl-C), then stop accepting, give in-flight
//! requests a grace period, abort what is left, and return (the process exits 0).
//!
//! Sampling defaults are RL-correct: temperature 1, top_p 1, no top_k, min_p 0, no penalties.
//! A checkpoint's `generation_config.json` (Qwen2.5-Instruct's says temperature 0.7, top_p 0.8,
//! top_k 20, repetition_penalty 1.05) is ignored unless `--use-generation-config`: with it, the
//! tokens sampled come from a distribution other than the policy the trainer computes, the
//! importance ratios are wrong, and RL training collapses (RL-SPEC.md, "Sampling during
//! rollouts").

use super::context::SamplingDefaults;
use super::detok::TokenTable;
use super::http::router;
use super::metrics::Metrics;
use super::state::{Admission, AppState};
use crate::backend::DeviceChoice;
use crate::chat::ChatTemplate;
use crate::config::ModelConfig;
use crate::engine::launch::{launch_engine, EngineLaunch};
use crate::engine::SamplingParams;
use crate::tokenizer::Tokenizer;
use anyhow::{anyhow, bail, ensure, Context as _, Result};
use serde_json::Value;
use std::collections::{HashMap, HashSet};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Everything `swerve-serve` takes on its command line.
#[derive(Clone, Debug)]
pub struct ServeOptions {
    pub model: PathBuf,
    pub host: String,
    /// 0 picks a free port (the address printed says which).
    pub port: u16,
    pub device: DeviceChoice,
    /// Longest prompt + output; the model's context by default.
    pub max_model_len: Option<usize>,
    /// On a GPU, the fraction of the device memory free after loading the weights given to the
    /// KV cache; on the CPU, the most of the available memory the workload-sized cache may take
    /// (see [`crate::engine::launch`]).
    pub kv_cache_fraction: f64,
    /// Exact KV-cache size in blocks, overriding the default sizing.
    pub num_kv_blocks: Option<usize>,
    pub max_num_seqs: usize,
    pub max_num_batched_tokens: usize,
    /// Sequences admitted beyond `max_num_seqs` to wait in the engine's queue; past that, 429.
    pub max_queue_len: usize,
    pub served_model_name: Option<String>,
    pub api_key: Option<String>,
    pub use_generation_config: bool,
    /// How long in-flight requests may run after SIGTERM before they are aborted.
    pub shutdown_grace: Duration,
    /// Seeds requests that bring no seed.
    pub seed: u64,
    /// Tensor-parallel ranks (`--tensor-parallel`).
    pub tensor_parallel: usize,
}

/// Reads the sampling defaults of `generation_config.json` (with `--use-generation-config`).
fn generation_config_defaults(dir: &Path, use_it: bool) -> Result<SamplingDefaults> {
    let path = dir.join("generation_config.json");
    if !path.is_file() {
        if use_it {
            bail!("--use-generation-config: {} does not exist", path.display());
        }
        return Ok(SamplingDefaults::default());
    }
    if !use_it {
        eprintln!(
            "{} ignored: rollouts sample the model's own distribution (temperature 1, no filters), as RL needs; --use-generation-config applies it",
            path.display()
        );
        return Ok(SamplingDefaults::default());
    }
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let value: Value =
        serde_json::from_str(&text).with_context(|| format!("{} is not JSON", path.display()))?;
    let mut d = SamplingDefaults::default();
    let number = |key: &str| -> Result<Option<f64>> {
        match value.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => v
                .as_f64()
                .map(Some)
                .ok_or_else(|| anyhow!("{}: `{key}` must be a number, found {v}", path.display())),
        }
    };
    if value.get("do_sample") == Some(&Value::Bool(false)) {
        d.temperature = 0.0;
    } else if let Some(t) = number("temperature")? {
        d.temperature = t as f32;
    }
    if let Some(p) = number("top_p")? {
        d.top_p = p as f32;
    }
    if let Some(k) = number("top_k")? {
        d.top_k = (k >= 1.0).then_some(k as usize);
    }
    if let Some(m) = number("min_p")? {
        d.min_p = m as f32;
    }
    SamplingParams {
        temperature: d.temperature,
        top_p: d.top_p,
        top_k: d.top_k,
        min_p: d.min_p,
        ..SamplingParams::default()
    }
    .validate(usize::MAX)
    .map_err(|e| anyhow!("{}: {e}", path.display()))?;
    for key in [
        "repetition_penalty",
        "presence_penalty",
        "frequency_penalty",
    ] {
        if let Some(v) = number(key)?.filter(|&v| {
            v != if key == "repetition_penalty" {
                1.0
            } else {
                0.0
            }
        }) {
            eprintln!(
                "{}: `{key}` {v} is not implemented and not applied",
                path.display()
            );
        }
    }
    eprintln!("sampling defaults from {}: {d:?}", path.display());
    Ok(d)
}

/// Runs the server until SIGTERM or Ctrl-C; returns Ok after a graceful stop.
pub fn run(options: ServeOptions) -> Result<()> {
    ensure!(
        options.kv_cache_fraction > 0.0 && options.kv_cache_fraction <= 1.0,
        "--kv-cache-fraction {} must be in (0, 1]",
        options.kv_cache_fraction
    );
    ensure!(
        options.max_num_seqs > 0,
        "--max-num-seqs must be at least 1"
    );
    ensure!(
        options.max_num_batched_tokens > 0,
        "--max-num-batched-tokens must be at least 1"
    );
    let config = ModelConfig::from_dir(&options.model)?;
    let max_model_len = options.max_model_len.unwrap_or(config.max_context());
    ensure!(
        (2..=config.max_context()).contains(&max_model_len),
        "--max-model-len {max_model_len} must be between 2 and the model's context of {}",
        config.max_context()
    );
    let tokenizer = Tokenizer::for_model_dir(&options.model)?;
    let template = ChatTemplate::for_tokenizer(&tokenizer)?;
    if tokenizer.vocab_size() > config.vocab_size {
        eprintln!(
            "warning: the tokenizer has {} tokens but the model only {}: text whose tokens fall outside the model is refused (token ids still work)",
            tokenizer.vocab_size(),
            config.vocab_size
        );
    }
    let defaults = generation_config_defaults(&options.model, options.use_generation_config)?;
    let eos_ids: Vec<u32> = tokenizer
        .stop_ids()
        .iter()
        .copied()
        .filter(|&t| (t as usize) < config.vocab_size)
        .collect();

    let engine = launch_engine(&EngineLaunch {
        model: options.model.clone(),
        device: options.device,
        max_model_len,
        kv_cache_fraction: options.kv_cache_fraction,
        num_kv_blocks: options.num_kv_blocks,
        max_num_seqs: options.max_num_seqs,
        max_num_batched_tokens: options.max_num_batched_tokens,
        seed: options.seed,
        tensor_parallel: options.tensor_parallel,
    })?;
    // After the launch, which checked the config's sizes against memory: the table has a row
    // per token of the model's vocabulary.
    let table = TokenTable::new(&tokenizer, config.vocab_size)?;
    let state = Arc::new(AppState {
        engine: Arc::new(engine),
        tokenizer,
        template,
        table,
        served_model_name: options
            .served_model_name
            .clone()
            .unwrap_or_else(|| options.model.display().to_string()),
        model_vocab: config.vocab_size,
        max_model_len,
        defaults,
        eos_ids,
        api_key: options.api_key.clone(),
        admission: Admission::new(options.max_num_seqs.saturating_add(options.max_queue_len)),
        metrics: Metrics::default(),
        weight_version: AtomicU64::new(0),
        paused: AtomicBool::new(false),
        stopping: AtomicBool::new(false),
        live: Mutex::new(HashSet::new()),
        next_response: AtomicU64::new(1),
        started_unix: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        sleep_level: AtomicU8::new(0),
        named: Mutex::new(HashMap::new()),
        base_model_dir: options.model.clone(),
        weights_dir: Mutex::new(options.model.clone()),
        weight_version_label: Mutex::new(None),
    });
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("swerve-http")
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(serve(state, &options))?;
    runtime.shutdown_timeout(Duration::from_secs(1));
    Ok(())
}

async fn serve(state: Arc<AppState>, options: &ServeOptions) -> Result<()> {
    let listener = tokio::net::TcpListener::bind((options.host.as_str(), options.port))
        .await
        .with_context(|| format!("cannot listen on {}:{}", options.host, options.port))?;
    let address = listener.local_addr()?;
    println!(
        "swerve-serve: listening on http://{address} (model `{}`)",
        state.served_model_name
    );
    let _ = std::io::stdout().flush();

    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let app = router(state.clone());
    let mut server = tokio::spawn(std::future::IntoFuture::into_future(
        axum::serve(listener, app).with_graceful_shutdown(async move {
            let _ = stop_rx.await;
        }),
    ));
    let signal = wait_for_signal().await?;
    state
        .stopping
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let _ = stop_tx.send(());
    let grace = options.shutdown_grace;
    eprintln!(
        "swerve-serve: {signal}: no new connections; {} sequences in flight get {:.1} s to finish",
        state.admission.in_flight(),
        grace.as_secs_f64()
    );
    let finished = match tokio::time::timeout(grace, &mut server).await {
        Ok(result) => Some(result),
        Err(_) => {
            let aborted = state.abort_all();
            eprintln!("swerve-serve: grace period over: aborted {aborted} requests");
            tokio::time::timeout(Duration::from_secs(5), &mut server)
                .await
                .ok()
        }
    };
    match finished {
        Some(Ok(Ok(()))) => {}
        Some(Ok(Err(e))) => eprintln!("swerve-serve: the HTTP server ended with an error: {e}"),
        Some(Err(e)) => eprintln!("swerve-serve: the HTTP server task failed: {e}"),
        None => {
            server.abort();
            eprintln!("swerve-serve: connections still open after the grace period were closed");
        }
    }
    eprintln!("swerve-serve: stopped");
    Ok(())
}

/// Waits for SIGTERM or SIGINT; returns its name.
async fn wait_for_signal() -> Result<&'static str> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    let which = std::future::poll_fn(|cx| {
        if term.poll_recv(cx).is_ready() {
            return std::task::Poll::Ready("SIGTERM");
        }
        if int.poll_recv(cx).is_ready() {
            return std::task::Poll::Ready("SIGINT");
        }
        std::task::Poll::Pending
    })
    .await;
    Ok(which)
}
