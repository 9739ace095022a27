//! The engine on the CPU backend with a fixture model: paged generation equals full
//! recomputation token for token (and logprob for logprob, bitwise) over many random
//! interleavings of requests, prompt lengths, chunk sizes, preemptions and aborts; the pool ends
//! every run with zero used blocks; prefix-cache hits are counted exactly.

mod common;

use common::fixture_dir;
use std::collections::HashMap;
use swerve::backend::cpu::CpuBackend;
use swerve::backend::Backend;
use swerve::engine::{
    Engine, EngineConfig, EngineEvent, EngineHandle, FinalRecord, FinishReason, GenerationRequest,
    PromptLogprobs, RequestEvent, SamplingParams,
};
use swerve::model::{PackedBatch, Qwen2Model};
use swerve::rng::{Rng, SplitMix64};

const MODEL: &str = "tied-gqa4-bf16"; // vocab 320, context 128, GQA 4:1

fn model(backend: &CpuBackend) -> Qwen2Model<CpuBackend> {
    Qwen2Model::load(backend, &fixture_dir(MODEL)).unwrap()
}

fn greedy(prompt: Vec<u32>, max_tokens: usize) -> GenerationRequest {
    GenerationRequest {
        prompt,
        params: SamplingParams::greedy(),
        max_tokens,
        stop_ids: vec![],
        prompt_logprobs: None,
    }
}

/// Checks a finished greedy request against one full forward pass over prompt + output: each
/// output token is the argmax (lowest id on ties) of the row before it, and its logprob is the
/// trainer's `token_logprobs` of that row, bit for bit.
fn check_against_recompute(
    backend: &CpuBackend,
    model: &Qwen2Model<CpuBackend>,
    record: &FinalRecord,
) {
    let mut sequence = record.prompt_tokens.clone();
    sequence.extend(&record.output_tokens);
    let logits = model
        .forward_logits(backend, &PackedBatch::from_sequences(&[sequence.clone()]))
        .unwrap();
    let vocab = model.config.vocab_size;
    let p = record.prompt_tokens.len();
    let rows = backend
        .slice_rows(&logits, p - 1..sequence.len() - 1)
        .unwrap();
    let trainer = backend
        .token_logprobs(&rows, &record.output_tokens)
        .unwrap();
    for (k, &token) in record.output_tokens.iter().enumerate() {
        let row = &logits.data[(p - 1 + k) * vocab..(p + k) * vocab];
        let argmax = row
            .iter()
            .enumerate()
            .fold((0, f32::NEG_INFINITY), |best, (i, &v)| {
                if v > best.1 {
                    (i, v)
                } else {
                    best
                }
            })
            .0 as u32;
        assert_eq!(
            token, argmax,
            "request {} output {k}: paged {token}, recomputed {argmax}",
            record.id
        );
        assert_eq!(
            record.logprobs[k].to_bits(),
            trainer[k].to_bits(),
            "request {} output {k}: rollout logprob {} vs trainer {}",
            record.id,
            record.logprobs[k],
            trainer[k]
        );
    }
}

