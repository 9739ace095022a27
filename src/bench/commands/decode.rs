//! `swerve-bench decode`: decode steps over the paged KV cache at several batch sizes
//! ([`crate::bench::decode`]; tokens/s, and on a GPU the share of the bandwidth roofline), alone
//! or split over `--tensor-parallel` ranks, and on a GPU paged decode attention alone at long
//! contexts (one rank's heads).

use super::{append_jsonl, on_ranks, or_default, rank_model, Parallel};
use crate::backend::{select, Backend, BackendGrad, CudaBackend, DeviceChoice, Selected};
use crate::bench::decode::{
    copy_bandwidth, decode_attention, print_decode_table, DecodeMapping, DecodeRow,
};
use crate::config::ModelConfig;
use crate::dist::grid::{RankPlace, RankTask};
use crate::dist::Groups;
use crate::model::synthetic;
use anyhow::{bail, Result};
use std::path::PathBuf;

pub struct DecodeOptions {
    /// A `synthetic::preset` name.
    pub preset: String,
    pub device: DeviceChoice,
    /// Sequences per step, one row each (empty: 1, 8, 32, 128 on a GPU, 1, 4 on the CPU).
    pub batch_sizes: Vec<usize>,
    /// Tokens already cached per sequence when timing starts (`None`: 4096 on a GPU, 256 on the
    /// CPU).
    pub context: Option<usize>,
    /// Timed steps per batch size (after two warm-ups); the median is reported.
    pub steps: usize,
    /// Contexts of the decode-attention rows (GPU only); 0 skips them.
    pub attention_contexts: Vec<usize>,
    /// Replay captured CUDA graphs (false: every step op by op). One rank only: tensor-parallel
    /// steps run op by op, as the engine's.
    pub cuda_graphs: bool,
    /// Ranks the model is split over (1: one rank).
    pub tensor_parallel: usize,
    /// Also append one JSON record per row to this file.
    pub jsonl: Option<PathBuf>,
}

/// How one run of decode steps is set up: the cached context per sequence, the KV cache's
/// element size, and the measured copy bandwidth (GPU) for the roofline.
struct DecodeSetup {
    batches: Vec<usize>,
    context: usize,
    elem_bytes: usize,
    copy_gb_per_s: Option<f64>,
}

pub fn decode(options: &DecodeOptions) -> Result<()> {
    let (config, preset_tp) = synthetic::preset(&options.preset)?;
    if options.batch_sizes.contains(&0) || options.context == Some(0) || options.steps == 0 {
        bail!("--batch-sizes, --context and --steps must be positive");
    }
    let parallel = Parallel::new(&options.preset, &config, preset_tp, options.tensor_parallel)?;
    let (backend, line) = select(options.device)?;
    println!("{line}");
    let setup = match &backend {
        Selected::Cpu(_) => DecodeSetup {
            batches: or_default(&options.batch_sizes, &[1, 4]),
            context: options.context.unwrap_or(256),
            elem_bytes: 4,
            copy_gb_per_s: None,
        },
        Selected::Cuda(b) => {
            let bandwidth = copy_bandwidth(b)?;
            println!("measured copy bandwidth: {bandwidth:.0} GB/s (read + write)");
            DecodeSetup {
                batches: or_default(&options.batch_sizes, &[1, 8, 32, 128]),
                context: options.context.unwrap_or(4096),
                elem_bytes: 2,
                copy_gb_per_s: Some(bandwidth),
            }
        }
    };
    decode_rows(&backend, &config, parallel, options, &setup)?;
    match (&backend, setup.copy_gb_per_s) {
        (Selected::Cuda(b), Some(bandwidth)) => {
            decode_attention_rows(b, &config, parallel, options, bandwidth)
        }
        _ => Ok(()),
    }
}

