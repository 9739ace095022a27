//! The memory plan (`swerve::bench::plan`) against what the CPU backend really allocates: a
//! counting global allocator measures the process's peak bytes around one `Learner::step` (at
//! TP 1, and at TP 2 with both ranks as threads of this process, against the sum of the ranks'
//! plans) and the KV cache an `Engine` allocates, against the plan's figures for f32 elements.
//! The step's prediction must be within 10% of the measurement; the resident state and the KV
//! cache are checked more tightly, since nothing transient blurs them. The plan counts what the
//! code allocates (measured here within 0.05%): when an allocation changes (the recompute's
//! second buffer set goes, say, 13% of the TP 1 step), this fails until the plan says the same.
//!
//! What the plan adds to the model's own tensors on the CPU, and the measurement sees: the
//! step's per-token host arrays (77 bytes a token) and, at TP 2, the host-staged collectives'
//! copies (`host_reduce_scatter`); nothing else is a fixed overhead (the baseline is taken after
//! the data exists).

#[path = "common/counting_alloc.rs"]
mod counting_alloc;
#[path = "common/rft_sequences.rs"]
mod rft_sequences;
use rft_sequences::rft_sequences;

use counting_alloc::{current, peak, reset_peak, Counting, MEASURING};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use swerve::backend::cpu::CpuBackend;
use swerve::bench::plan::{
    kv_cache_bytes, kv_tokens_that_fit, rollout_plan, training_plan, zero_share, ColocatedTrainer,
    RolloutSetup, Target, TrainingSetup,
};
use swerve::config::{ModelConfig, RopeConfig, RopeScaling};
use swerve::dist::local::LocalGroup;
use swerve::engine::{Engine, EngineConfig, GenerationRequest, SamplingParams};
use swerve::model::{synthetic, PagedKv, Qwen2Model};
use swerve::train::data::TrainSequence;
use swerve::train::learner::{Groups, Learner};
use swerve::train::loss::Objective;
use swerve::train::optimizer::AdamWConfig;

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Big enough that the model's memory dominates every fixed overhead (8.1 M parameters: 32 MB
/// of f32 weights, 162 MB with gradients, masters and moments), with activations a large part of
/// the step too: hidden 256, 4 layers, 4 heads over 2 KV heads, MLP 1024, vocabulary 8192.
fn config() -> ModelConfig {
    let config = ModelConfig {
        hidden_size: 256,
        intermediate_size: 1024,
        num_hidden_layers: 4,
        num_attention_heads: 4,
        num_key_value_heads: 2,
        head_dim: 64,
        vocab_size: 8192,
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

/// Packed tokens of the step: one micro-batch of 4 sequences of 512.
const TOKENS: usize = 2048;

/// The step's batch: 4 sequences of 512 (seeded).
fn sequences(vocab: usize) -> Vec<TrainSequence> {
    rft_sequences(vocab, 11, 4, TOKENS / 4)
}

/// (measured resident bytes after `Learner::new_in`, measured peak of the step), both over the
/// baseline before any learner existed, for every rank of TP `tp` as threads of this process.
fn measure_step(dir: &Path, tp: usize) -> (usize, usize) {
    let config = ModelConfig::from_dir(dir).unwrap();
    let set = sequences(config.vocab_size);
    let ranks = LocalGroup::grid(1, tp);
    let built = Barrier::new(tp);
    let measured = Barrier::new(tp);
    let after_new = AtomicUsize::new(0);
    let baseline = current();
    std::thread::scope(|s| {
        for rank in ranks {
            let (set, built, measured, after_new) = (&set, &built, &measured, &after_new);
            s.spawn(move || {
                let backend = CpuBackend::with_threads(if tp == 1 { 2 } else { 1 });
                let groups = Groups::<CpuBackend> {
                    tp: Arc::new(rank.tp),
                    dp: Arc::new(rank.dp),
                };
                let mut learner =
                    Learner::new_in(&backend, dir, AdamWConfig::default(), TOKENS, true, &groups)
                        .unwrap();
                let members: Vec<&TrainSequence> = set.iter().collect();
                let old: Vec<&[f32]> = vec![&[]; members.len()];
                // Every rank built: the resident state is measured, the peak starts from it.
                if built.wait().is_leader() {
                    after_new.store(current() - baseline, Ordering::SeqCst);
                    reset_peak();
                }
                measured.wait();
                let report = learner
                    .step(&members, &old, &Objective::MaskedCe, 1e-3)
                    .unwrap();
                assert!(!report.skipped);
            });
        }
    });
    (after_new.load(Ordering::SeqCst), peak() - baseline)
}

fn check_step(tp: usize) {
    let _one = MEASURING.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let config = config();
    synthetic::write_model_dir(&config, 7, dir.path()).unwrap();
    let setup = TrainingSetup {
        tp,
        dp: 1,
        tokens: TOKENS,
        colocated_engine: false,
    };
    let plans: Vec<_> = (0..tp)
        .map(|rank| training_plan(&config, &setup, &Target::cpu(), rank).unwrap())
        .collect();
    let resident: u64 = plans.iter().map(|p| p.resident_bytes()).sum();
    let predicted: u64 = plans.iter().map(|p| p.peak().1).sum();
    let (after_new, step_peak) = measure_step(dir.path(), tp);
    let mb = |b: f64| b / 1e6;
    let (resident_error, step_error) = (
        after_new as f64 / resident as f64 - 1.0,
        step_peak as f64 / predicted as f64 - 1.0,
    );
    eprintln!(
        "TP {tp}: resident {:.2} MB measured / {:.2} MB planned ({:+.2}%); step peak {:.2} MB \
         measured / {:.2} MB planned ({:+.2}%), peak phase {}",
        mb(after_new as f64),
        mb(resident as f64),
        100.0 * resident_error,
        mb(step_peak as f64),
        mb(predicted as f64),
        100.0 * step_error,
        plans[0].peak().0.name
    );
    assert!(
        resident_error.abs() <= 0.01,
        "TP {tp}: resident state off by {:.2}%",
        100.0 * resident_error
    );
    assert!(
        step_error.abs() <= 0.10,
        "TP {tp}: step peak off by {:.2}%",
        100.0 * step_error
    );
}

#[test]
fn one_training_step_at_tp1_peaks_where_the_plan_says() {
    check_step(1);
}

#[test]
fn one_training_step_at_tp2_peaks_at_the_sum_of_the_ranks_plans() {
    check_step(2);
}

#[test]
fn the_engine_allocates_the_plans_kv_cache() {
    let _one = MEASURING.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let config = config();
    synthetic::write_model_dir(&config, 7, dir.path()).unwrap();
    let backend = CpuBackend::with_threads(1);
    let model = Qwen2Model::load(&backend, dir.path()).unwrap();
    let local = model.local;
    let num_blocks = 1000;
    let before = current();
    let engine = Engine::new(backend, model, EngineConfig::for_model(4096, num_blocks)).unwrap();
    let allocated = current() - before;
    let planned = kv_cache_bytes(&config, &local, num_blocks, 16, 4);
    let error = allocated as f64 / planned as f64 - 1.0;
    eprintln!(
        "engine of {num_blocks} blocks: {allocated} bytes allocated, {planned} planned ({:+.3}%)",
        100.0 * error
    );
    // The block pool's and scheduler's bookkeeping is the rest.
    assert!(
        (0.0..=0.01).contains(&error),
        "KV cache off by {:.3}%",
        100.0 * error
    );
    drop(engine);
}

#[test]
fn an_engine_prefill_step_peaks_where_the_plan_says() {
    let _one = MEASURING.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let config = config();
    synthetic::write_model_dir(&config, 7, dir.path()).unwrap();
    let backend = CpuBackend::with_threads(2);
    let model = Qwen2Model::load(&backend, dir.path()).unwrap();
    let rows = 1023;
    let mut engine_config = EngineConfig::for_model(4096, 100);
    engine_config.max_num_batched_tokens = rows;
    let mut engine = Engine::new(backend, model, engine_config).unwrap();
    let prompt: Vec<u32> = (0..rows as u32).map(|i| (i * 7919) % 8192).collect();
    engine
        .add_request(GenerationRequest {
            prompt,
            params: SamplingParams::greedy(),
            max_tokens: 1,
            stop_ids: vec![],
            prompt_logprobs: None,
        })
        .unwrap();
    let before = current();
    reset_peak();
    engine.step().unwrap();
    let measured = peak() - before;
    let setup = RolloutSetup {
        tp: 1,
        dp: 1,
        sequences: 1,
        context: rows + 1,
        step_tokens: rows,
        max_num_seqs: 256,
        block_size: 16,
        colocated_trainer: ColocatedTrainer::Absent,
    };
    let planned = rollout_plan(&config, &setup, &Target::cpu(), 0)
        .unwrap()
        .peak_transient();
    let error = measured as f64 / planned as f64 - 1.0;
    eprintln!(
        "prefill step of {rows} rows: peak {measured} bytes over the engine, {planned} planned ({:+.2}%)",
        100.0 * error
    );
    assert!(
        error.abs() <= 0.10,
        "prefill step off by {:.2}%",
        100.0 * error
    );
}

/// Qwen2.5-72B (`qwen2.5-72b-yarn4`) in the RL loop on 16 nodes x 8 H200 (TP 8 x DP 16, 140 GiB
/// = 150,323,855,360 bytes a card; 10 rollouts at the full context, steps of 8,192 rows; a
/// 1 GiB reserve): the KV cache rank 0's rollouts hold beside the rest, by what the colocated
/// trainer keeps while they run (`swerve-bench plan --gpus 128 --gpu-memory 140` prints it).
/// By hand:
///
/// - Rank 0's shard (8 of 64 heads, 1 of 8 KV heads, 3,696 of 29,568 MLP columns, 19,008 of
///   152,064 vocabulary rows, d = 8,192): a layer holds q 1,024 x d + 1,024, k and v
///   128 x d + 128 each, o d x 1,024, two norms 2d, gate/up/down 3 x 3,696 x d = 109,724,928;
///   80 layers 8,777,994,240, embedding and LM head rows 2 x 19,008 x d = 311,427,072, final
///   norm 8,192: P = 9,089,429,504 parameters.
/// - The trainer's f32 gradients: 4P = 36,357,718,016 bytes.
/// - Its masters + 2 moments: 12 bytes a parameter of the largest ZeRO-1 share. Dealt largest
///   tensor first to the least loaded of 16 replicas, replica 2 ends with 16 MLP matrices
///   (3,696 x d = 30,277,632), 9 q/o matrices (1,024 x d = 8,388,608) and 8 k/v matrices
///   (128 x d = 1,048,576): S = 568,328,192, 12S = 6,819,938,304 bytes.
/// - Always there: both copies of the bf16 weights 2 x 2P = 36,357,718,016; the engine step's
///   bf16 activations at T = 8,192 rows (residual, delta, hidden states and two norm outputs
///   5 [T, d]; q and attention out 2 [T, 8 x 128]; k, v 2 [T, 128]; gate, up, act
///   3 [T, 3,696]) 890,503,168 and its 10 sampled rows (10 x d bf16 + 10 x (19,008 + 152,064)
///   f32 logits) 7,006,720; two cuBLASLt workspaces 2 x 32 MiB = 67,108,864; the reserve
///   1,073,741,824; the decode graph's buffers 17,177,088 (batch 16 with its split-KV scratch,
///   read from the plan). Together 38,413,255,680 bytes.
/// - KV: 2 (K, V) x 80 layers x 1 KV head x 128 x 2 bytes = 40,960 bytes a token, 655,360 a
///   16-token block; tokens = (floor(room / 655,360) - 1 null block) x 16.
///
/// ```text
///  trainer keeps                    beside the KV    room              tokens     at 131,072  at 65,536
///  gradients + optimizer state      81,603,724,288    68,720,131,072   1,677,712          12         25
///  optimizer state (rl's default)   45,246,006,272   105,077,849,088   2,565,360          19         39
///  weights (--offload-optimizer)    38,426,067,968   111,897,787,392   2,731,856          20         41
/// ```
///
/// Giving the gradients back wins 887,632 tokens (7 sequences at 131,072); offloading the
/// optimizer state 166,512 more (1 sequence: with 16 replicas a rank's share is small).
#[test]
fn the_colocated_rollouts_at_72b_win_kv_cache_from_what_the_trainer_gives_back() {
    // Not measuring, but its plans are large: never beside a measurement of another test.
    let _one = MEASURING.lock().unwrap_or_else(|e| e.into_inner());
    use ColocatedTrainer::*;
    let (config, _) = synthetic::preset("qwen2.5-72b-yarn4").unwrap();
    let target = Target::cuda(132, 1 << 30);
    let capacity = 140u64 << 30;
    let local = config.shard(8, 0).unwrap();
    assert_eq!(zero_share(&config, &local, 16), 568_328_192);
    let per_token = PagedKv::<()>::bytes_per_token(&config, &local, 2) as u64;
    assert_eq!(per_token, 40_960);
    // The bytes beside the KV cache and the tokens that fit, by what the trainer keeps: the
    // split-KV scratch grows with the context (one partial per 512-key segment of a split row).
    let cases = [
        (
            131_072,
            [12, 19, 20],
            [81_603_724_288, 45_246_006_272, 38_426_067_968],
            [1_677_712, 2_565_360, 2_731_856],
        ),
        (
            65_536,
            [25, 39, 41],
            [81_595_204_608, 45_237_486_592, 38_417_548_288],
            [1_677_920, 2_565_568, 2_732_064],
        ),
    ];
    for (context, sequences_that_fit, besides, tokens_that_fit) in cases {
        let mut tokens = Vec::new();
        for (i, kept) in [KeepsEverything, GradientsReleased, OptimizerOffloaded]
            .into_iter()
            .enumerate()
        {
            let setup = RolloutSetup {
                tp: 8,
                dp: 16,
                sequences: 10,
                context,
                step_tokens: 8192,
                max_num_seqs: 256,
                block_size: 16,
                colocated_trainer: kept,
            };
            let plan = rollout_plan(&config, &setup, &target, 0).unwrap();
            let beside = plan.peak().1 - plan.resident_named("KV cache");
            let expected: u64 = besides[i];
            assert_eq!(beside, expected, "{kept:?} at {context}");
            tokens.push(kv_tokens_that_fit(&plan, capacity, per_token, 16));
        }
        assert_eq!(tokens, tokens_that_fit, "at {context}");
        let sequences: Vec<u64> = tokens.iter().map(|t| t / context as u64).collect();
        assert_eq!(sequences, sequences_that_fit, "at {context}");
    }
}