#[test]
fn paged_generation_equals_full_recomputation_over_random_interleavings() {
    let backend = CpuBackend::with_threads(1);
    let reference = model(&backend);
    let (mut preemptions, mut hits, mut aborts, mut checked) = (0u64, 0u64, 0usize, 0usize);
    for trial in 0..24u64 {
        let mut rng = SplitMix64::new(trial * 7919 + 1);
        let block_size = [1, 2, 4, 16][rng.below(4)];
        let budget = [1, 3, 7, 32, 256][rng.below(5)];
        // From barely enough for one long request to plenty.
        let num_blocks =
            1 + (128usize.div_ceil(block_size)) * (1 + rng.below(4)) / 2 + rng.below(8);
        let config = EngineConfig {
            block_size,
            num_blocks: num_blocks.max(128usize.div_ceil(block_size) + 1),
            max_num_seqs: [1, 3, 8][rng.below(3)],
            max_num_batched_tokens: budget,
            max_model_len: 128,
            seed: trial,
            enable_prefix_caching: rng.below(4) != 0,
            cuda_graphs: true,
            // Both free-queue policies (the CPU server's and the default).
            evict_before_touching: trial % 2 == 0,
        };
        let mut engine = Engine::new(CpuBackend::with_threads(1), model(&backend), config).unwrap();
        let shared: Vec<u32> = (0..50).map(|_| rng.below(320) as u32).collect();
        let mut pending: Vec<(usize, GenerationRequest)> = (0..8)
            .map(|_| {
                let len = 1 + rng.below(60);
                let mut prompt: Vec<u32> = (0..len).map(|_| rng.below(320) as u32).collect();
                if rng.below(2) == 0 {
                    let keep = rng.below(shared.len()).min(len);
                    prompt[..keep].copy_from_slice(&shared[..keep]);
                }
                let at_step = rng.below(12);
                (at_step, greedy(prompt, 1 + rng.below(24)))
            })
            .collect();
        let mut finished: HashMap<u64, FinalRecord> = HashMap::new();
        let mut live = Vec::new();
        let mut step = 0;
        while !pending.is_empty() || engine.has_unfinished() {
            let (now, later): (Vec<_>, Vec<_>) = pending.into_iter().partition(|(s, _)| *s <= step);
            pending = later;
            for (_, request) in now {
                live.push(engine.add_request(request).unwrap());
            }
            if !live.is_empty() && rng.below(40) == 0 {
                let id = live.swap_remove(rng.below(live.len()));
                if let Some(record) = engine.abort(id) {
                    assert_eq!(record.finish_reason, FinishReason::Abort);
                    aborts += 1;
                }
            }
            for event in engine.step().unwrap() {
                if let EngineEvent::Finished(record) = event {
                    live.retain(|&id| id != record.id);
                    finished.insert(record.id, record);
                }
            }
            engine.kv_manager().check_invariants().unwrap();
            step += 1;
            assert!(step < 20_000, "trial {trial}: no progress");
        }
        for record in finished.values() {
            assert!(
                matches!(record.finish_reason, FinishReason::Length),
                "trial {trial}: {:?}",
                record.finish_reason
            );
            check_against_recompute(&backend, &reference, record);
            checked += 1;
        }
        let stats = engine.stats();
        assert_eq!(stats.kv_used_blocks, 0, "trial {trial}: leaked blocks");
        preemptions += stats.preemptions;
        hits += stats.prefix_hit_tokens;
    }
    println!("checked {checked} requests; {preemptions} preemptions, {hits} prefix-hit tokens, {aborts} aborts");
    assert!(checked > 100 && preemptions > 0 && hits > 0 && aborts > 0);
}

#[test]
fn a_shared_prompt_is_computed_once_for_the_whole_group() {
    let backend = CpuBackend::new();
    let config = EngineConfig::for_model(128, 64);
    let mut engine = Engine::new(backend, model(&CpuBackend::new()), config).unwrap();
    let prompt: Vec<u32> = (0..64).map(|i| (i * 37 % 320) as u32).collect();
    for _ in 0..10 {
        engine.add_request(greedy(prompt.clone(), 5)).unwrap();
    }
    let mut records = Vec::new();
    while engine.has_unfinished() {
        for event in engine.step().unwrap() {
            if let EngineEvent::Finished(r) = event {
                records.push(r);
            }
        }
    }
    assert_eq!(records.len(), 10);
    // 63 of 64 tokens may come from the cache: 3 full blocks of 16.
    let cached: Vec<usize> = records.iter().map(|r| r.usage.cached_tokens).collect();
    assert_eq!(cached.iter().filter(|&&c| c == 48).count(), 9, "{cached:?}");
    assert_eq!(cached.iter().filter(|&&c| c == 0).count(), 1, "{cached:?}");
    assert_eq!(engine.stats().prefix_hit_tokens, 9 * 48);
    assert!(records
        .iter()
        .all(|r| r.output_tokens == records[0].output_tokens));
    assert_eq!(engine.stats().kv_used_blocks, 0);
}

#[test]
fn each_turn_reuses_the_previous_turns_cache() {
    let backend = CpuBackend::new();
    let mut engine = Engine::new(
        backend,
        model(&CpuBackend::new()),
        EngineConfig::for_model(128, 64),
    )
    .unwrap();
    let mut history: Vec<u32> = (0..20).map(|i| (i * 11 % 320) as u32).collect();
    for turn in 0..4 {
        engine.add_request(greedy(history.clone(), 6)).unwrap();
        let mut record = None;
        while engine.has_unfinished() {
            for event in engine.step().unwrap() {
                if let EngineEvent::Finished(r) = event {
                    record = Some(r);
                }
            }
        }
        let record = record.unwrap();
        if turn > 0 {
            // Everything the last turn computed, in full blocks, except the prompt's last token.
            assert!(
                record.usage.cached_tokens >= 16,
                "turn {turn}: {:?}",
                record.usage
            );
            assert_eq!(record.usage.cached_tokens % 16, 0);
        }
        history.extend(&record.output_tokens);
        history.extend([7, 8, 9, 10, 11]); // the next observation
    }
    assert_eq!(engine.stats().kv_used_blocks, 0);
}

