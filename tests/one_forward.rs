//! One forward pass (DESIGN.md decisions 1 and 10) on the CPU reference, where it is promised
//! bit for bit:
//! - scoring's forward, the trainer's (checkpointed or not) and the backward's recompute are the
//!   same numbers;
//! - the engine's sampled logprobs (paged decode, the sampler) equal the trainer's logprobs of the
//!   same tokens exactly: the rollout-vs-trainer gap is 0;
//! - DAPO's recomputed old logprobs equal the policy's logprobs inside the first update's loss:
//!   every ratio is exactly 1 (`ratio_deviation_mean` 0, nothing clipped).
//!
//! Two fixture models (tied bf16 weights with GQA 4:1; untied f32 with GQA 2:1 and odd sizes).
//! The micro-batch size packs the recompute and the step differently, which the CPU's row-wise
//! ops must not notice.

mod common;

use common::fixture_dir;
use swerve::backend::cpu::CpuBackend;
use swerve::engine::{Engine, EngineConfig, EngineEvent, GenerationRequest, SamplingParams};
use swerve::model::{PackedBatch, Qwen2Model};
use swerve::train::data::{TrainSequence, Trajectory};
use swerve::train::learner::Learner;
use swerve::train::loss::Objective;
use swerve::train::optimizer::AdamWConfig;
use swerve::train::score::score_sequences;

const MODELS: [&str; 2] = ["tied-gqa4-bf16", "untied-gqa2-odd-f32"];

/// Rollouts sampled at temperature 1 (the RL default) by the paged engine, as trajectories with
/// the sampler's logprobs, and alternating advantages.
fn rollouts(model_name: &str) -> Vec<TrainSequence> {
    let backend = CpuBackend::new();
    let model = Qwen2Model::load(&backend, &fixture_dir(model_name)).unwrap();
    let vocab = model.config.vocab_size as u64;
    let context = model.config.max_position_embeddings.min(128);
    let mut engine = Engine::new(backend, model, EngineConfig::for_model(context, 64)).unwrap();
    for (i, len) in [2usize, 7, 19, 33].into_iter().enumerate() {
        engine
            .add_request(GenerationRequest {
                prompt: common::tokens(100 + i as u64, len, vocab),
                params: SamplingParams {
                    seed: Some(7 + i as u64),
                    ..SamplingParams::default()
                },
                max_tokens: 12 + 5 * i,
                stop_ids: vec![],
                prompt_logprobs: None,
            })
            .unwrap();
    }
    let mut records = Vec::new();
    while engine.has_unfinished() {
        for event in engine.step().unwrap() {
            if let EngineEvent::Finished(record) = event {
                records.push(record);
            }
        }
    }
    records.sort_by_key(|r| r.id);
    assert_eq!(records.len(), 4);
    records
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let p = r.prompt_tokens.len();
            let tokens: Vec<u32> = r
                .prompt_tokens
                .iter()
                .chain(&r.output_tokens)
                .copied()
                .collect();
            let mut logprobs = vec![None; p];
            logprobs.extend(r.logprobs.iter().map(|&lp| Some(lp)));
            let trajectory = Trajectory {
                location: format!("request {i}"),
                group: None,
                action_mask: (0..tokens.len()).map(|t| t >= p).collect(),
                tokens,
                rollout_logprobs: Some(logprobs),
                reward: None,
            };
            let advantage = if i % 2 == 0 { 1.0 } else { -1.0 };
            TrainSequence::from_trajectory(&trajectory, advantage)
        })
        .collect()
}

fn learner<'b>(
    backend: &'b CpuBackend,
    model_name: &str,
    checkpoint_layers: bool,
) -> Learner<'b, CpuBackend> {
    // 40 tokens a micro-batch: the recompute over all four rollouts and each step pack differently.
    Learner::new(
        backend,
        &fixture_dir(model_name),
        AdamWConfig::default(),
        40,
        checkpoint_layers,
    )
    .unwrap()
}

