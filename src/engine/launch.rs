//! Starting an engine for a model folder: the backend chosen at run time, the model loaded on
//! the engine's own thread (a CUDA context belongs to the thread that made it), the KV cache
//! sized from the workload and free memory. Used by `swerve-serve` and by agent rollouts.
//!
//! The KV cache's default size ([`KvSizing`]):
//!
//! - on a GPU, `--kv-cache-fraction` of the device memory free after loading the weights (less a
//!   reserve for a step's activations), at most every sequence at full length: memory the
//!   process holds anyway, and the more blocks, the more the prefix cache keeps;
//! - on the CPU, what the workload can use ([`workload_kv_blocks`]: `--max-num-seqs` sequences
//!   of `--max-model-len` tokens, plus room for the prefix cache), at most `--kv-cache-fraction`
//!   of the available memory (with a warning when that caps it). A CPU cache sized from free
//!   memory would take most of the machine: its pages are mapped on first write, and every
//!   cached block is written eventually.

use crate::backend::cpu::CpuBackend;
use crate::backend::cuda::CudaBackend;
use crate::backend::{select, Backend, DeviceChoice, Selected};
use crate::config::{format_bytes, ModelConfig};
use crate::dist::grid::RankComm;
use crate::dist::local::LocalGroup;
use crate::dist::{Communicator, ReduceOp, Solo};
use crate::engine::{Engine, EngineConfig, EngineHandle, TpEngine};
use crate::model::{PagedKv, Qwen2Model};
use anyhow::{anyhow, bail, ensure, Result};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

/// What an engine is started with.
#[derive(Clone, Debug)]
pub struct EngineLaunch {
    pub model: PathBuf,
    pub device: DeviceChoice,
    /// Longest prompt + output.
    pub max_model_len: usize,
    /// On a GPU, the fraction of the device memory free after loading the weights the KV cache
    /// takes; on the CPU, the most of the available memory it may take (see the module doc).
    pub kv_cache_fraction: f64,
    /// Exact KV-cache size in blocks, overriding the default sizing.
    pub num_kv_blocks: Option<usize>,
    pub max_num_seqs: usize,
    pub max_num_batched_tokens: usize,
    /// Seeds requests that bring no seed.
    pub seed: u64,
    /// Tensor-parallel ranks (a thread and a GPU each; on the CPU the cores are shared): the
    /// engines of [`crate::engine::TpEngine`], stepped in lockstep.
    pub tensor_parallel: usize,
}

/// Selects the backend (its line printed to stderr), loads the model on the engine thread (each
/// rank's part on its own thread) and starts it.
pub fn launch_engine(options: &EngineLaunch) -> Result<EngineHandle> {
    let config = ModelConfig::from_dir(&options.model)?;
    let tp = options.tensor_parallel;
    if tp == 0 {
        bail!("--tensor-parallel must be at least 1");
    }
    config
        .shard(tp, 0)
        .map_err(|e| anyhow!("{}: {e}", options.model.join("config.json").display()))?;
    let (backend, line) = select(options.device)?;
    eprintln!("{line}");
    match backend {
        Selected::Cpu(b) if tp == 1 => start_engine(move || Ok(b), options, &config),
        Selected::Cpu(b) => {
            let threads = (b.threads() / tp).max(1);
            start_parallel(
                move |_| Ok(CpuBackend::with_threads(threads)),
                options,
                &config,
            )
        }
        Selected::Cuda(probe) => {
            // The probe found a usable GPU; the engine threads open their own contexts.
            let devices = probe.device_count()?;
            drop(probe);
            let emulated = crate::backend::cuda::is_emulated();
            if tp > devices && !emulated {
                bail!("--tensor-parallel {tp} needs {tp} GPUs; the driver reports {devices}");
            }
            if tp == 1 {
                let open =
                    || CudaBackend::open_default().map_err(|e| anyhow!("--device cuda: {e}"));
                return start_engine(open, options, &config);
            }
            start_parallel(
                move |rank| CudaBackend::open(rank % devices),
                options,
                &config,
            )
        }
    }
}

/// A [`TpEngine`] of `options.tensor_parallel` ranks: rank `r`'s backend from `make_backend(r)`,
/// its model part, and a KV cache of the block count every rank can hold.
fn start_parallel<B: KvMemory + RankComm + 'static>(
    make_backend: impl Fn(usize) -> Result<B> + Send + Sync + Clone + 'static,
    options: &EngineLaunch,
    config: &ModelConfig,
) -> Result<EngineHandle> {
    let tp = options.tensor_parallel;
    let comms = Arc::new(Mutex::new(
        LocalGroup::new(tp)
            .into_iter()
            .map(Some)
            .collect::<Vec<_>>(),
    ));
    let (options, config) = (options.clone(), config.clone());
    EngineHandle::spawn(move || {
        TpEngine::start(tp, move |rank| {
            let comm = comms
                .lock()
                .expect("comms lock")
                .get_mut(rank)
                .and_then(Option::take);
            let comm = comm.ok_or_else(|| anyhow!("rank {rank} started twice"))?;
            let backend = make_backend(rank)?;
            let comm = backend.rank_comm(comm)?;
            build_engine(backend, &options, &config, comm)
        })
    })
}