/// The decode table: every rank runs the steps of each batch size in lockstep; rank 0's rows
/// are printed and written.
fn decode_rows(
    backend: &Selected,
    config: &ModelConfig,
    parallel: Parallel,
    options: &DecodeOptions,
    setup: &DecodeSetup,
) -> Result<()> {
    println!(
        "model: preset {} ({} layers, hidden {}), random weights; {} tokens cached per sequence",
        options.preset, config.num_hidden_layers, config.hidden_size, setup.context
    );
    let task = DecodeRank {
        config,
        preset_tp: parallel.preset_tp,
        options,
        setup,
        // Graphs capture one rank's work: tensor-parallel steps run op by op, as the engine's.
        cuda_graphs: options.cuda_graphs && parallel.ranks == 1,
    };
    let (rows, rank_backend) = on_ranks(backend, parallel.ranks, &task)?;
    let copy_gb_per_s = setup.copy_gb_per_s;
    println!("{}", parallel.title("MB/step and roofline", &rank_backend));
    print_decode_table(&rows, copy_gb_per_s);
    if let Some(path) = &options.jsonl {
        let records: Vec<serde_json::Value> = rows
            .iter()
            .map(|r| serde_json::json!({
                "table": "decode", "impl": "swerve",
                "key": format!("preset={} batch={} context={}{}", options.preset, r.batch, r.context, parallel.key_suffix()),
                "median_ms": r.median_step_seconds * 1e3, "tokens_per_s": r.tokens_per_second,
                "bytes_per_step": r.bytes_per_step, "cuda_graphs": r.graph_steps > 0,
                "roofline_fraction": copy_gb_per_s.map(|bw| r.roofline_fraction(bw)),
                "tensor_parallel": parallel.ranks, "note": rank_backend,
            }))
            .collect();
        append_jsonl(path, &records)?;
    }
    Ok(())
}

/// One rank of the decode table: its model, the timed steps of each batch size (in lockstep
/// with the other ranks); the rows and the rank's backend.
struct DecodeRank<'a> {
    config: &'a ModelConfig,
    preset_tp: usize,
    options: &'a DecodeOptions,
    setup: &'a DecodeSetup,
    cuda_graphs: bool,
}

impl RankTask for DecodeRank<'_> {
    type Output = (Vec<DecodeRow>, String);

    fn run<B: BackendGrad + 'static>(
        &self,
        backend: &B,
        groups: Groups<B>,
        _place: RankPlace,
    ) -> Result<Self::Output> {
        let model = rank_model(backend, self.config.clone(), self.preset_tp, groups.tp)?;
        let rows = self
            .setup
            .batches
            .iter()
            .map(|&batch| {
                crate::bench::decode::decode(
                    backend,
                    &model,
                    batch,
                    self.setup.context,
                    self.options.steps,
                    self.setup.elem_bytes,
                    self.cuda_graphs,
                )
            })
            .collect::<Result<Vec<_>>>()?;
        Ok((rows, backend.name()))
    }
}

/// Paged decode attention alone, for 1 and 8 sequences (and 128 up to 8k) at each of `attention_contexts`,
/// against the measured copy bandwidth.
fn decode_attention_rows(
    backend: &CudaBackend,
    config: &ModelConfig,
    parallel: Parallel,
    options: &DecodeOptions,
    bandwidth: f64,
) -> Result<()> {
    let local = config.local_sizes(parallel.shard_tp())?;
    let mut rows = Vec::new();
    for &context in options.attention_contexts.iter().filter(|&&c| c > 0) {
        // 1 and 8 sequences at every context, and 128 at short ones (issue 36's cases); each
        // with the engine's mapping and the candidates beside it (the same bits).
        let batches: &[usize] = if context <= 8192 {
            &[1, 8, 128]
        } else {
            &[1, 8]
        };
        for &seqs in batches {
            for mapping in DecodeMapping::CANDIDATES {
                let heads = (local.heads_local, local.kv_heads_local);
                let row = decode_attention(backend, seqs, context, heads, mapping)?;
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
    }
    if let Some(path) = &options.jsonl {
        let records: Vec<serde_json::Value> = rows
            .iter()
            .map(|r| {
                serde_json::json!({
                    "table": "decode_attention", "impl": "swerve", "key": r.key,
                    "median_ms": r.median_ms, "gb_per_s": r.gb_per_s,
                    "copy_fraction": r.gb_per_s / bandwidth,
                    "tensor_parallel": parallel.ranks, "note": backend.name(),
                })
            })
            .collect();
        append_jsonl(path, &records)?;
    }
    Ok(())
}
