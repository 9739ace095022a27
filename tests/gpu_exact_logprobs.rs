//! Exact on-policy logprobs end to end (issue 25): tokens sampled by the engine on the CUDA
//! backend (temperature 1, requests of different lengths batched together, prompts sharing a
//! cached prefix, chunked prefill, CUDA graphs on and off, decode across the 512-key attention
//! segments) and the trainer's logprobs of the same tokens are the same f32 bits: `score`'s
//! forward (packed with other sequences) and the fused RFT/DAPO loss's forward (`train_logprobs`,
//! DAPO's `logp_old`).
//!
//! The model is written here (bf16, GQA 4:1, YaRN factor 4 over 1024 positions, shapes no
//! fixture has). A mismatch names the request, the token and both values.
//!
//! The GPU tests need a CUDA GPU: run them through scripts/gpu-pack.sh; without one they fail,
//! never pass (or a SWERVE_EMU=1 build runs them on the emulated device).

mod common;

use common::gpu::gpu;
use std::path::Path;
use swerve::backend::cuda::CudaBackend;
use swerve::config::{ModelConfig, RopeConfig, RopeScaling, YarnConfig};
use swerve::engine::{
    Engine, EngineConfig, EngineEvent, FinalRecord, GenerationRequest, SamplingParams,
};
use swerve::model::{synthetic, PackedBatch, Qwen2Model};
use swerve::train::score::score_sequences;

const VOCAB: usize = 384;

fn config() -> ModelConfig {
    ModelConfig {
        hidden_size: 128,
        intermediate_size: 320,
        num_hidden_layers: 2,
        num_attention_heads: 4,
        num_key_value_heads: 1,
        head_dim: 32,
        vocab_size: VOCAB,
        max_position_embeddings: 4096,
        rms_norm_eps: 1e-6,
        tie_word_embeddings: false,
        rope: RopeConfig {
            theta: 1_000_000.0,
            scaling: RopeScaling::Yarn(YarnConfig {
                factor: 4.0,
                original_max_position_embeddings: 1024,
                beta_fast: 32.0,
                beta_slow: 1.0,
                attention_factor: 0.1 * 4f64.ln() + 1.0,
                truncate: true,
            }),
        },
    }
}

/// Prompts: three share a 600-token prefix (prefix-cache hits once the first is in), one is
/// 1000 tokens long (its decode crosses key 1024), the others short.
fn prompts() -> Vec<Vec<u32>> {
    let prefix = common::tokens(7, 600, VOCAB as u64);
    let mut prompts = Vec::new();
    for (i, tail) in [5usize, 40, 130].into_iter().enumerate() {
        let mut p = prefix.clone();
        p.extend(common::tokens(100 + i as u64, tail, VOCAB as u64));
        prompts.push(p);
    }
    prompts.push(common::tokens(8, 1000, VOCAB as u64));
    for (i, len) in [3usize, 17, 70].into_iter().enumerate() {
        prompts.push(common::tokens(200 + i as u64, len, VOCAB as u64));
    }
    prompts
}

/// Samples every prompt at temperature 1 (seeded per request), all in one engine, chunked
/// prefill of at most `chunk` tokens per step. Requests arrive in two waves so that the first
/// wave's shared prefix is cached when the second is prefilled.
fn sample(dir: &Path, cuda_graphs: bool, chunk: usize) -> Vec<FinalRecord> {
    let backend = gpu();
    let model = Qwen2Model::load(&backend, dir).unwrap();
    let mut config = EngineConfig::for_model(1200, 256);
    config.cuda_graphs = cuda_graphs;
    config.max_num_batched_tokens = chunk;
    let mut engine = Engine::new(backend, model, config).unwrap();
    let prompts = prompts();
    let mut records = Vec::new();
    let add = |engine: &mut Engine<CudaBackend>, i: usize| {
        engine
            .add_request(GenerationRequest {
                prompt: prompts[i].clone(),
                params: SamplingParams {
                    temperature: 1.0,
                    seed: Some(1000 + i as u64),
                    ..SamplingParams::default()
                },
                max_tokens: 40,
                stop_ids: vec![],
                prompt_logprobs: None,
            })
            .unwrap();
    };
    for i in [0, 3, 4] {
        add(&mut engine, i);
    }
    let mut second_wave = true;
    while engine.has_unfinished() {
        for event in engine.step().unwrap() {
            if let EngineEvent::Finished(r) = event {
                records.push(r);
            }
        }
        if second_wave && engine.stats().steps >= 3 {
            second_wave = false;
            for i in [1, 2, 5, 6] {
                add(&mut engine, i);
            }
        }
    }
    let stats = engine.stats();
    if cuda_graphs {
        assert!(stats.graph_steps > 0, "no step went through a graph");
    }
    assert!(stats.prefix_hit_tokens > 0, "no prefix-cache hit");
    records.sort_by_key(|r| r.id);
    assert_eq!(records.len(), 7);
    records
}