#[test]
fn rollout_logprobs_equal_the_trainers_exactly() {
    for name in MODELS {
        let sequences = rollouts(name);
        let backend = CpuBackend::new();
        let learner = learner(&backend, name, true);
        let refs: Vec<&TrainSequence> = sequences.iter().collect();
        let trainer = learner.logprobs(&refs).unwrap();
        let mut compared = 0;
        for (s, rows) in sequences.iter().zip(&trainer) {
            assert_eq!(rows.len(), s.tokens.len());
            for r in (0..s.tokens.len()).filter(|&r| s.action_mask[r]) {
                assert_eq!(
                    rows[r].to_bits(),
                    s.rollout_logprobs[r].to_bits(),
                    "{name} {} row {r}: trainer {} vs rollout {}",
                    s.location,
                    rows[r],
                    s.rollout_logprobs[r]
                );
                compared += 1;
            }
        }
        assert!(compared >= 60, "{compared} action tokens compared");

        // `swerve-train score`'s path (full logits of chunks, `token_logprobs`) gives the same.
        let tokens: Vec<Vec<u32>> = sequences.iter().map(|s| s.tokens.clone()).collect();
        score_sequences(&backend, &learner.model, &tokens, 50, |i, scored| {
            for (t, lp) in scored.iter().enumerate().skip(1) {
                assert_eq!(
                    lp.unwrap().to_bits(),
                    trainer[i][t - 1].to_bits(),
                    "{name} sequence {i} token {t}: score vs trainer"
                );
            }
            Ok(())
        })
        .unwrap();
    }
}

#[test]
fn the_dapo_ratio_is_exactly_one_at_the_first_update() {
    for name in MODELS {
        let sequences = rollouts(name);
        let backend = CpuBackend::new();
        let mut learner = learner(&backend, name, true);
        let refs: Vec<&TrainSequence> = sequences.iter().collect();
        let olds = learner.logprobs(&refs).unwrap();
        let old_refs: Vec<&[f32]> = olds.iter().map(Vec::as_slice).collect();
        // Tight clipping: any ratio off 1 by more than 1e-6 would also count as clipped.
        let objective = Objective::Dapo {
            eps_low: 1e-6,
            eps_high: 1e-6,
            tis_cap: Some(2.0),
        };
        let report = learner.step(&refs, &old_refs, &objective, 1e-3).unwrap();
        let m = &report.metrics;
        assert!(!report.skipped, "{name}: {m}");
        assert_eq!(m["ratio_deviation_mean"].as_f64(), Some(0.0), "{name}: {m}");
        assert_eq!(m["clip_frac_low"].as_f64(), Some(0.0), "{name}: {m}");
        assert_eq!(m["clip_frac_high"].as_f64(), Some(0.0), "{name}: {m}");
        assert_eq!(m["logprob_gap_max"].as_f64(), Some(0.0), "{name}: {m}");
        // After the update the weights moved, so the same data no longer gives ratio 1: the
        // metric is live.
        let report = learner.step(&refs, &old_refs, &objective, 1e-3).unwrap();
        let deviation = report.metrics["ratio_deviation_mean"].as_f64().unwrap();
        assert!(deviation > 0.0, "{name}: {}", report.metrics);
    }
}

#[test]
fn scoring_training_and_the_backward_recompute_share_one_forward() {
    for name in MODELS {
        let backend = CpuBackend::new();
        let model = Qwen2Model::load(&backend, &fixture_dir(name)).unwrap();
        let vocab = model.config.vocab_size as u64;
        let batch = PackedBatch::from_sequences(&[
            common::tokens(1, 23, vocab),
            common::tokens(2, 5, vocab),
            common::tokens(3, 40, vocab),
        ]);
        let scoring = model.forward_hidden(&backend, &batch).unwrap();
        for checkpoint_layers in [true, false] {
            let trained = model
                .forward_train(&backend, &batch, checkpoint_layers)
                .unwrap();
            assert_eq!(trained.hidden.shape, scoring.shape);
            assert!(
                trained
                    .hidden
                    .data
                    .iter()
                    .zip(&scoring.data)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{name}: training hidden states (checkpointed {checkpoint_layers}) differ from scoring's"
            );
        }

        // The backward's recompute from each layer's input gives what the forward kept: the
        // gradients with and without checkpointing are identical.
        let mut targets = batch.tokens.clone();
        targets.rotate_left(1);
        let action_mask: Vec<bool> = (0..batch.num_tokens()).map(|r| r % 3 != 0).collect();
        let rows = swerve::train::loss::LossRows {
            targets: &targets,
            action_mask: &action_mask,
            ..Default::default()
        };
        let grads = |checkpoint_layers: bool| {
            let mut grads = model.zero_grads(&backend).unwrap();
            model
                .loss_and_backward(
                    &backend,
                    &batch,
                    &rows,
                    &Objective::MaskedCe,
                    50.0,
                    checkpoint_layers,
                    &mut grads,
                )
                .unwrap();
            grads
        };
        let (kept, recomputed) = (grads(false), grads(true));
        for (a, b) in kept.iter().zip(recomputed.iter()) {
            assert!(a.data.iter().any(|&g| g != 0.0), "{name}: a zero gradient");
            assert!(
                a.data
                    .iter()
                    .zip(&b.data)
                    .all(|(x, y)| x.to_bits() == y.to_bits()),
                "{name}: gradients differ with activation checkpointing"
            );
        }
    }
}
