//! `swerve-bench train`: one training step of a Qwen2-shaped model on packed tokens, as
//! `swerve-train rft` runs it: the training forward (per-layer activation checkpointing on), the
//! fused LM-head loss over every token (masked cross-entropy, all tokens actions), the backward,
//! and the AdamW update of the f32 masters with the bf16 compute weights refreshed from them.
//!
//! With tensor parallelism (a model that is one rank's shard computing with its group) every
//! rank runs the same step in lockstep, as [`crate::train::learner::Learner`] does: the
//! sequence-parallel forward and backward, the replicated parameters' gradients summed over the
//! ranks, the global norm over the group, AdamW on the rank's shard.
//!
//! Reported per step: tokens/s (the step's tokens: the whole model's throughput), TFLOP/s and
//! (given the card's measured GEMM rate) MFU, per rank: the model's FLOPs over the ranks. The
//! FLOPs are the usual `3 x forward` (forward + backward's two GEMMs per forward GEMM, causal
//! attention's lower triangle, the LM head over every token); the recompute of checkpointed
//! layers is work done but not counted, as in Megatron's MFU.

use crate::backend::BackendGrad;
use crate::config::ModelConfig;
use crate::model::{PackedBatch, Qwen2Model};
use crate::train::learner::{global_grad_norm, norm_counts};
use crate::train::loss::{LossRows, Objective};
use crate::train::optimizer::{AdamW, AdamWConfig};
use anyhow::{ensure, Result};
use std::time::Instant;

/// One row of the train table.
#[derive(Debug, Clone)]
pub struct TrainRow {
    pub tokens: usize,
    pub seq_len: usize,
    /// Median seconds of forward + loss + backward.
    pub fwd_bwd_seconds: f64,
    /// Median seconds of the optimizer update (norm, clipping, AdamW, weight refresh).
    pub optimizer_seconds: f64,
    pub tokens_per_second: f64,
    pub tflops: f64,
}

impl TrainRow {
    pub fn step_seconds(&self) -> f64 {
        self.fwd_bwd_seconds + self.optimizer_seconds
    }
    pub fn mfu(&self, gemm_tflops: f64) -> f64 {
        self.tflops / gemm_tflops
    }
}

/// FLOPs of one training step over `tokens` packed as sequences of `seq_len`: three times the
/// forward's (every GEMM, causal attention, the LM head over every token).
pub fn train_flops(config: &ModelConfig, tokens: usize, seq_len: usize) -> f64 {
    let d = config.hidden_size as f64;
    let hd = config.head_dim as f64;
    let q = config.num_attention_heads as f64 * hd;
    let kv = config.num_key_value_heads as f64 * hd;
    let inter = config.intermediate_size as f64;
    let gemm_per_token = 2.0 * (d * q + 2.0 * d * kv + q * d + 3.0 * d * inter);
    let (t, s) = (tokens as f64, seq_len as f64);
    let attention = (t / s) * 2.0 * 2.0 * q * s * (s + 1.0) / 2.0;
    let per_layer = gemm_per_token * t + attention;
    let lm_head = 2.0 * d * config.vocab_size as f64 * t;
    3.0 * (config.num_hidden_layers as f64 * per_layer + lm_head)
}

/// `tokens` pseudo-random tokens packed as sequences of `seq_len`, and each row's target: the
/// next token of its sequence (the last row wraps to the first).
fn packed_tokens(vocab: usize, tokens: usize, seq_len: usize) -> (PackedBatch, Vec<u32>) {
    let vocab = vocab as u64;
    let sequences: Vec<Vec<u32>> = (0..tokens / seq_len)
        .map(|s| {
            (0..seq_len as u64)
                .map(|i| (((s as u64 * 1_000_003 + i) * 2_654_435_761 + 12_345) % vocab) as u32)
                .collect()
        })
        .collect();
    let targets = sequences
        .iter()
        .flat_map(|s| s[1..].iter().chain(&s[..1]).copied())
        .collect();
    (PackedBatch::from_sequences(&sequences), targets)
}

