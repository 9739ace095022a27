//! Tensor parallelism on the CPU backend with in-process ranks (threads, `LocalGroup`): TP 2, 3
//! and 4 equal TP 1 on logits and scoring logprobs, and on one DAPO micro-batch's loss, report
//! and every parameter's gradient (the ranks' pieces put back together), with and without
//! activation checkpointing, on models whose KV heads, vocabulary and MLP width do not divide by
//! the TP degree. Every rank ends with bitwise the same logits, loss and replicated gradients.
//!
//! The bound: the ranks' partial sums (row-parallel GEMMs, embedding, the loss's per-shard
//! statistics and hidden gradients) are added in rank order instead of inside one dot product,
//! so results differ from TP 1 by f32 reduction-order noise. Measured on these models: logits
//! and logprobs within 3e-6 of the largest magnitude, gradients within 2e-5 (the comparison
//! prints the worst case); the tests allow 1e-4 for both, 10x below what one wrong term gives.

mod common;

use common::ranks::cpu_ranks;
use common::{fixture_dir, FIXTURE_MODELS};
use std::path::PathBuf;
use swerve::backend::cpu::CpuBackend;
use swerve::backend::Backend;
use swerve::config::ModelConfig;
use swerve::model::params::ParamShard;
use swerve::model::{PackedBatch, Qwen2Model, Qwen2Params};
use swerve::rng::{Rng, SplitMix64};
use swerve::train::loss::{LossOutput, LossRows, Objective};

const MAX_RELATIVE_ERROR: f64 = 1e-4;

/// A random-weight model whose sizes divide by nothing: 6 query heads over 3 KV heads,
/// vocabulary 301, MLP width 190, two layers, untied.
fn odd_model() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("swerve-tp-odd-{}", std::process::id()));
    if !dir.join("model.safetensors").exists() {
        let config = ModelConfig::from_json_str(
            r#"{"architectures": ["Qwen2ForCausalLM"], "hidden_size": 48, "intermediate_size": 190,
                "num_hidden_layers": 2, "num_attention_heads": 6, "num_key_value_heads": 3,
                "vocab_size": 301, "max_position_embeddings": 256, "rms_norm_eps": 1e-6,
                "rope_theta": 10000.0, "tie_word_embeddings": false}"#,
        )
        .unwrap();
        swerve::model::synthetic::write_model_dir(&config, 7, &dir).unwrap();
    }
    dir
}

/// Every model the tests split, with the TP degrees each allows (at most its query heads).
fn models() -> Vec<(PathBuf, Vec<usize>)> {
    let mut out: Vec<(PathBuf, Vec<usize>)> = FIXTURE_MODELS
        .iter()
        .map(|name| {
            let dir = fixture_dir(name);
            let heads = ModelConfig::from_dir(&dir).unwrap().num_attention_heads;
            (dir, (2..=4).filter(|&tp| tp <= heads).collect())
        })
        .collect();
    out.push((odd_model(), vec![2, 3, 4]));
    out
}

/// Two sequences of random tokens (lengths 13 and 8: 21 rows, which divides by none of 2, 4).
fn batch(vocab: usize) -> PackedBatch {
    let mut rng = SplitMix64::new(11);
    let seqs: Vec<Vec<u32>> = [13, 8]
        .iter()
        .map(|&n| (0..n).map(|_| rng.below(vocab) as u32).collect())
        .collect();
    PackedBatch::from_sequences(&seqs)
}

/// max |a - b| / max |b|, asserting finite values.
fn relative_error(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len());
    let scale = b
        .iter()
        .fold(0.0f64, |m, &x| m.max(x.abs() as f64))
        .max(1e-30);
    let diff = a
        .iter()
        .zip(b)
        .map(|(&x, &y)| {
            assert!(x.is_finite() && y.is_finite());
            (x as f64 - y as f64).abs()
        })
        .fold(0.0, f64::max);
    diff / scale
}

fn assert_close(what: &str, got: &[f32], want: &[f32]) {
    let error = relative_error(got, want);
    eprintln!("{what}: relative error {error:.2e}");
    assert!(
        error <= MAX_RELATIVE_ERROR,
        "{what}: relative error {error:.2e}"
    );
}

#[test]
fn logits_and_scores_equal_tp1() {
    for (dir, degrees) in models() {
        let config = ModelConfig::from_dir(&dir).unwrap();
        let batch = batch(config.vocab_size);
        let targets: Vec<u32> = batch.tokens[1..].iter().copied().chain([0]).collect();
        let run = |tp| {
            cpu_ranks(&dir, tp, |backend, model| {
                let logits = model.forward_logits(backend, &batch).unwrap();
                assert_eq!(
                    backend.shape(&logits),
                    [batch.num_tokens(), config.vocab_size]
                );
                let scores = model.train_logprobs(backend, &batch, &targets).unwrap();
                (backend.to_host(&logits).unwrap(), scores)
            })
        };
        let reference = run(1).pop().unwrap();
        for tp in degrees {
            let ranks = run(tp);
            for (rank, got) in ranks.iter().enumerate() {
                assert_eq!(
                    got,
                    &ranks[0],
                    "{}: tp {tp} rank {rank} differs from rank 0",
                    dir.display()
                );
            }
            let name = format!("{} tp {tp}", dir.file_name().unwrap().to_string_lossy());
            assert_close(&format!("{name} logits"), &ranks[0].0, &reference.0);
            assert_close(&format!("{name} logprobs"), &ranks[0].1, &reference.1);
        }
    }
}

