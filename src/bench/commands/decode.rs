//! `swerve-bench decode`: decode steps over the paged KV cache at several batch sizes
//! ([`crate::bench::decode`]; tokens/s, and on a GPU the share of the bandwidth roofline), and on
//! a GPU paged decode attention alone at long contexts.

use super::{append_jsonl, or_default, random_model};
use crate::backend::{select, Backend, CudaBackend, DeviceChoice, Selected};
use crate::bench::decode::{copy_bandwidth, decode_attention, print_decode_table};
use crate::config::ModelConfig;
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
    /// Replay captured CUDA graphs (false: every step op by op).
    pub cuda_graphs: bool,
    /// Also append one JSON record per row to this file.
    pub jsonl: Option<PathBuf>,
}

/// How one run of decode steps is set up: the cached context per sequence, the KV cache's
/// element size, and the measured copy bandwidth (GPU) for the roofline.
struct DecodeSetup<'a> {
    batches: &'a [usize],
    context: usize,
    elem_bytes: usize,
    copy_gb_per_s: Option<f64>,
}

pub fn decode(options: &DecodeOptions) -> Result<()> {
    let (config, tp_size) = synthetic::preset(&options.preset)?;
    if options.batch_sizes.contains(&0) || options.context == Some(0) || options.steps == 0 {
        bail!("--batch-sizes, --context and --steps must be positive");
    }
    let (backend, line) = select(options.device)?;
    println!("{line}");
    match backend {
        Selected::Cpu(b) => {
            let setup = DecodeSetup {
                batches: &or_default(&options.batch_sizes, &[1, 4]),
                context: options.context.unwrap_or(256),
                elem_bytes: 4,
                copy_gb_per_s: None,
            };
            decode_on(&b, config, tp_size, options, &setup)
        }
        Selected::Cuda(b) => {
            let bandwidth = copy_bandwidth(&b)?;
            println!("measured copy bandwidth: {bandwidth:.0} GB/s (read + write)");
            let setup = DecodeSetup {
                batches: &or_default(&options.batch_sizes, &[1, 8, 32, 128]),
                context: options.context.unwrap_or(4096),
                elem_bytes: 2,
                copy_gb_per_s: Some(bandwidth),
            };
            decode_on(&*b, config.clone(), tp_size, options, &setup)?;
            decode_attention_rows(&b, &config, tp_size, options, bandwidth)
        }
    }
}

fn decode_on<B: Backend>(
    backend: &B,
    config: ModelConfig,
    tp_size: usize,
    options: &DecodeOptions,
    setup: &DecodeSetup<'_>,
) -> Result<()> {
    let context = setup.context;
    let model = random_model(backend, config, tp_size)?;
    println!(
        "model: preset {} ({} layers, hidden {}), random weights; {context} tokens cached per sequence",
        options.preset, model.config.num_hidden_layers, model.config.hidden_size
    );
    let rows = setup
        .batches
        .iter()
        .map(|&batch| {
            crate::bench::decode::decode(
                backend,
                &model,
                batch,
                context,
                options.steps,
                setup.elem_bytes,
                options.cuda_graphs,
            )
        })
        .collect::<Result<Vec<_>>>()?;
    let copy_gb_per_s = setup.copy_gb_per_s;
    print_decode_table(&rows, copy_gb_per_s);
    if let Some(path) = &options.jsonl {
        let records: Vec<serde_json::Value> = rows
            .iter()
            .map(|r| serde_json::json!({
                "table": "decode", "impl": "swerve",
                "key": format!("preset={} batch={} context={}", options.preset, r.batch, r.context),
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

/// Paged decode attention alone, for 1 and 8 sequences at each of `attention_contexts`,
/// against the measured copy bandwidth.
fn decode_attention_rows(
    backend: &CudaBackend,
    config: &ModelConfig,
    tp_size: usize,
    options: &DecodeOptions,
    bandwidth: f64,
) -> Result<()> {
    let local = config.local_sizes(tp_size)?;
    let mut rows = Vec::new();
    for &context in options.attention_contexts.iter().filter(|&&c| c > 0) {
        for seqs in [1, 8] {
            let row = decode_attention(
                backend,
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
    if let Some(path) = &options.jsonl {
        let records: Vec<serde_json::Value> = rows
            .iter()
            .map(|r| {
                serde_json::json!({
                    "table": "decode_attention", "impl": "swerve", "key": r.key,
                    "median_ms": r.median_ms, "gb_per_s": r.gb_per_s,
                    "copy_fraction": r.gb_per_s / bandwidth, "note": backend.name(),
                })
            })
            .collect();
        append_jsonl(path, &records)?;
    }
    Ok(())
}