#[test]
fn same_seed_same_sample_and_defaults_report_the_models_logprobs() {
    let backend = CpuBackend::new();
    let reference = model(&backend);
    let run = |seed: u64, temperature: f32| -> FinalRecord {
        let mut engine = Engine::new(
            CpuBackend::new(),
            model(&CpuBackend::new()),
            EngineConfig::for_model(128, 64),
        )
        .unwrap();
        let params = SamplingParams {
            seed: Some(seed),
            temperature,
            ..Default::default()
        };
        engine
            .add_request(GenerationRequest {
                prompt: vec![1, 2, 3, 4, 5],
                params,
                max_tokens: 30,
                stop_ids: vec![],
                prompt_logprobs: None,
            })
            .unwrap();
        loop {
            for event in engine.step().unwrap() {
                if let EngineEvent::Finished(r) = event {
                    return r;
                }
            }
        }
    };
    let (a, b) = (run(42, 1.0), run(42, 1.0));
    assert_eq!(a.output_tokens, b.output_tokens);
    assert_eq!(a.logprobs, b.logprobs);
    // This tiny model is peaked at temperature 1; at 3 the seeds must show.
    let (hot, hot_again, other) = (run(42, 3.0), run(42, 3.0), run(43, 3.0));
    assert_eq!(hot.output_tokens, hot_again.output_tokens);
    assert_ne!(
        hot.output_tokens, other.output_tokens,
        "different seeds gave the same 30 tokens"
    );
    // Temperature 1, no filters: the logprob is the model's, exactly what the trainer computes.
    let mut sequence = a.prompt_tokens.clone();
    sequence.extend(&a.output_tokens);
    let logits = reference
        .forward_logits(&backend, &PackedBatch::from_sequences(&[sequence.clone()]))
        .unwrap();
    let rows = backend.slice_rows(&logits, 4..sequence.len() - 1).unwrap();
    let trainer = backend.token_logprobs(&rows, &a.output_tokens).unwrap();
    assert_eq!(a.logprobs, trainer);
}

/// Runs requests in one engine to completion; records in submission order.
fn run_all(requests: &[GenerationRequest]) -> Vec<FinalRecord> {
    let mut engine = Engine::new(
        CpuBackend::new(),
        model(&CpuBackend::new()),
        EngineConfig::for_model(128, 64),
    )
    .unwrap();
    let ids: Vec<u64> = requests
        .iter()
        .map(|r| engine.add_request(r.clone()).unwrap())
        .collect();
    let mut done = HashMap::new();
    while engine.has_unfinished() {
        for event in engine.step().unwrap() {
            if let EngineEvent::Finished(r) = event {
                done.insert(r.id, r);
            }
        }
    }
    ids.iter().map(|id| done.remove(id).unwrap()).collect()
}

#[test]
fn device_and_host_sampled_rows_in_one_step_match_each_request_alone() {
    // Unfiltered and greedy rows go through `Backend::sample_rows`, filtered rows and rows asking
    // for top logprobs through the host sampler; the engine splits and reorders a step's rows
    // between the two. Each request must get exactly what it gets alone.
    let request = |seed: u64, params: SamplingParams| GenerationRequest {
        prompt: vec![7, 8, 9, (seed % 300) as u32 + 10],
        params: SamplingParams {
            seed: Some(seed),
            ..params
        },
        max_tokens: 12,
        stop_ids: vec![],
        prompt_logprobs: None,
    };
    let hot = |temperature: f32| SamplingParams {
        temperature,
        ..Default::default()
    };
    let requests = vec![
        request(1, hot(3.0)),
        request(
            2,
            SamplingParams {
                top_k: Some(40),
                ..hot(3.0)
            },
        ),
        request(3, SamplingParams::greedy()),
        request(
            4,
            SamplingParams {
                top_logprobs: 3,
                ..hot(2.0)
            },
        ),
        request(5, hot(0.5)),
        request(
            6,
            SamplingParams {
                top_p: 0.9,
                min_p: 0.01,
                ..hot(3.0)
            },
        ),
        request(7, hot(1.0)),
    ];
    let together = run_all(&requests);
    for (r, record) in requests.iter().zip(&together) {
        let alone = run_all(std::slice::from_ref(r));
        assert_eq!(
            record.output_tokens, alone[0].output_tokens,
            "{:?}",
            r.params
        );
        assert_eq!(record.logprobs, alone[0].logprobs, "{:?}", r.params);
        assert_eq!(record.top_logprobs, alone[0].top_logprobs, "{:?}", r.params);
        assert_eq!(record.output_tokens.len(), 12);
    }
    assert_eq!(
        together[3].top_logprobs.len(),
        12,
        "one top-3 list per token"
    );
    assert!(together[3].top_logprobs.iter().all(|top| top.len() == 3));
}

