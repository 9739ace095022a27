//! What `swerve-bench` measures: prefill throughput of a Qwen2-shaped model on the backend in
//! use, and (with a GPU) each CUDA kernel against its CPU reference and the card's limits;
//! [`commands`] runs each of the binary's commands from its options.

pub mod agent;
pub mod agent_http;
pub mod commands;
pub mod decode;
pub mod gemm;
pub mod kernel_static;
pub mod kernels;
pub mod plan;
pub mod rl;
pub mod slow_env;
pub mod train;

use crate::backend::Backend;
use crate::config::ModelConfig;
use crate::model::{PackedBatch, Qwen2Model};
use anyhow::Result;
use std::time::Instant;

/// One row of the prefill table.
#[derive(Debug, Clone)]
pub struct PrefillRow {
    pub seq_len: usize,
    pub median_seconds: f64,
    pub tokens_per_second: f64,
    pub tflops: f64,
}

/// FLOPs of a prefill of one `seq_len`-token sequence on one rank of a tensor-parallel group of
/// `tp_size`: the whole model's over the ranks. The model's: every GEMM (2 per multiply-add),
/// causal attention (QK^T and PV over the lower triangle), and the LM head for the last token
/// only (what serving computes).
pub fn prefill_flops(config: &ModelConfig, tp_size: usize, seq_len: usize) -> f64 {
    let t = seq_len as f64;
    let d = config.hidden_size as f64;
    let hd = config.head_dim as f64;
    let q = config.num_attention_heads as f64 * hd;
    let kv = config.num_key_value_heads as f64 * hd;
    let inter = config.intermediate_size as f64;
    let gemm_per_token = 2.0 * (d * q + 2.0 * d * kv + q * d + 3.0 * d * inter);
    let attention = 2.0 * 2.0 * q * t * (t + 1.0) / 2.0;
    let per_layer = gemm_per_token * t + attention;
    let lm_head = 2.0 * d * config.vocab_size as f64;
    (config.num_hidden_layers as f64 * per_layer + lm_head) / tp_size as f64
}

/// Times a one-sequence prefill (all layers, the final norm, the LM head of the last token) at
/// each length: one warm-up, then the median of `reps` runs. Tokens are a fixed pseudo-random
/// sequence, not zeros. Every rank of `model`'s tensor-parallel group calls it (the collectives
/// keep them in lockstep); the times are this rank's, the FLOPs per rank.
pub fn prefill<B: Backend>(
    backend: &B,
    model: &Qwen2Model<B>,
    seq_lens: &[usize],
    reps: usize,
) -> Result<Vec<PrefillRow>> {
    let mut rows = Vec::new();
    for &seq_len in seq_lens {
        let vocab = model.config.vocab_size as u64;
        let tokens: Vec<u32> = (0..seq_len as u64)
            .map(|i| ((i * 2_654_435_761 + 12_345) % vocab) as u32)
            .collect();
        let batch = PackedBatch::from_sequences(&[tokens]);
        let run = || -> Result<f64> {
            let start = Instant::now();
            let hidden = model.forward_hidden(backend, &batch)?;
            let last = backend.slice_rows(&hidden, seq_len - 1..seq_len)?;
            let logits = model.lm_head(backend, &last)?;
            backend.to_host(&logits)?; // waits for the device, if any
            Ok(start.elapsed().as_secs_f64())
        };
        run()?;
        let mut times = (0..reps.max(1))
            .map(|_| run())
            .collect::<Result<Vec<f64>>>()?;
        times.sort_by(f64::total_cmp);
        let median = times[times.len() / 2];
        rows.push(PrefillRow {
            seq_len,
            median_seconds: median,
            tokens_per_second: seq_len as f64 / median,
            tflops: prefill_flops(&model.config, model.local.tp_size, seq_len) / median / 1e12,
        });
    }
    Ok(rows)
}

pub fn print_prefill_table(rows: &[PrefillRow]) {
    println!(
        "{:>9} {:>12} {:>12} {:>10}",
        "tokens", "median ms", "tokens/s", "TFLOP/s"
    );
    for r in rows {
        println!(
            "{:>9} {:>12.2} {:>12.0} {:>10.4}",
            r.seq_len,
            r.median_seconds * 1e3,
            r.tokens_per_second,
            r.tflops
        );
    }
}