fn full_sequence(r: &FinalRecord) -> Vec<u32> {
    let mut s = r.prompt_tokens.clone();
    s.extend(&r.output_tokens);
    s
}

/// Asserts the rollout's logprobs equal `trainer`'s (the logprob of token t at index t of the
/// whole sequence) bit for bit.
fn assert_same_bits(what: &str, r: &FinalRecord, trainer: &[f32]) {
    let p = r.prompt_tokens.len();
    for (i, &lp) in r.logprobs.iter().enumerate() {
        let t = trainer[p + i];
        assert_eq!(
            lp.to_bits(),
            t.to_bits(),
            "{what}: request {} output token {i} (position {}): rollout {lp:e}, trainer {t:e}",
            r.id,
            p + i
        );
    }
}

#[test]
#[cfg_attr(
    not(swerve_emu),
    ignore = "needs a CUDA GPU (or a SWERVE_EMU=1 build: the emulated device)"
)]
fn sampled_logprobs_equal_the_trainers_bit_for_bit() {
    let dir = tempfile::tempdir().unwrap();
    synthetic::write_model_dir(&config(), 0xE8AC7, dir.path()).unwrap();
    let backend = gpu();
    let model = Qwen2Model::load(&backend, dir.path()).unwrap();
    for (cuda_graphs, chunk) in [(false, 256), (true, 96)] {
        let records = sample(dir.path(), cuda_graphs, chunk);
        let what = format!("graphs {cuda_graphs}, chunks of {chunk}");
        // `score`: all sequences packed into batches of up to 2048 tokens.
        let sequences: Vec<Vec<u32>> = records.iter().map(full_sequence).collect();
        let mut scored = vec![Vec::new(); sequences.len()];
        score_sequences(&backend, &model, &sequences, 2048, |i, lps| {
            scored[i] = lps.into_iter().map(|x| x.unwrap_or(f32::NAN)).collect();
            Ok(())
        })
        .unwrap();
        for (r, lps) in records.iter().zip(&scored) {
            assert_same_bits(&format!("score ({what})"), r, lps);
        }
        // The fused loss's forward (`train_logprobs`: DAPO's logp_old), two sequences packed.
        for pair in records.chunks(2) {
            let seqs: Vec<Vec<u32>> = pair.iter().map(full_sequence).collect();
            let mut targets = Vec::new();
            for s in &seqs {
                targets.extend(&s[1..]);
                targets.push(0);
            }
            let rows = model
                .train_logprobs(&backend, &PackedBatch::from_sequences(&seqs), &targets)
                .unwrap();
            let mut start = 0;
            for (r, s) in pair.iter().zip(&seqs) {
                // Row t predicts token t + 1: shift to index by the predicted token.
                let mut by_token = vec![f32::NAN];
                by_token.extend(&rows[start..start + s.len() - 1]);
                assert_same_bits(&format!("train_logprobs ({what})"), r, &by_token);
                start += s.len();
            }
        }
    }
}

/// Samples every prompt through a tensor-parallel engine (`launch_engine`, as `swerve-serve` and
/// `rl` start it: NCCL between the ranks, chunked prefill, the prefix cache; decode runs eagerly
/// at TP > 1), all requests at once.
fn sample_tensor_parallel(dir: &Path, tp: usize) -> Vec<FinalRecord> {
    use swerve::backend::DeviceChoice;
    use swerve::engine::launch::{launch_engine, EngineLaunch};
    use swerve::engine::RequestEvent;
    let engine = launch_engine(&EngineLaunch {
        model: dir.to_path_buf(),
        device: DeviceChoice::Cuda,
        max_model_len: 1200,
        kv_cache_fraction: 0.5,
        num_kv_blocks: Some(400),
        max_num_seqs: 16,
        max_num_batched_tokens: 128,
        seed: 0,
        tensor_parallel: tp,
    })
    .unwrap();
    let receivers: Vec<_> = prompts()
        .into_iter()
        .enumerate()
        .map(|(i, prompt)| {
            let request = GenerationRequest {
                prompt,
                params: SamplingParams {
                    temperature: 1.0,
                    seed: Some(2000 + i as u64),
                    ..SamplingParams::default()
                },
                max_tokens: 24,
                stop_ids: vec![],
                prompt_logprobs: None,
            };
            engine.submit(request).unwrap().1
        })
        .collect();
    let records = receivers
        .into_iter()
        .map(|events| {
            events
                .iter()
                .find_map(|e| match e {
                    RequestEvent::Finished(r) => Some(r),
                    _ => None,
                })
                .expect("a finished record")
        })
        .collect();
    engine.shutdown();
    records
}

