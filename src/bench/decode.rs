//! `swerve-bench decode`: decode steps of a Qwen2-shaped model over the paged KV cache, and (with
//! a GPU) paged decode attention alone at long contexts.
//!
//! A decode step of `batch` sequences, each `context` tokens deep, is what the engine runs once
//! every sequence has caught up: one new token per sequence through every layer (K/V written into
//! the cache, attention over the sequence's blocks), the LM head of those rows, and sampling at
//! temperature 1 on the backend (`Backend::sample_rows`, 16 bytes per row back to the host). The
//! KV cache is filled with whatever its blocks hold: the speed of a step does not depend on the
//! values, so no prefill is needed to measure it. Each sequence has blocks of its own (no prefix
//! sharing that L2 could serve).
//!
//! The roofline of a step is the bytes it must read once: every weight matrix (the embedding table
//! only when it is also the LM head; otherwise `batch` rows of it), every norm weight, and the K/V
//! of every cached token of every sequence, over the card's measured copy bandwidth. With tensor
//! parallelism, all of it per rank: the rank's shard of the weights (replicated norms and KV heads
//! whole) and its KV heads' cache, against its time (which includes the collectives).

use crate::backend::cuda::paged_attn::DevicePagedLayout;
use crate::backend::cuda::{CudaBackend, DeviceDType};
use crate::backend::{Backend, PagedLayout, RowDraw};
use crate::bench::kernels::{measure_copy_bandwidth, time_ms};
use crate::engine::sampler::SampleRng;
use crate::kvcache::DEFAULT_BLOCK_SIZE;
use crate::model::{PagedKv, Qwen2Model, Qwen2Params};
use anyhow::{ensure, Result};
use std::time::Instant;

/// One row of the decode table.
#[derive(Debug, Clone)]
pub struct DecodeRow {
    pub batch: usize,
    pub context: usize,
    /// Median wall time of one step, host work and the token read-back included.
    pub median_step_seconds: f64,
    pub tokens_per_second: f64,
    /// Bytes a step must read: weights + the K/V of every cached token.
    pub bytes_per_step: f64,
    /// Timed steps replayed from a CUDA graph (`Backend::decode_step_graph`).
    pub graph_steps: usize,
}

impl DecodeRow {
    /// Achieved fraction of the bandwidth roofline, given the measured copy bandwidth (GB/s).
    pub fn roofline_fraction(&self, copy_gb_per_s: f64) -> f64 {
        self.bytes_per_step / (copy_gb_per_s * 1e9) / self.median_step_seconds
    }
}

/// Bytes of one decode step that cannot be avoided, on one rank: the parameters of its shard
/// (`elem_bytes` each; an untied embedding table contributes only the `batch` rows gathered)
/// plus its K/V of `batch` sequences of `context` tokens.
pub fn decode_bytes<B: Backend>(
    model: &Qwen2Model<B>,
    batch: usize,
    context: usize,
    elem_bytes: usize,
) -> f64 {
    let c = &model.config;
    let local = &model.local;
    let mut params: usize = Qwen2Params::<()>::shards(c, local)
        .iter()
        .map(|(_, shard)| shard.local_shape().iter().product::<usize>())
        .sum();
    if !c.tie_word_embeddings {
        params -= (local.vocab_local - batch.min(local.vocab_local)) * c.hidden_size;
    }
    let kv = PagedKv::<()>::bytes_per_token(c, local, elem_bytes) * batch * context;
    (params * elem_bytes + kv) as f64
}