/// How the default KV cache is sized (see the module doc).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvSizing {
    /// A fraction of the free device memory, at most every sequence at full length.
    MemoryFraction,
    /// What the workload can use, capped by a fraction of the available memory.
    Workload,
}

/// The KV-cache blocks (null block excluded) the CPU default gives a workload of `max_num_seqs`
/// sequences of `max_model_len` tokens in `block_size`-token blocks: one full-length block table
/// per sequence, plus a quarter more for the prefix cache.
///
/// Why the quarter: the running sequences' full blocks are cached already while they run, and
/// an agent's conversation keeps its blocks cached between turns as long as no more
/// conversations are in flight than `--max-num-seqs`. What the extra blocks keep is the prefixes
/// of requests that wait beyond that (queued turns, the next group sampling the same prompt),
/// which the running sequences' growth would otherwise evict before they are reused. A quarter
/// keeps a useful share of them at a bounded cost; `--num-kv-blocks` sets any other size.
pub fn workload_kv_blocks(max_num_seqs: usize, max_model_len: usize, block_size: usize) -> usize {
    let per_sequence = max_model_len.div_ceil(block_size.max(1));
    let workload = max_num_seqs.saturating_mul(per_sequence);
    workload.saturating_add(workload.div_ceil(4))
}

/// The default KV cache's size in blocks (null block included) and, when memory capped the
/// workload's size on the CPU, a warning saying so. `free_bytes` is the memory free now (`None`
/// where the system does not say); `bytes_per_block` covers K and V of every layer.
pub fn default_kv_blocks(
    sizing: KvSizing,
    options: &EngineLaunch,
    block_size: usize,
    bytes_per_block: usize,
    free_bytes: Option<usize>,
    reserve_bytes: usize,
) -> Result<(usize, Option<String>)> {
    let bytes_per_block = bytes_per_block.max(1);
    let memory_blocks = free_bytes.map(|free| {
        let budget = (free as f64 * options.kv_cache_fraction) as usize;
        budget.saturating_sub(reserve_bytes) / bytes_per_block
    });
    let blocks = match sizing {
        KvSizing::MemoryFraction => {
            let free = memory_blocks
                .ok_or_else(|| anyhow!("the free memory is unknown: pass --num-kv-blocks"))?;
            // More than every sequence at full length is never used.
            let useful = options
                .max_num_seqs
                .saturating_mul(options.max_model_len)
                .saturating_add(block_size)
                / block_size;
            (free.min(useful), None)
        }
        KvSizing::Workload => {
            let workload =
                workload_kv_blocks(options.max_num_seqs, options.max_model_len, block_size);
            match memory_blocks {
                Some(cap) if cap < workload => {
                    let warning = format!(
                        "warning: a KV cache for --max-num-seqs {} x --max-model-len {} ({workload} blocks of {block_size} tokens, {}) exceeds --kv-cache-fraction {} of the {} available: it gets {cap} blocks ({}); lower --max-num-seqs or --max-model-len to fit, or set --num-kv-blocks",
                        options.max_num_seqs,
                        options.max_model_len,
                        format_bytes((workload as u64).saturating_mul(bytes_per_block as u64)),
                        options.kv_cache_fraction,
                        format_bytes(free_bytes.unwrap_or(0) as u64),
                        format_bytes((cap as u64).saturating_mul(bytes_per_block as u64)),
                    );
                    (cap, Some(warning))
                }
                _ => (workload, None),
            }
        }
    };
    Ok((blocks.0.saturating_add(1), blocks.1))
}

/// What the launch needs to know about a backend's memory.
trait KvMemory: Backend {
    /// Bytes a new allocation may take now (`None` where the system does not say).
    fn free_bytes(&self) -> Result<Option<usize>>;
    /// That memory, in messages.
    fn memory_name(&self) -> &'static str;
    /// Bytes of one parameter and of one cached K or V element.
    fn param_elem_bytes(&self) -> usize;
    fn kv_elem_bytes(&self) -> usize;
    /// Kept free for activations of a step.
    fn reserve_bytes(&self) -> usize;
    fn kv_sizing(&self) -> KvSizing;
}