/// One DAPO micro-batch on a rank: its report and every gradient (this rank's piece, with where
/// it sits in the whole tensor).
fn dapo_step(
    backend: &CpuBackend,
    model: &Qwen2Model<CpuBackend>,
    batch: &PackedBatch,
    checkpoint_layers: bool,
) -> (LossOutput, Vec<(ParamShard, Vec<f32>)>) {
    let t = batch.num_tokens();
    let mut rng = SplitMix64::new(5);
    let targets: Vec<u32> = batch.tokens[1..].iter().copied().chain([0]).collect();
    let action_mask: Vec<bool> = (0..t).map(|r| r % 3 != 2 && r + 1 != t).collect();
    let advantages: Vec<f32> = (0..t).map(|r| if r < 13 { 0.9 } else { -1.1 }).collect();
    // Old logprobs near the policy's, so both clip branches and the unclipped one occur.
    let current = model.train_logprobs(backend, batch, &targets).unwrap();
    let old: Vec<f32> = current
        .iter()
        .map(|&lp| lp + 0.6 * (rng.next_f64() as f32 - 0.5))
        .collect();
    let rows = LossRows {
        targets: &targets,
        action_mask: &action_mask,
        advantages: &advantages,
        old_logprobs: &old,
        rollout_logprobs: &old,
    };
    let objective = Objective::Dapo {
        eps_low: 0.2,
        eps_high: 0.28,
        tis_cap: None,
    };
    let mut grads = model.zero_grads(backend).unwrap();
    let out = model
        .loss_and_backward(
            backend,
            batch,
            &rows,
            &objective,
            17.0,
            checkpoint_layers,
            &mut grads,
        )
        .unwrap();
    model.reduce_replicated_grads(backend, &mut grads).unwrap();
    let shards = Qwen2Params::<()>::shards(&model.config, &model.local);
    let pieces = grads
        .iter()
        .zip(shards)
        .map(|(g, (_, shard))| (shard, backend.to_host(g).unwrap()))
        .collect();
    (out, pieces)
}

/// The whole tensor from every rank's piece; pieces that overlap (replicated tensors, KV heads
/// held by several ranks) must agree bit for bit.
fn put_together(what: &str, pieces: &[&(ParamShard, Vec<f32>)]) -> Vec<f32> {
    let numel: usize = pieces[0].0.full_shape.iter().product();
    let mut whole = vec![f32::NAN; numel];
    for (rank, (shard, values)) in pieces.iter().enumerate() {
        let mut mine = vec![f32::NAN; numel];
        shard.place(values, &mut mine);
        for (i, (w, m)) in whole.iter_mut().zip(&mine).enumerate() {
            if m.is_nan() {
                continue;
            }
            assert!(
                w.is_nan() || w == m,
                "{what}: rank {rank} holds {m} at {i}, another rank {w}"
            );
            *w = *m;
        }
    }
    assert!(
        whole.iter().all(|v| !v.is_nan()),
        "{what}: the pieces leave a hole"
    );
    whole
}

#[test]
fn a_dapo_step_gives_tp1_loss_and_gradients() {
    for (dir, degrees) in models() {
        let config = ModelConfig::from_dir(&dir).unwrap();
        let batch = batch(config.vocab_size);
        let names: Vec<String> =
            Qwen2Params::<()>::expected_tensors(&config, &config.shard(1, 0).unwrap())
                .into_iter()
                .map(|(n, _)| n)
                .collect();
        for checkpoint_layers in [true, false] {
            let (want, want_grads) =
                cpu_ranks(&dir, 1, |b, m| dapo_step(b, m, &batch, checkpoint_layers))
                    .pop()
                    .unwrap();
            assert!(
                want.clipped_low + want.clipped_high > 0
                    && want.action_tokens > want.clipped_low + want.clipped_high
            );
            for &tp in &degrees {
                let ranks = cpu_ranks(&dir, tp, |b, m| dapo_step(b, m, &batch, checkpoint_layers));
                let name = format!(
                    "{} tp {tp} checkpointing {checkpoint_layers}",
                    dir.file_name().unwrap().to_string_lossy()
                );
                let first = &ranks[0].0;
                for (rank, (out, _)) in ranks.iter().enumerate() {
                    assert_eq!(
                        out, first,
                        "{name}: rank {rank}'s report differs from rank 0's"
                    );
                }
                assert!(
                    (first.loss - want.loss).abs() <= MAX_RELATIVE_ERROR * want.loss.abs(),
                    "{name}: loss {} vs {}",
                    first.loss,
                    want.loss
                );
                assert_eq!(
                    (first.action_tokens, first.clipped_low, first.clipped_high),
                    (want.action_tokens, want.clipped_low, want.clipped_high),
                    "{name}"
                );
                assert_close(&format!("{name} logprobs"), &first.logprobs, &want.logprobs);
                for (i, param) in names.iter().enumerate() {
                    let what = format!("{name} {param}");
                    let pieces: Vec<_> = ranks.iter().map(|(_, grads)| &grads[i]).collect();
                    let got = put_together(&what, &pieces);
                    assert_close(&what, &got, &want_grads[i].1);
                }
            }
        }
    }
}