/// One trainer rank's logprobs of every sequence: `score`'s, then the fused loss's.
type RankLogprobs = (Vec<Vec<f32>>, Vec<Vec<f32>>);

/// The trainer split the same way: `tp` ranks (threads, NCCL), each scoring every sequence with
/// `score`'s forward and the fused loss's forward; rank 0's rows (every rank's are checked equal).
fn trainer_tensor_parallel(
    dir: &Path,
    tp: usize,
    sequences: &[Vec<u32>],
) -> (Vec<Vec<f32>>, Vec<Vec<f32>>) {
    use swerve::dist::grid::RankComm;
    use swerve::dist::local::LocalGroup;
    let ranks: Vec<RankLogprobs> = std::thread::scope(|s| {
        let handles: Vec<_> = LocalGroup::new(tp)
            .into_iter()
            .enumerate()
            .map(|(rank, local)| {
                s.spawn(move || {
                    let emulated = swerve::backend::cuda::is_emulated();
                    let backend = CudaBackend::open(if emulated { 0 } else { rank }).unwrap();
                    let comm = backend.rank_comm(local).unwrap();
                    let model = Qwen2Model::load_shard(&backend, dir, comm).unwrap();
                    let mut scored = vec![Vec::new(); sequences.len()];
                    score_sequences(&backend, &model, sequences, 2048, |i, lps| {
                        scored[i] = lps.into_iter().map(|x| x.unwrap_or(f32::NAN)).collect();
                        Ok(())
                    })
                    .unwrap();
                    let fused = sequences
                        .iter()
                        .map(|s| {
                            let mut targets = s[1..].to_vec();
                            targets.push(0);
                            let rows = model
                                .train_logprobs(
                                    &backend,
                                    &PackedBatch::from_sequences(std::slice::from_ref(s)),
                                    &targets,
                                )
                                .unwrap();
                            let mut by_token = vec![f32::NAN];
                            by_token.extend(&rows[..s.len() - 1]);
                            by_token
                        })
                        .collect();
                    (scored, fused)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (rank, r) in ranks.iter().enumerate() {
        let same = |a: &Vec<Vec<f32>>, b: &Vec<Vec<f32>>| {
            a.iter()
                .flatten()
                .map(|x| x.to_bits())
                .eq(b.iter().flatten().map(|x| x.to_bits()))
        };
        assert!(
            same(&r.0, &ranks[0].0) && same(&r.1, &ranks[0].1),
            "rank {rank}'s logprobs differ from rank 0's"
        );
    }
    ranks.into_iter().next().unwrap()
}

#[test]
#[cfg_attr(
    not(swerve_emu),
    ignore = "needs a CUDA GPU (or a SWERVE_EMU=1 build: the emulated device)"
)]
fn tensor_parallel_sampling_equals_the_tensor_parallel_trainer_bit_for_bit() {
    let dir = tempfile::tempdir().unwrap();
    synthetic::write_model_dir(&config(), 0x7E4, dir.path()).unwrap();
    let devices = gpu().device_count().unwrap();
    for tp in [2, 4] {
        if !swerve::backend::cuda::is_emulated() && devices < tp {
            println!("{devices} GPU(s): TP {tp} needs one a rank (NCCL); not run here");
            continue;
        }
        let records = sample_tensor_parallel(dir.path(), tp);
        let sequences: Vec<Vec<u32>> = records.iter().map(full_sequence).collect();
        let (scored, fused) = trainer_tensor_parallel(dir.path(), tp, &sequences);
        for ((r, s), f) in records.iter().zip(&scored).zip(&fused) {
            assert_same_bits(&format!("score at TP {tp}"), r, s);
            assert_same_bits(&format!("train_logprobs at TP {tp}"), r, f);
        }
    }
}
