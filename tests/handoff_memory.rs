//! The RL loop's weight handoff and the trainer's memory around the rollouts, measured on the
//! CPU backend with a counting global allocator (every thread of the process counts: learner
//! ranks, engine ranks, this one):
//!
//! - a TP 4 learner group hands its trained weights to a TP 4 engine as `rl`'s handoff does
//!   (no device spans on the CPU: each rank's shard streamed one tensor at a time): the host's
//!   allocation peak over the handoff stays under one rank's shard in bf16, where the old
//!   whole-model gather, measured in the same test as the meter's own check, peaks at more than
//!   the whole model in f32; the engine then generates exactly (tokens and logprobs) as an
//!   engine given the gathered whole weights;
//! - `release_gradients` gives every TP 4 rank's gradients back, and with the optimizer state
//!   offloaded (`--offload-optimizer`) a run's losses, gradient norms, weights and checkpoint are
//!   bit for bit those without.
//!
//! The model: hidden 512, 4 layers, 8 heads over 4 KV heads of 64, MLP 2048, vocabulary 2048,
//! untied: 17,834,496 parameters (71.3 MB in f32). A TP 4 rank holds 4,462,080 of them (2 query
//! heads, 1 KV head, 512 MLP columns, 512 vocabulary rows): 8.9 MB in bf16, 17.8 MB in f32; its
//! largest tensor (gate, up, down, embedding or LM head rows: 262,144 values) is 1 MB in f32.

#[path = "common/counting_alloc.rs"]
mod counting_alloc;
#[path = "common/rft_sequences.rs"]
mod rft_sequences;
use rft_sequences::rft_sequences;

use counting_alloc::{current, peak, reset_peak, Counting, MEASURING};
use std::path::Path;
use std::sync::mpsc::Receiver;
use swerve::backend::DeviceChoice;
use swerve::bench::plan::local_parameters;
use swerve::config::{ModelConfig, RopeConfig, RopeScaling};
use swerve::dist::launch::ProcessGroupEnv;
use swerve::engine::launch::{launch_engine, EngineLaunch};
use swerve::engine::{EngineHandle, FinalRecord, GenerationRequest, RequestEvent, SamplingParams};
use swerve::model::synthetic;
use swerve::train::data::TrainSequence;
use swerve::train::group::{LearnerGroup, LearnerSpec, Trainer};
use swerve::train::learner::Learner;
use swerve::train::loss::Objective;
use swerve::train::optimizer::AdamWConfig;

#[global_allocator]
static ALLOCATOR: Counting = Counting;

const TP: usize = 4;

fn config() -> ModelConfig {
    let config = ModelConfig {
        hidden_size: 512,
        intermediate_size: 2048,
        num_hidden_layers: 4,
        num_attention_heads: 8,
        num_key_value_heads: 4,
        head_dim: 64,
        vocab_size: 2048,
        max_position_embeddings: 4096,
        rms_norm_eps: 1e-6,
        tie_word_embeddings: false,
        rope: RopeConfig {
            theta: 1e6,
            scaling: RopeScaling::None,
        },
    };
    config.validate().unwrap();
    config
}

/// Four RFT sequences of 48 random tokens, the second half of each the action.
fn sequences(vocab: usize, seed: u64) -> Vec<TrainSequence> {
    rft_sequences(vocab, seed, 4, 48)
}

fn spec(dir: &Path, offload_optimizer: bool) -> LearnerSpec {
    LearnerSpec {
        model_dir: dir.to_path_buf(),
        adamw: AdamWConfig::default(),
        micro_batch_tokens: 4096,
        checkpoint_layers: true,
        offload_optimizer,
    }
}

fn learner_group(dir: &Path, offload_optimizer: bool) -> LearnerGroup {
    let process = ProcessGroupEnv::single();
    LearnerGroup::start(DeviceChoice::Cpu, TP, process, spec(dir, offload_optimizer)).unwrap()
}