/// Times `reps` training steps (after one warm-up) of `tokens` pseudo-random tokens packed as
/// sequences of `seq_len`; the medians are reported. Every rank of `model`'s tensor-parallel
/// group calls it (the same tokens on each); the times are this rank's.
pub fn train_step<B: BackendGrad>(
    backend: &B,
    model: &mut Qwen2Model<B>,
    tokens: usize,
    seq_len: usize,
    reps: usize,
) -> Result<TrainRow> {
    ensure!(
        tokens > 0 && seq_len > 0 && tokens.is_multiple_of(seq_len),
        "train bench: {tokens} tokens do not pack into sequences of {seq_len}"
    );
    ensure!(
        seq_len <= model.config.max_context(),
        "train bench: sequences of {seq_len} exceed the model's context of {}",
        model.config.max_context()
    );
    let (batch, targets) = packed_tokens(model.config.vocab_size, tokens, seq_len);
    let action_mask = vec![true; tokens];
    let rows = LossRows {
        targets: &targets,
        action_mask: &action_mask,
        ..LossRows::default()
    };

    let mut grads = model.zero_grads(backend)?;
    let mut masters = model.zero_grads(backend)?;
    for (master, param) in masters.iter_mut().zip(model.params.iter()) {
        backend.copy_weights(param, master)?;
    }
    let master_refs: Vec<&B::Tensor> = masters.iter().collect();
    let mut adamw = AdamW::new(backend, AdamWConfig::default(), &master_refs)?;
    drop(master_refs);

    let counts = norm_counts(model);
    let mut fwd_bwd = Vec::new();
    let mut optimizer = Vec::new();
    for rep in 0..=reps.max(1) {
        for g in grads.iter_mut() {
            backend.fill_zero(g)?;
        }
        let started = Instant::now();
        model.loss_and_backward(
            backend,
            &batch,
            &rows,
            &Objective::MaskedCe,
            tokens as f64,
            true,
            &mut grads,
        )?;
        model.reduce_replicated_grads(backend, &mut grads)?;
        // The global norm reads every gradient back: the backward is done when it returns.
        let grad_norm = global_grad_norm(backend, model, &grads, &counts)?;
        let backward_done = Instant::now();
        let grad_refs: Vec<&B::Tensor> = grads.iter().collect();
        adamw.apply(
            backend,
            &mut masters.iter_mut().collect::<Vec<_>>(),
            &grad_refs,
            grad_norm,
            1e-6,
        )?;
        for (master, param) in masters.iter().zip(model.params.iter_mut()) {
            backend.copy_weights(master, param)?;
        }
        // Wait for the refresh: the norm of the first parameter reads it back.
        backend.sum_of_squares(model.params.iter().next().expect("a model has parameters"))?;
        if rep > 0 {
            fwd_bwd.push(backward_done.duration_since(started).as_secs_f64());
            optimizer.push(backward_done.elapsed().as_secs_f64());
        }
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (fwd_bwd_seconds, optimizer_seconds) = (median(&mut fwd_bwd), median(&mut optimizer));
    let step = fwd_bwd_seconds + optimizer_seconds;
    Ok(TrainRow {
        tokens,
        seq_len,
        fwd_bwd_seconds,
        optimizer_seconds,
        tokens_per_second: tokens as f64 / step,
        tflops: train_flops(&model.config, tokens, seq_len)
            / model.local.tp_size as f64
            / step
            / 1e12,
    })
}

pub fn print_train_table(rows: &[TrainRow], gemm_tflops: Option<f64>) {
    println!(
        "{:>8} {:>8} {:>12} {:>12} {:>12} {:>10} {:>7}",
        "tokens", "seq len", "fwd+bwd ms", "optim ms", "tokens/s", "TFLOP/s", "MFU"
    );
    for r in rows {
        let mfu = gemm_tflops
            .map(|g| format!("{:.1}%", 100.0 * r.mfu(g)))
            .unwrap_or_else(|| "n/a".into());
        println!(
            "{:>8} {:>8} {:>12.1} {:>12.1} {:>12.0} {:>10.3} {:>7}",
            r.tokens,
            r.seq_len,
            r.fwd_bwd_seconds * 1e3,
            r.optimizer_seconds * 1e3,
            r.tokens_per_second,
            r.tflops,
            mfu
        );
    }
}
