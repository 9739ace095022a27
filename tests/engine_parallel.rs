//! Serving with tensor parallelism on the CPU (ranks as threads): an engine of TP 2 or 3 ranks
//! answers like one rank: the same tokens for greedy and seeded requests (prompts long enough
//! for chunked prefill and prefix-cache hits), logprobs within f32 reduction-order noise, prompt
//! logprobs, a weight reload from a folder on every rank, and the KV cache released and restored
//! on every rank. A rank that cannot be built fails the launch with its own error.

mod common;

use common::fixture_dir;
use std::sync::mpsc::Receiver;
use swerve::backend::DeviceChoice;
use swerve::engine::launch::{launch_engine, EngineLaunch};
use swerve::engine::{EngineHandle, FinalRecord, GenerationRequest, RequestEvent, SamplingParams};

/// Logprobs of the same token from different summation orders (ranks' partial sums).
const MAX_LOGPROB_ERROR: f32 = 1e-4;

fn launch(model: &str, tensor_parallel: usize) -> EngineHandle {
    launch_engine(&EngineLaunch {
        model: fixture_dir(model),
        device: DeviceChoice::Cpu,
        max_model_len: 64,
        kv_cache_fraction: 0.9,
        num_kv_blocks: Some(40),
        max_num_seqs: 4,
        // Small: prompts of 30 tokens prefill in chunks.
        max_num_batched_tokens: 24,
        seed: 3,
        tensor_parallel,
    })
    .unwrap()
}

fn requests(vocab: u64) -> Vec<GenerationRequest> {
    let prompt = common::tokens(9, 30, vocab);
    let shared: Vec<u32> = prompt[..20]
        .iter()
        .copied()
        .chain(common::tokens(10, 6, vocab))
        .collect();
    let seeded = |seed| SamplingParams {
        seed: Some(seed),
        top_logprobs: 2,
        ..SamplingParams::default()
    };
    [
        (prompt.clone(), SamplingParams::greedy(), Some(1)),
        (prompt, seeded(5), None),
        (shared, seeded(6), None),
        (common::tokens(11, 3, vocab), seeded(7), None),
    ]
    .into_iter()
    .map(|(prompt, params, prompt_logprobs)| GenerationRequest {
        prompt,
        params,
        max_tokens: 12,
        stop_ids: vec![],
        prompt_logprobs,
    })
    .collect()
}

/// Submits every request at once and waits for each: its final record and prompt logprobs.
fn run(
    handle: &EngineHandle,
    requests: &[GenerationRequest],
) -> Vec<(FinalRecord, Vec<Option<f32>>)> {
    let receivers: Vec<Receiver<RequestEvent>> = requests
        .iter()
        .map(|r| handle.submit(r.clone()).unwrap().1)
        .collect();
    receivers
        .into_iter()
        .map(|rx| {
            let mut prompt = Vec::new();
            loop {
                match rx.recv().unwrap() {
                    RequestEvent::PromptLogprobs(p) => prompt = p.logprobs,
                    RequestEvent::Token(_) => {}
                    RequestEvent::Finished(record) => return (record, prompt),
                }
            }
        })
        .collect()
}

fn assert_same(
    what: &str,
    got: &[(FinalRecord, Vec<Option<f32>>)],
    want: &[(FinalRecord, Vec<Option<f32>>)],
) {
    for (i, ((g, gp), (w, wp))) in got.iter().zip(want).enumerate() {
        assert_eq!(
            g.output_tokens, w.output_tokens,
            "{what}: request {i}'s tokens"
        );
        assert_eq!(g.finish_reason, w.finish_reason, "{what}: request {i}");
        for (a, b) in g.logprobs.iter().zip(&w.logprobs) {
            assert!(
                (a - b).abs() <= MAX_LOGPROB_ERROR,
                "{what}: request {i}: logprob {a} vs {b}"
            );
        }
        assert_eq!(gp.len(), wp.len(), "{what}: request {i}'s prompt logprobs");
        for (a, b) in gp.iter().zip(wp) {
            match (a, b) {
                (Some(a), Some(b)) => assert!(
                    (a - b).abs() <= MAX_LOGPROB_ERROR,
                    "{what}: prompt logprob {a} vs {b}"
                ),
                (a, b) => assert_eq!(a.is_some(), b.is_some()),
            }
        }
    }
}

#[test]
fn a_tensor_parallel_engine_answers_like_one_rank() {
    for (model, degrees) in [
        ("untied-gqa2-odd-f32", vec![2, 3]),
        ("tied-gqa4-bf16", vec![2, 4]),
    ] {
        let vocab = swerve::config::ModelConfig::from_dir(&fixture_dir(model))
            .unwrap()
            .vocab_size as u64;
        let requests = requests(vocab);
        let want = run(&launch(model, 1), &requests);
        for tp in degrees {
            let handle = launch(model, tp);
            let first = run(&handle, &requests);
            assert_same(&format!("{model} tp {tp}"), &first, &want);
            // Again: now with prefix-cache hits on every rank.
            let again = run(&handle, &requests);
            assert_same(&format!("{model} tp {tp}, cached"), &again, &want);
            assert!(
                again.iter().any(|(r, _)| r.usage.cached_tokens > 0),
                "{model} tp {tp}: no prefix-cache hit"
            );
            // Reload (every rank reads its part of the folder), release and restore the cache.
            let version = handle.update_weights(fixture_dir(model)).unwrap();
            assert_eq!(version, handle.stats().unwrap().weight_version);
            let freed = handle.release_kv_cache().unwrap();
            assert!(freed > 0);
            assert_same(
                &format!("{model} tp {tp}, reloaded"),
                &run(&handle, &requests),
                &want,
            );
        }
    }
}

#[test]
fn an_impossible_split_fails_the_launch_naming_the_field() {
    // 4 query heads cannot be split over 5 ranks.
    let error = launch_engine(&EngineLaunch {
        model: fixture_dir("tied-gqa4-bf16"),
        device: DeviceChoice::Cpu,
        max_model_len: 64,
        kv_cache_fraction: 0.9,
        num_kv_blocks: Some(40),
        max_num_seqs: 4,
        max_num_batched_tokens: 24,
        seed: 3,
        tensor_parallel: 5,
    })
    .err()
    .expect("refused");
    let message = format!("{error:#}");
    assert!(
        message.contains("num_attention_heads (4)") && message.contains("config.json"),
        "{message}"
    );
}