#[test]
fn bad_requests_are_refused_with_the_field_named() {
    let mut engine = Engine::new(
        CpuBackend::new(),
        model(&CpuBackend::new()),
        EngineConfig::for_model(128, 64),
    )
    .unwrap();
    let cases = [
        (greedy(vec![], 4), "prompt"),
        (greedy(vec![1, 320], 4), "outside the vocabulary"),
        (greedy(vec![1; 128], 4), "max_model_len"),
        (greedy(vec![1], 0), "max_tokens"),
        (
            GenerationRequest {
                params: SamplingParams {
                    temperature: -1.0,
                    ..Default::default()
                },
                ..greedy(vec![1], 4)
            },
            "temperature",
        ),
    ];
    for (request, needle) in cases {
        let err = engine.add_request(request).unwrap_err();
        assert!(
            format!("{err:#}").contains(needle),
            "{err:#} lacks {needle}"
        );
    }
    assert!(Engine::new(
        CpuBackend::new(),
        model(&CpuBackend::new()),
        EngineConfig::for_model(4096, 64)
    )
    .is_err());
}

#[test]
fn the_handle_streams_aborts_reloads_and_frees_everything() {
    let handle = EngineHandle::spawn(|| {
        let backend = CpuBackend::new();
        let model = model(&backend);
        Engine::new(backend, model, EngineConfig::for_model(128, 64))
    })
    .unwrap();
    let prompt: Vec<u32> = (0..40).map(|i| (i * 13 % 320) as u32).collect();

    // A streamed request: tokens, then one Finished carrying the same tokens.
    let (id, events) = handle.submit(greedy(prompt.clone(), 8)).unwrap();
    let mut streamed = Vec::new();
    let record = loop {
        match events.recv().unwrap() {
            RequestEvent::Token(t) => {
                assert_eq!(t.id, id);
                streamed.push(t.token);
            }
            RequestEvent::Finished(r) => break r,
            RequestEvent::PromptLogprobs(_) => panic!("not asked for"),
        }
    };
    assert_eq!(record.output_tokens, streamed);
    assert_eq!(record.weight_version, 0);

    // A dropped receiver (a client that went away) and an explicit abort both free their blocks.
    let (_, dropped) = handle.submit(greedy(prompt.clone(), 80)).unwrap();
    drop(dropped);
    let (id, events) = handle.submit(greedy(prompt.clone(), 80)).unwrap();
    handle.abort(id).unwrap();
    let last = events.iter().last().unwrap();
    assert!(matches!(last, RequestEvent::Finished(r) if r.finish_reason == FinishReason::Abort));

    // Reloading weights bumps the version and forgets the prefix cache.
    assert_eq!(handle.update_weights(fixture_dir(MODEL)).unwrap(), 1);
    let (_, events) = handle.submit(greedy(prompt.clone(), 2)).unwrap();
    let record = match events.iter().last().unwrap() {
        RequestEvent::Finished(r) => r,
        other => panic!("{other:?}"),
    };
    assert_eq!(record.weight_version, 1);
    assert_eq!(record.usage.cached_tokens, 0);
    assert!(handle
        .update_weights(fixture_dir("untied-gqa2-odd-f32"))
        .is_err());

    for _ in 0..100 {
        let stats = handle.stats().unwrap();
        if stats.kv_used_blocks == 0 && stats.running == 0 && stats.waiting == 0 {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    panic!("blocks still in use: {:?}", handle.stats().unwrap());
}

#[test]
fn a_released_kv_cache_comes_back_on_the_next_request_with_the_same_results() {
    let mut engine = Engine::new(
        CpuBackend::new(),
        model(&CpuBackend::new()),
        EngineConfig::for_model(128, 64),
    )
    .unwrap();
    let finish = |engine: &mut Engine<CpuBackend>, request: GenerationRequest| {
        let id = engine.add_request(request).unwrap();
        let mut record = None;
        while engine.has_unfinished() {
            for event in engine.step().unwrap() {
                if let EngineEvent::Finished(r) = event {
                    if r.id == id {
                        record = Some(r);
                    }
                }
            }
        }
        record.unwrap()
    };
    let prompt: Vec<u32> = (1..40).collect();
    let before = finish(&mut engine, greedy(prompt.clone(), 12));
    // Refused while a request is in flight.
    let id = engine.add_request(greedy(prompt.clone(), 4)).unwrap();
    assert!(engine.release_kv_cache().is_err());
    engine.abort(id);
    while engine.has_unfinished() {
        engine.step().unwrap();
    }
    let freed = engine.release_kv_cache().unwrap();
    // 64 blocks x 16 tokens x K and V of every layer.
    let config = &engine.model.config;
    assert_eq!(
        freed,
        64 * 16 * 2 * config.num_hidden_layers * config.num_key_value_heads * config.head_dim
    );
    assert_eq!(engine.release_kv_cache().unwrap(), 0);
    let after = finish(&mut engine, greedy(prompt, 12));
    assert_eq!(before.output_tokens, after.output_tokens);
    assert_eq!(before.logprobs, after.logprobs);
    // The prefix cache went with the memory: nothing was served from it.
    assert_eq!(after.usage.cached_tokens, 0);
}

#[test]
fn the_cpu_kv_cache_default_follows_the_workload_flags() {
    use swerve::backend::DeviceChoice;
    use swerve::engine::launch::{launch_engine, EngineLaunch};
    let blocks = |max_num_seqs: usize, max_model_len: usize| {
        let handle = launch_engine(&EngineLaunch {
            model: fixture_dir(MODEL),
            device: DeviceChoice::Cpu,
            max_model_len,
            kv_cache_fraction: 0.9,
            num_kv_blocks: None,
            max_num_seqs,
            max_num_batched_tokens: 256,
            seed: 0,
            tensor_parallel: 1,
        })
        .unwrap();
        handle.stats().unwrap().kv_total_blocks
    };
    // Each sequence's full length in 16-token blocks, times the sequences, plus a quarter of that
    // for the prefix cache (the fixture's KV is tiny: memory never caps it here).
    assert_eq!(blocks(3, 64), 3 * 4 + 3);
    assert_eq!(blocks(6, 64), 6 * 4 + 6);
    assert_eq!(blocks(3, 128), 3 * 8 + 6);
    assert_eq!(blocks(5, 100), 5 * 7 + 9);
}

/// The prompt logprobs the engine computed before they became engine work: one full forward
/// over the prompt, the LM head over its rows, `log_softmax_at` of each next token and the
/// greedy sampler's top alternatives. Also checked against the trainer's `token_logprobs`.
fn full_forward_prompt_logprobs(
    backend: &CpuBackend,
    model: &Qwen2Model<CpuBackend>,
    prompt: &[u32],
    top_n: usize,
) -> PromptLogprobs {
    use swerve::engine::sampler::{log_softmax_at, sample, SampleRng};
    let logits = model
        .forward_logits(backend, &PackedBatch::from_sequences(&[prompt]))
        .unwrap();
    let rows = backend.slice_rows(&logits, 0..prompt.len() - 1).unwrap();
    let trainer = backend.token_logprobs(&rows, &prompt[1..]).unwrap();
    let vocab = model.config.vocab_size;
    let greedy_top = SamplingParams {
        top_logprobs: top_n,
        ..SamplingParams::greedy()
    };
    let mut out = PromptLogprobs {
        logprobs: vec![None],
        top_logprobs: vec![Vec::new()],
        ranks: vec![None],
    };
    for (t, row) in logits
        .data
        .chunks_exact(vocab)
        .take(prompt.len() - 1)
        .enumerate()
    {
        let logprob = log_softmax_at(row, prompt[t + 1]);
        assert_eq!(
            logprob.to_bits(),
            trainer[t].to_bits(),
            "position {}",
            t + 1
        );
        out.logprobs.push(Some(logprob));
        let target = row[prompt[t + 1] as usize];
        out.ranks
            .push(Some(1 + row.iter().filter(|&&y| y > target).count() as u32));
        let mut rng = SampleRng::from_seed(0);
        out.top_logprobs
            .push(sample(row, &greedy_top, &mut rng).top_logprobs);
    }
    out
}

#[test]
fn echo_prompt_logprobs_are_prefill_work_with_unchanged_values() {
    let backend = CpuBackend::with_threads(1);
    let reference_model = model(&backend);
    let prompt: Vec<u32> = (0..100).map(|i| (i * 37 % 311) as u32 + 3).collect();
    let expected = full_forward_prompt_logprobs(&backend, &reference_model, &prompt, 3);
    // Budgets: prefill chunks of 15 beside a decode, and one step of 99 rows (two LM head
    // chunks). Prefix caching: the same prompt computed before, so its blocks are cached.
    for (budget, cached_before) in [(16, false), (256, false), (16, true)] {
        let mut config = EngineConfig::for_model(128, 64);
        config.max_num_batched_tokens = budget;
        let mut engine = Engine::new(CpuBackend::with_threads(1), model(&backend), config).unwrap();
        if cached_before {
            let id = engine.add_request(greedy(prompt.clone(), 1)).unwrap();
            while engine.has_unfinished() {
                engine.step().unwrap();
            }
            assert!(engine.kv_manager().pool().num_cached_blocks() >= 6, "{id}");
        }
        // A short request runs first; the long echo request arrives behind it.
        let short = engine.add_request(greedy(vec![5, 6, 7, 8, 9], 6)).unwrap();
        let echo = engine
            .add_request(GenerationRequest {
                prompt_logprobs: Some(3),
                ..greedy(prompt.clone(), 2)
            })
            .unwrap();
        let (mut step, mut short_done, mut echo_logprobs, mut echo_first_token) =
            (0, None, None, None);
        let mut echo_record = None;
        while engine.has_unfinished() {
            step += 1;
            for event in engine.step().unwrap() {
                match event {
                    EngineEvent::PromptLogprobs { id, logprobs } => {
                        assert_eq!(id, echo);
                        assert!(echo_logprobs.is_none(), "delivered twice");
                        echo_logprobs = Some((step, logprobs));
                    }
                    EngineEvent::Token(t) if t.id == echo => {
                        echo_first_token.get_or_insert(step);
                    }
                    EngineEvent::Finished(r) if r.id == short => short_done = Some(step),
                    EngineEvent::Finished(r) if r.id == echo => echo_record = Some(r),
                    _ => {}
                }
            }
        }
        let (logprobs_step, logprobs) = echo_logprobs.expect("prompt logprobs delivered");
        assert_eq!(logprobs, expected, "budget {budget}");
        assert!(logprobs_step <= echo_first_token.unwrap());
        if budget == 16 {
            // The prefill of 100 tokens takes 7 steps of 15 or 16: the short request's 6 tokens
            // all come out meanwhile.
            assert!(
                short_done.unwrap() < logprobs_step,
                "short done at step {short_done:?}, echo logprobs at {logprobs_step}"
            );
        }
        // Every prompt row was computed: no prefix-cache hit for the echo request.
        let record = echo_record.unwrap();
        assert_eq!(record.usage.cached_tokens, 0);
        check_against_recompute(&backend, &reference_model, &record);
        assert_eq!(engine.kv_manager().num_used_blocks(), 0);
    }

    // Through the handle: the event comes first on the request's own channel.
    let handle = EngineHandle::spawn(|| {
        let backend = CpuBackend::with_threads(1);
        let model = model(&backend);
        Engine::new(backend, model, EngineConfig::for_model(128, 64))
    })
    .unwrap();
    let request = GenerationRequest {
        prompt_logprobs: Some(3),
        ..greedy(prompt.clone(), 2)
    };
    let (_, events) = handle.submit(request).unwrap();
    let events: Vec<RequestEvent> = events.iter().collect();
    assert_eq!(events[0], RequestEvent::PromptLogprobs(expected));
    assert!(matches!(events[1], RequestEvent::Token(_)));
    assert!(matches!(events.last(), Some(RequestEvent::Finished(_))));
}
