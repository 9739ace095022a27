//! `swerve-bench prefill` (the default command): prefill tokens/s and model TFLOP/s of one
//! sequence at each length, on a preset model with random weights.

use super::{append_jsonl, random_model};
use crate::backend::{select, Backend, DeviceChoice, Selected};
use crate::config::ModelConfig;
use crate::model::synthetic;
use anyhow::{bail, Result};
use std::path::PathBuf;

pub struct PrefillOptions {
    /// A `synthetic::preset` name.
    pub preset: String,
    pub device: DeviceChoice,
    /// Sequence lengths, each timed alone.
    pub seq_lens: Vec<usize>,
    /// Timed runs per length (after one warm-up); the median is reported.
    pub reps: usize,
    /// Also append one JSON record per row to this file.
    pub jsonl: Option<PathBuf>,
}

pub fn prefill(options: &PrefillOptions) -> Result<()> {
    if options.seq_lens.is_empty() || options.seq_lens.contains(&0) {
        bail!("--seq-lens needs positive lengths");
    }
    let (config, tp_size) = synthetic::preset(&options.preset)?;
    if let Some(&too_long) = options.seq_lens.iter().find(|&&n| n > config.max_context()) {
        bail!(
            "--seq-lens {too_long} exceeds the model's context of {}",
            config.max_context()
        );
    }
    let (backend, line) = select(options.device)?;
    println!("{line}");
    match backend {
        Selected::Cpu(b) => {
            let param_bytes = config.num_parameters() / tp_size * 4;
            if let Some(available) = crate::sysmem::available_memory_bytes() {
                if param_bytes > available / 2 {
                    bail!(
                        "preset {} needs {:.1} GiB of f32 weights on the CPU backend but only {:.1} GiB is available; \
                         presets this large are for GPU runs",
                        options.preset,
                        param_bytes as f64 / (1u64 << 30) as f64,
                        available as f64 / (1u64 << 30) as f64
                    );
                }
            }
            prefill_on(&b, config, tp_size, options)
        }
        Selected::Cuda(b) => prefill_on(&*b, config, tp_size, options),
    }
}

fn prefill_on<B: Backend>(
    backend: &B,
    config: ModelConfig,
    tp_size: usize,
    options: &PrefillOptions,
) -> Result<()> {
    let model = random_model(backend, config, tp_size)?;
    println!(
        "model: preset {} ({} layers, hidden {}, heads {}/{} kv, vocab {}, tp {} rank 0), random weights",
        options.preset,
        model.config.num_hidden_layers,
        model.config.hidden_size,
        model.local.heads_local,
        model.local.kv_heads_local,
        model.local.vocab_local,
        tp_size
    );
    let rows = crate::bench::prefill(backend, &model, &options.seq_lens, options.reps)?;
    crate::bench::print_prefill_table(&rows);
    if let Some(path) = &options.jsonl {
        let records: Vec<serde_json::Value> = rows
            .iter()
            .map(|r| {
                serde_json::json!({
                    "table": "prefill",
                    "impl": "swerve",
                    "key": format!("preset={} len={}", options.preset, r.seq_len),
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
