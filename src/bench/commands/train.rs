//! `swerve-bench train`: one training step (forward, fused loss, backward, AdamW) on packed
//! tokens of a preset model ([`crate::bench::train`]): tokens/s, model TFLOP/s, and on a GPU the
//! MFU against the measured GEMM rate and the device memory in use.

use super::{append_jsonl, or_default, random_model};
use crate::backend::{select, BackendGrad, DeviceChoice, Selected};
use crate::bench::kernels::measure_ceilings;
use crate::bench::train::{print_train_table, train_step};
use crate::config::ModelConfig;
use crate::model::synthetic;
use anyhow::{bail, Result};
use std::path::PathBuf;

pub struct TrainOptions {
    /// A `synthetic::preset` name of tensor-parallel size 1.
    pub preset: String,
    pub device: DeviceChoice,
    /// Packed tokens per step, one row each (empty: 16384, 32768 on a GPU, 256 on the CPU).
    pub tokens: Vec<usize>,
    /// Tokens per packed sequence (`None`: each step is one sequence).
    pub seq_len: Option<usize>,
    /// Timed steps per size (after one warm-up); the median is reported.
    pub reps: usize,
    /// Also append one JSON record per row to this file.
    pub jsonl: Option<PathBuf>,
}

pub fn train(options: &TrainOptions) -> Result<()> {
    let (config, tp_size) = synthetic::preset(&options.preset)?;
    if tp_size != 1 {
        bail!(
            "train: preset {} is one rank of tensor-parallel {tp_size}; training runs TP = 1",
            options.preset
        );
    }
    if options.tokens.contains(&0) || options.seq_len == Some(0) || options.reps == 0 {
        bail!("--tokens, --seq-len and --reps must be positive");
    }
    let (backend, line) = select(options.device)?;
    println!("{line}");
    match backend {
        Selected::Cpu(b) => {
            let sizes = or_default(&options.tokens, &[256]);
            train_on(&b, config, options, &sizes, None)?;
        }
        Selected::Cuda(b) => {
            let ceilings = measure_ceilings(&b)?;
            println!(
                "measured bf16 GEMM rate: {:.0} TFLOP/s",
                ceilings.gemm_tflops
            );
            let sizes = or_default(&options.tokens, &[16384, 32768]);
            train_on(&*b, config, options, &sizes, Some(ceilings.gemm_tflops))?;
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

fn train_on<B: BackendGrad>(
    backend: &B,
    config: ModelConfig,
    options: &TrainOptions,
    sizes: &[usize],
    gemm_tflops: Option<f64>,
) -> Result<()> {
    let mut model = random_model(backend, config, 1)?;
    println!(
        "model: preset {} ({} layers, hidden {}), random weights; masked cross-entropy on every token, activation checkpointing on",
        options.preset, model.config.num_hidden_layers, model.config.hidden_size
    );
    let rows = sizes
        .iter()
        .map(|&tokens| {
            let seq_len = options.seq_len.unwrap_or(tokens);
            train_step(backend, &mut model, tokens, seq_len, options.reps)
        })
        .collect::<Result<Vec<_>>>()?;
    print_train_table(&rows, gemm_tflops);
    if let Some(path) = &options.jsonl {
        let records: Vec<serde_json::Value> = rows
            .iter()
            .map(|r| serde_json::json!({
                "table": "train", "impl": "swerve",
                "key": format!("preset={} tokens={} seq_len={}", options.preset, r.tokens, r.seq_len),
                "step_ms": r.step_seconds() * 1e3, "fwd_bwd_ms": r.fwd_bwd_seconds * 1e3,
                "tokens_per_s": r.tokens_per_second, "tflops": r.tflops,
                "mfu": gemm_tflops.map(|g| r.mfu(g)), "note": backend.name(),
            }))
            .collect();
        append_jsonl(path, &records)?;
    }
    Ok(())
}