/// One optimizer step over [`sequences`] at a learning rate that moves every weight visibly.
fn train_step<T: Trainer>(learner: &mut T, seed: u64) -> (f64, f64) {
    let set = sequences(config().vocab_size, seed);
    let batch: Vec<&TrainSequence> = set.iter().collect();
    let olds: Vec<&[f32]> = vec![&[]; batch.len()];
    let report = learner
        .step(&batch, &olds, &Objective::MaskedCe, 1e-2)
        .unwrap();
    assert!(!report.skipped);
    let grad_norm = report.metrics["grad_norm"].as_f64().unwrap();
    (report.loss, grad_norm)
}

fn engine(dir: &Path) -> EngineHandle {
    launch_engine(&EngineLaunch {
        model: dir.to_path_buf(),
        device: DeviceChoice::Cpu,
        max_model_len: 128,
        kv_cache_fraction: 0.9,
        num_kv_blocks: Some(32),
        max_num_seqs: 4,
        max_num_batched_tokens: 64,
        seed: 5,
        tensor_parallel: TP,
    })
    .unwrap()
}

/// A greedy and a seeded temperature-1 completion of two prompts.
fn generate(engine: &EngineHandle) -> Vec<FinalRecord> {
    let mut records = Vec::new();
    for (i, prompt) in [vec![1u32, 17, 300, 42, 9], vec![2000, 5, 5, 77]]
        .into_iter()
        .enumerate()
    {
        for params in [
            SamplingParams::greedy(),
            SamplingParams {
                seed: Some(11 + i as u64),
                ..SamplingParams::default()
            },
        ] {
            let request = GenerationRequest {
                prompt: prompt.clone(),
                params,
                max_tokens: 12,
                stop_ids: vec![],
                prompt_logprobs: None,
            };
            let (_, events) = engine.submit(request).unwrap();
            records.push(finished(events));
        }
    }
    records
}

fn finished(events: Receiver<RequestEvent>) -> FinalRecord {
    loop {
        if let RequestEvent::Finished(record) = events.recv().unwrap() {
            return record;
        }
    }
}

/// What two engines' generations must share: tokens and logprobs, bit for bit.
fn outputs(records: &[FinalRecord]) -> Vec<(Vec<u32>, Vec<u32>)> {
    records
        .iter()
        .map(|r| {
            let bits = r.logprobs.iter().map(|l| l.to_bits()).collect();
            (r.output_tokens.clone(), bits)
        })
        .collect()
}

/// (the allocation peak above the bytes live before, the bytes live after minus before) of `f`.
fn measure<R>(f: impl FnOnce() -> R) -> (usize, isize, R) {
    let before = current();
    reset_peak();
    let result = f();
    let after = current();
    (peak() - before, after as isize - before as isize, result)
}

fn mb(bytes: usize) -> f64 {
    bytes as f64 / 1e6
}

#[test]
fn a_tp4_handoff_holds_under_one_shard_in_host_memory_and_the_engine_computes_the_trainers_weights()
{
    let _one = MEASURING.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let config = config();
    synthetic::write_model_dir(&config, 3, dir.path()).unwrap();
    let largest_shard = (0..TP)
        .map(|r| local_parameters(&config, &config.shard(TP, r).unwrap()))
        .max()
        .unwrap();
    assert_eq!(largest_shard, 4_462_080);
    let shard_bf16 = 2 * largest_shard;
    let whole_f32 = 4 * config.num_parameters();

    let mut group = learner_group(dir.path(), false);
    train_step(&mut group, 1);
    let streamed = engine(dir.path());
    let base = outputs(&generate(&streamed));

    // rl's handoff on a host backend (`rl::iteration::handoff`): no device spans, so each rank's
    // shard goes over one tensor at a time.
    assert!(group.compute_weight_spans().unwrap().is_none());
    let (handoff_peak, handoff_left, version) = measure(|| {
        streamed
            .update_weights_streamed(|out| group.send_compute_weights(out))
            .unwrap()
    });
    assert_eq!(version, 1);

    // The old way: the whole model gathered in f32 on the host, then sliced again per rank.
    let gathered = engine(dir.path());
    let (gather_peak, _, version) = measure(|| {
        let whole = group.gather_compute_weights().unwrap();
        gathered.update_weights_from(whole).unwrap()
    });
    assert_eq!(version, 1);
    eprintln!(
        "TP {TP} handoff on the CPU: host peak {:.2} MB streamed ({handoff_left:+} bytes left \
         after), {:.2} MB through the whole-model gather; one shard is {:.2} MB in bf16, the \
         whole model {:.2} MB in f32",
        mb(handoff_peak),
        mb(gather_peak),
        mb(shard_bf16),
        mb(whole_f32)
    );
    assert!(
        handoff_peak <= shard_bf16,
        "the streamed handoff peaked at {handoff_peak} bytes, over one shard in bf16 ({shard_bf16})"
    );
    // Nothing stays behind (a few bytes of channel bookkeeping at most).
    assert!(handoff_left.abs() < 64 * 1024, "{handoff_left}");
    // The meter sees a whole-model copy where there is one.
    assert!(
        gather_peak > whole_f32,
        "the gather peaked at {gather_peak} bytes"
    );

    let handed = outputs(&generate(&streamed));
    assert_eq!(handed, outputs(&generate(&gathered)));
    assert_ne!(handed, base, "the handoff changed nothing");
}