impl KvMemory for CpuBackend {
    fn free_bytes(&self) -> Result<Option<usize>> {
        Ok(crate::sysmem::available_memory_bytes())
    }
    fn memory_name(&self) -> &'static str {
        "the available host memory (MemAvailable)"
    }
    fn param_elem_bytes(&self) -> usize {
        4
    }
    fn kv_elem_bytes(&self) -> usize {
        4
    }
    fn reserve_bytes(&self) -> usize {
        0
    }
    fn kv_sizing(&self) -> KvSizing {
        KvSizing::Workload
    }
}

impl KvMemory for CudaBackend {
    fn free_bytes(&self) -> Result<Option<usize>> {
        Ok(Some(self.device.ctx.mem_get_info()?.0))
    }
    fn memory_name(&self) -> &'static str {
        "the free device memory"
    }
    fn param_elem_bytes(&self) -> usize {
        2
    }
    fn kv_elem_bytes(&self) -> usize {
        2
    }
    fn reserve_bytes(&self) -> usize {
        4 << 30
    }
    fn kv_sizing(&self) -> KvSizing {
        KvSizing::MemoryFraction
    }
}

/// Starts the engine thread: builds the backend there (a CUDA context is used by the thread that
/// made it), checks the config's sizes against its memory, loads the model, sizes the KV cache.
fn start_engine<B: KvMemory + 'static>(
    make_backend: impl FnOnce() -> Result<B> + Send + 'static,
    options: &EngineLaunch,
    config: &ModelConfig,
) -> Result<EngineHandle> {
    let (options, config) = (options.clone(), config.clone());
    EngineHandle::spawn(move || build_engine(make_backend()?, &options, &config, Arc::new(Solo)))
}

/// One rank's engine on `backend`: its part of the model, and a KV cache sized as the module doc
/// says, agreed by every rank of `comm` (the smallest count any can hold: the ranks' schedulers
/// must plan the same blocks).
fn build_engine<B: KvMemory>(
    backend: B,
    options: &EngineLaunch,
    config: &ModelConfig,
    comm: Arc<dyn Communicator<B>>,
) -> Result<Engine<B>> {
    let tp = comm.size();
    if let Some(free) = backend.free_bytes()? {
        // A rank holds about 1/tp of the parameters.
        config
            .check_parameters_fit(
                backend.param_elem_bytes(),
                free.saturating_mul(tp),
                backend.memory_name(),
            )
            .map_err(|e| anyhow!("{}: {e}", options.model.join("config.json").display()))?;
    }
    let model = Qwen2Model::load_shard(&backend, &options.model, comm.clone())?;
    let max_model_len = options.max_model_len;
    let mut engine_config = EngineConfig::for_model(max_model_len, 0);
    engine_config.max_num_seqs = options.max_num_seqs;
    engine_config.max_num_batched_tokens = options.max_num_batched_tokens;
    engine_config.seed = options.seed;
    // Host memory is committed as the cache writes it: keep the touched set small.
    engine_config.evict_before_touching = backend.kv_sizing() == KvSizing::Workload;
    let bs = engine_config.block_size;
    let per_token = PagedKv::<()>::bytes_per_token(config, &model.local, backend.kv_elem_bytes());
    let bytes_per_block = per_token.saturating_mul(bs);
    // Ranks of one process share its host memory.
    let free = backend.free_bytes()?.map(|f| match backend.kv_sizing() {
        KvSizing::Workload => f / tp,
        KvSizing::MemoryFraction => f,
    });
    let blocks = kv_blocks(&backend, options, bs, bytes_per_block, free)?;
    let mut agreed = [-(blocks as f64)];
    comm.all_reduce_f64(&mut agreed, ReduceOp::Max)?;
    let blocks = (-agreed[0]) as usize;
    ensure!(
        (blocks.saturating_sub(1)) * bs >= max_model_len,
        "the KV cache of {blocks} blocks x {bs} tokens cannot hold one sequence of max_model_len {max_model_len}: lower --max-model-len or give the cache more memory (--kv-cache-fraction, --num-kv-blocks)"
    );
    engine_config.num_blocks = blocks;
    if comm.rank() == 0 {
        eprintln!(
            "loaded {} ({} layers, hidden {}, vocab {}{}); KV cache {} blocks x {} tokens ({}{}); max_model_len {}",
            options.model.display(),
            model.config.num_hidden_layers,
            model.config.hidden_size,
            model.config.vocab_size,
            if tp > 1 { format!(", tensor-parallel {tp}") } else { String::new() },
            blocks - 1,
            bs,
            format_bytes(((blocks - 1) as u64).saturating_mul(bytes_per_block as u64)),
            if tp > 1 { " on rank 0" } else { "" },
            max_model_len
        );
    }
    Engine::new(backend, model, engine_config)
}