/// Times `steps` decode steps (after two warm-ups) of `batch` sequences that start `context`
/// tokens deep; the median step is reported. With `cuda_graphs`, steps replay the backend's
/// captured graph where it has one (as the engine's do); the first step captures it. Every rank
/// of `model`'s tensor-parallel group calls it (each samples the same tokens from the gathered
/// logits); the times are this rank's.
pub fn decode<B: Backend>(
    backend: &B,
    model: &Qwen2Model<B>,
    batch: usize,
    context: usize,
    steps: usize,
    elem_bytes: usize,
    cuda_graphs: bool,
) -> Result<DecodeRow> {
    ensure!(
        batch > 0 && context > 0 && steps > 0,
        "decode: batch, context and steps must be positive"
    );
    let warmup = 2;
    let max_len = context + warmup + steps;
    ensure!(
        max_len <= model.config.max_context(),
        "decode: context {context} + {} steps exceeds the model's context of {}",
        warmup + steps,
        model.config.max_context()
    );
    let block_size = DEFAULT_BLOCK_SIZE;
    let blocks_per_seq = max_len.div_ceil(block_size);
    let mut kv = model.new_paged_kv(backend, 1 + batch * blocks_per_seq, block_size)?;
    let block_tables: Vec<u32> = (0..batch * blocks_per_seq).map(|b| 1 + b as u32).collect();
    let vocab = model.local.vocab_local as u64;
    let mut rng = SampleRng::from_seed(0xDEC0DE);
    let mut tokens: Vec<u32> = (0..batch as u64)
        .map(|s| ((s * 7919 + 11) % vocab) as u32)
        .collect();
    let mut times = Vec::with_capacity(steps);
    let mut graph_steps = 0;
    for step in 0..warmup + steps {
        let position = (context - 1 + step) as u32;
        let started = Instant::now();
        let layout = PagedLayout {
            block_size,
            cu_query: (0..=batch as u32).collect(),
            context_lens: vec![position + 1; batch],
            block_tables: block_tables.clone(),
            max_blocks_per_seq: blocks_per_seq,
            slot_mapping: (0..batch)
                .map(|s| {
                    let p = position as usize;
                    block_tables[s * blocks_per_seq + p / block_size] * block_size as u32
                        + (p % block_size) as u32
                })
                .collect(),
        };
        let positions = vec![position; batch];
        let draws: Vec<RowDraw> = (0..batch)
            .map(|_| RowDraw {
                temperature: 1.0,
                uniform: rng.next_f64(),
            })
            .collect();
        let graphed = match cuda_graphs {
            true => {
                backend.decode_step_graph(model, &mut kv, &tokens, &positions, &layout, &draws)?
            }
            false => None,
        };
        graph_steps += usize::from(graphed.is_some() && step >= warmup);
        let sampled = match graphed {
            Some(sampled) => sampled,
            None => {
                let hidden = model.forward_paged(backend, &tokens, &positions, &layout, &mut kv)?;
                let logits = model.lm_head(backend, &hidden)?;
                backend.sample_rows(&logits, &draws)?
            }
        };
        tokens = sampled.iter().map(|&(t, _)| t).collect();
        if step >= warmup {
            times.push(started.elapsed().as_secs_f64());
        }
    }
    times.sort_by(f64::total_cmp);
    let median = times[times.len() / 2];
    Ok(DecodeRow {
        batch,
        context,
        median_step_seconds: median,
        tokens_per_second: batch as f64 / median,
        bytes_per_step: decode_bytes(model, batch, context + warmup + steps / 2, elem_bytes),
        graph_steps,
    })
}

pub fn print_decode_table(rows: &[DecodeRow], copy_gb_per_s: Option<f64>) {
    println!(
        "{:>6} {:>9} {:>12} {:>12} {:>12} {:>10} {:>7}",
        "batch", "context", "median ms", "tokens/s", "MB/step", "roofline", "graphs"
    );
    for r in rows {
        let fraction = copy_gb_per_s
            .map(|bw| format!("{:.1}%", 100.0 * r.roofline_fraction(bw)))
            .unwrap_or_else(|| "n/a".into());
        println!(
            "{:>6} {:>9} {:>12.3} {:>12.1} {:>12.1} {:>10} {:>7}",
            r.batch,
            r.context,
            r.median_step_seconds * 1e3,
            r.tokens_per_second,
            r.bytes_per_step / 1e6,
            fraction,
            if r.graph_steps > 0 { "yes" } else { "no" }
        );
    }
}

/// One row of paged decode attention alone.
#[derive(Debug, Clone)]
pub struct DecodeAttentionRow {
    pub key: String,
    pub median_ms: f64,
    /// K/V bytes read per call / time, GB/s.
    pub gb_per_s: f64,
}

