//! Starting an engine for a model folder: the backend chosen at run time, the model loaded on
//! the engine's own thread (a CUDA context belongs to the thread that made it), the KV cache
//! sized from free memory and the workload. Used by `swerve-serve` and by agent rollouts.

use crate::backend::cpu::CpuBackend;
use crate::backend::cuda::CudaBackend;
use crate::backend::{select, Backend, DeviceChoice, Selected};
use crate::config::ModelConfig;
use crate::engine::{Engine, EngineConfig, EngineHandle};
use crate::model::{PagedKv, Qwen2Model};
use anyhow::{anyhow, ensure, Context as _, Result};
use std::path::PathBuf;

/// What an engine is started with.
#[derive(Clone, Debug)]
pub struct EngineLaunch {
    pub model: PathBuf,
    pub device: DeviceChoice,
    /// Longest prompt + output.
    pub max_model_len: usize,
    /// Fraction of the memory free after loading the weights (device memory on a GPU, available
    /// RAM on the CPU) the KV cache may take.
    pub kv_cache_fraction: f64,
    /// Exact KV-cache size in blocks, overriding the fraction.
    pub num_kv_blocks: Option<usize>,
    pub max_num_seqs: usize,
    pub max_num_batched_tokens: usize,
    /// Seeds requests that bring no seed.
    pub seed: u64,
}

/// Selects the backend (its line printed to stderr), loads the model on the engine thread and
/// starts it.
pub fn launch_engine(options: &EngineLaunch) -> Result<EngineHandle> {
    let config = ModelConfig::from_dir(&options.model)?;
    let (backend, line) = select(options.device)?;
    eprintln!("{line}");
    match backend {
        Selected::Cpu(b) => start_engine(move || Ok(b), options, &config),
        Selected::Cuda(probe) => {
            // The probe found a usable GPU; the engine thread opens its own context.
            drop(probe);
            let open = || CudaBackend::open_default().map_err(|e| anyhow!("--device cuda: {e}"));
            start_engine(open, options, &config)
        }
    }
}

/// Free memory a KV cache may use, and the bytes of one cached element, per backend.
trait KvMemory: Backend {
    fn free_bytes(&self) -> Result<usize>;
    fn kv_elem_bytes(&self) -> usize;
    /// Kept free for activations of a step.
    fn reserve_bytes(&self) -> usize;
}

impl KvMemory for CpuBackend {
    fn free_bytes(&self) -> Result<usize> {
        let text = std::fs::read_to_string("/proc/meminfo").context("reading /proc/meminfo")?;
        let kib = text
            .lines()
            .find(|l| l.starts_with("MemAvailable:"))
            .and_then(|l| l.split_whitespace().nth(1)?.parse::<usize>().ok())
            .ok_or_else(|| anyhow!("/proc/meminfo has no MemAvailable: pass --num-kv-blocks"))?;
        Ok(kib * 1024)
    }
    fn kv_elem_bytes(&self) -> usize {
        4
    }
    fn reserve_bytes(&self) -> usize {
        0
    }
}

impl KvMemory for CudaBackend {
    fn free_bytes(&self) -> Result<usize> {
        Ok(self.device.ctx.mem_get_info()?.0)
    }
    fn kv_elem_bytes(&self) -> usize {
        2
    }
    fn reserve_bytes(&self) -> usize {
        4 << 30
    }
}

/// Starts the engine thread: builds the backend there (a CUDA context is used by the thread that
/// made it), loads the model, sizes the KV cache.
fn start_engine<B: KvMemory + 'static>(
    make_backend: impl FnOnce() -> Result<B> + Send + 'static,
    options: &EngineLaunch,
    config: &ModelConfig,
) -> Result<EngineHandle> {
    let options = options.clone();
    let config = config.clone();
    let max_model_len = options.max_model_len;
    EngineHandle::spawn(move || {
        let backend = make_backend()?;
        let model = Qwen2Model::load(&backend, &options.model)?;
        let mut engine_config = EngineConfig::for_model(max_model_len, 0);
        engine_config.max_num_seqs = options.max_num_seqs;
        engine_config.max_num_batched_tokens = options.max_num_batched_tokens;
        engine_config.seed = options.seed;
        let bs = engine_config.block_size;
        let blocks = match options.num_kv_blocks {
            Some(n) => n,
            None => {
                let per_token =
                    PagedKv::<()>::bytes_per_token(&config, &model.local, backend.kv_elem_bytes());
                let budget = (backend.free_bytes()? as f64 * options.kv_cache_fraction) as usize;
                let tokens = budget.saturating_sub(backend.reserve_bytes()) / per_token.max(1);
                // More than every sequence at full length is never used.
                let useful = options
                    .max_num_seqs
                    .saturating_mul(max_model_len)
                    .saturating_add(bs);
                tokens.min(useful) / bs + 1
            }
        };
        ensure!(
            (blocks.saturating_sub(1)) * bs >= max_model_len,
            "the KV cache of {blocks} blocks x {bs} tokens cannot hold one sequence of max_model_len {max_model_len}: lower --max-model-len or give the cache more memory (--kv-cache-fraction, --num-kv-blocks)"
        );
        engine_config.num_blocks = blocks;
        eprintln!(
            "loaded {} ({} layers, hidden {}, vocab {}); KV cache {} blocks x {} tokens; max_model_len {}",
            options.model.display(),
            model.config.num_hidden_layers,
            model.config.hidden_size,
            model.config.vocab_size,
            blocks - 1,
            bs,
            max_model_len
        );
        Engine::new(backend, model, engine_config)
    })
}