/// The KV cache's blocks: `--num-kv-blocks` checked against the memory, or the default.
fn kv_blocks<B: KvMemory>(
    backend: &B,
    options: &EngineLaunch,
    bs: usize,
    bytes_per_block: usize,
    free: Option<usize>,
) -> Result<usize> {
    match options.num_kv_blocks {
        Some(n) => {
            let bytes = n.checked_mul(bytes_per_block);
            let fits = match (bytes, free) {
                (Some(bytes), Some(free)) => bytes <= free,
                (None, _) => false,
                (Some(_), None) => true,
            };
            if !fits {
                bail!(
                    "--num-kv-blocks {n} needs {} ({} per block of {bs} tokens), but {} is {}",
                    bytes.map_or_else(|| "more than 2^64 bytes".into(), |b| format_bytes(b as u64)),
                    format_bytes(bytes_per_block as u64),
                    backend.memory_name(),
                    free.map_or_else(|| "unknown".into(), |f| format_bytes(f as u64))
                );
            }
            Ok(n)
        }
        None => {
            let (blocks, warning) = default_kv_blocks(
                backend.kv_sizing(),
                options,
                bs,
                bytes_per_block,
                free,
                backend.reserve_bytes(),
            )?;
            if let Some(warning) = warning {
                eprintln!("{warning}");
            }
            Ok(blocks)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(max_num_seqs: usize, max_model_len: usize, fraction: f64) -> EngineLaunch {
        EngineLaunch {
            model: PathBuf::new(),
            device: DeviceChoice::Cpu,
            max_model_len,
            kv_cache_fraction: fraction,
            num_kv_blocks: None,
            max_num_seqs,
            max_num_batched_tokens: 8192,
            seed: 0,
            tensor_parallel: 1,
        }
    }

    #[test]
    fn the_cpu_default_follows_the_workload_and_is_capped_by_memory() {
        let kib = 1024;
        // 8 sequences of 100 tokens: 7 blocks of 16 each (the last partly used) = 56, plus 14
        // for the prefix cache, plus the null block; memory far beyond it changes nothing.
        let plenty = Some(1 << 40);
        let o = options(8, 100, 0.9);
        let (blocks, warning) =
            default_kv_blocks(KvSizing::Workload, &o, 16, kib, plenty, 0).unwrap();
        assert_eq!((blocks, warning), (56 + 14 + 1, None));
        let o = options(16, 100, 0.9);
        let (blocks, _) = default_kv_blocks(KvSizing::Workload, &o, 16, kib, plenty, 0).unwrap();
        assert_eq!(blocks, 112 + 28 + 1, "twice the sequences");
        // 40 KiB available at 0.9: 36 blocks of 1 KiB, and a warning naming the flags; at 0.5, 20.
        let (blocks, warning) =
            default_kv_blocks(KvSizing::Workload, &o, 16, kib, Some(40 * kib), 0).unwrap();
        assert_eq!(blocks, 36 + 1);
        let warning = warning.unwrap();
        assert!(
            warning.contains("--max-num-seqs 16 x --max-model-len 100 (140 blocks"),
            "{warning}"
        );
        let o = options(16, 100, 0.5);
        let (blocks, _) =
            default_kv_blocks(KvSizing::Workload, &o, 16, kib, Some(40 * kib), 0).unwrap();
        assert_eq!(blocks, 20 + 1);
        // Unknown memory: the workload's size.
        let (blocks, _) = default_kv_blocks(KvSizing::Workload, &o, 16, kib, None, 0).unwrap();
        assert_eq!(blocks, 141);
    }

    #[test]
    fn the_gpu_default_is_a_fraction_of_free_memory() {
        let o = options(256, 32768, 0.5);
        // 10 GiB free, 2 GiB reserve, half of it: 3 GiB of 1 MiB blocks.
        let (blocks, warning) = default_kv_blocks(
            KvSizing::MemoryFraction,
            &o,
            16,
            1 << 20,
            Some(10 << 30),
            2 << 30,
        )
        .unwrap();
        assert_eq!((blocks, warning), (3 * 1024 + 1, None));
        // Never more than every sequence at full length (+ one block).
        let o = options(2, 64, 0.5);
        let (blocks, _) =
            default_kv_blocks(KvSizing::MemoryFraction, &o, 16, 1 << 20, Some(10 << 30), 0)
                .unwrap();
        assert_eq!(blocks, 9 + 1);
        assert!(default_kv_blocks(KvSizing::MemoryFraction, &o, 16, 1, None, 0).is_err());
    }
}