/// How a decode-attention row maps the work to the GPU (every mapping gives the same bits).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecodeMapping {
    /// What the engine runs: the split kernel at its default ring depth, runs chosen for the GPU.
    Default,
    /// The earlier kernel: one warp per segment.
    WarpPerItem,
    /// The split kernel with a `stages`-deep ring and `run` segments per block (`None`: chosen).
    Split { stages: usize, run: Option<usize> },
}

impl DecodeMapping {
    /// The candidates the decode benchmark times side by side.
    pub const CANDIDATES: [DecodeMapping; 6] = [
        DecodeMapping::Default,
        DecodeMapping::WarpPerItem,
        DecodeMapping::Split {
            stages: 2,
            run: Some(1),
        },
        DecodeMapping::Split {
            stages: 2,
            run: None,
        },
        DecodeMapping::Split {
            stages: 3,
            run: None,
        },
        DecodeMapping::Split {
            stages: 4,
            run: None,
        },
    ];

    fn label(self) -> String {
        match self {
            Self::Default => "split".into(),
            Self::WarpPerItem => "warp-per-item".into(),
            Self::Split { stages, run } => match run {
                Some(run) => format!("split-s{stages}-run{run}"),
                None => format!("split-s{stages}-runs"),
            },
        }
    }
}

/// Paged decode attention (one query row per sequence, GQA `heads`/`kv_heads`, head dim 128) of
/// `seqs` sequences of `context` tokens each, timed with CUDA events. The K/V caches hold random
/// values and each sequence its own blocks. `mapping`: which kernel and work mapping.
pub fn decode_attention(
    backend: &CudaBackend,
    seqs: usize,
    context: usize,
    (heads, kv_heads): (usize, usize),
    mapping: DecodeMapping,
) -> Result<DecodeAttentionRow> {
    let head_dim = 128;
    let block_size = DEFAULT_BLOCK_SIZE;
    let blocks_per_seq = context.div_ceil(block_size);
    let num_blocks = 1 + seqs * blocks_per_seq;
    let cache_shape = [num_blocks, block_size, kv_heads, head_dim];
    let k_cache = crate::bench::kernels::upload_random(backend, &cache_shape, 31, 1.0)?;
    let v_cache = crate::bench::kernels::upload_random(backend, &cache_shape, 32, 1.0)?;
    let q = crate::bench::kernels::upload_random(backend, &[seqs, heads, head_dim], 33, 1.0)?;
    let mut out = backend.alloc(&[seqs, heads, head_dim], DeviceDType::Bf16)?;
    let layout = PagedLayout {
        block_size,
        cu_query: (0..=seqs as u32).collect(),
        context_lens: vec![context as u32; seqs],
        block_tables: (0..seqs * blocks_per_seq).map(|b| 1 + b as u32).collect(),
        max_blocks_per_seq: blocks_per_seq,
        slot_mapping: (0..seqs)
            .map(|s| ((1 + s * blocks_per_seq) * block_size) as u32)
            .collect(),
    };
    let scale = 1.0 / (head_dim as f32).sqrt();
    // The layout and its work plan are uploaded once, as every layer of a step shares them: the
    // events time the kernels alone.
    let mut device_layout = DevicePagedLayout::upload(backend, &layout)?;
    match mapping {
        DecodeMapping::Default => {}
        DecodeMapping::WarpPerItem => device_layout.decode_warp_per_item = true,
        DecodeMapping::Split { stages, run } => {
            device_layout.decode_stages = Some(stages);
            device_layout.decode_run = run;
        }
    }
    let ms = time_ms(&backend.device, 20, |_| {
        backend.device.paged_attention(
            &q,
            &k_cache,
            &v_cache,
            &device_layout,
            scale,
            &mut out,
            &backend.pool,
        )
    })?;
    let bytes = (2 * seqs * context * kv_heads * head_dim * 2) as f64;
    Ok(DecodeAttentionRow {
        key: format!(
            "seqs={seqs} context={context} heads={heads}/{kv_heads} d={head_dim} kernel={}",
            mapping.label()
        ),
        median_ms: ms,
        gb_per_s: bytes / (ms * 1e-3) / 1e9,
    })
}

/// The measured copy bandwidth (GB/s) of the card, for the roofline columns.
pub fn copy_bandwidth(backend: &CudaBackend) -> Result<f64> {
    measure_copy_bandwidth(backend)
}