#[test]
fn gradients_are_given_back_at_tp4_and_offloading_the_optimizer_changes_no_result() {
    let _one = MEASURING.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let config = config();
    synthetic::write_model_dir(&config, 4, dir.path()).unwrap();
    // Every rank's f32 gradients (norms held whole on every rank).
    let gradient_bytes: usize = (0..TP)
        .map(|r| 4 * local_parameters(&config, &config.shard(TP, r).unwrap()))
        .sum();
    let mut runs = Vec::new();
    for offload in [false, true] {
        let mut group = learner_group(dir.path(), offload);
        let first = train_step(&mut group, 1);
        let (_, freed, ()) = measure(|| group.release_training_memory().unwrap());
        let freed = -freed;
        eprintln!(
            "offload {offload}: release_gradients gave back {:.2} MB; the gradients are {:.2} MB",
            mb(freed as usize),
            mb(gradient_bytes)
        );
        // On the CPU an offloaded state moves from host memory to host memory: only the
        // gradients are freed, whichever the flag.
        let slack = gradient_bytes / 100;
        assert!(
            (freed as usize).abs_diff(gradient_bytes) <= slack,
            "offload {offload}: {freed} bytes freed for {gradient_bytes} of gradients"
        );
        // The next steps allocate the gradients again and bring the optimizer state back.
        let second = train_step(&mut group, 2);
        group.release_training_memory().unwrap();
        let third = train_step(&mut group, 3);
        let weights = group.gather_compute_weights().unwrap();
        let bits: Vec<Vec<u8>> = weights.iter().map(|t| t.bytes.to_vec()).collect();
        runs.push(([first, second, third], bits));
    }
    assert_eq!(runs[0].0, runs[1].0, "losses and gradient norms");
    assert!(runs[0].1 == runs[1].1, "the weights differ with offload");
}

#[test]
fn a_checkpoint_saved_while_the_optimizer_state_is_offloaded_is_the_same() {
    let _one = MEASURING.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let config = config();
    synthetic::write_model_dir(&config, 5, dir.path()).unwrap();
    let backend = swerve::backend::cpu::CpuBackend::with_threads(2);
    let out = tempfile::tempdir().unwrap();
    let mut files = Vec::new();
    for offload in [false, true] {
        let mut learner =
            Learner::new(&backend, dir.path(), AdamWConfig::default(), 4096, true).unwrap();
        learner.offload_optimizer = offload;
        train_step(&mut learner, 1);
        Trainer::release_training_memory(&mut learner).unwrap();
        assert_eq!(learner.optimizer_state_offloaded(), offload);
        let saved = out.path().join(format!("offload-{offload}"));
        let state = serde_json::json!({"updates": learner.updates()});
        learner.save(dir.path(), &saved, &state).unwrap();
        // A restore brings the state back from the file, offloaded or not.
        learner.restore(&saved).unwrap();
        assert!(!learner.optimizer_state_offloaded());
        let after = train_step(&mut learner, 2);
        let read = |name: &str| std::fs::read(saved.join(name)).unwrap();
        files.push((
            read("optimizer.safetensors"),
            read("model.safetensors"),
            after,
        ));
    }
    assert!(files[0].0 == files[1].0, "the optimizer files differ");
    assert!(files[0].1 == files[1].1, "the model files differ");
    assert_eq!(files[0].2, files[1].2);
}
