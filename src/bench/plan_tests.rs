//! Unit tests of the memory plan's arithmetic: small cases worked by hand, and the 72B figures
//! docs/memory-plan.md quotes checked against their parts.

use super::*;
use crate::model::synthetic;

/// hidden 8, MLP 16, 2 layers, 2 heads of 4 over 1 KV head, vocabulary 32, tied: 1,480
/// parameters (embedding 256; a layer 608: norms 16, q 72, k 36, v 36, o 64, MLP 384; the
/// final norm 8).
fn small() -> ModelConfig {
    ModelConfig::from_json_str(
        r#"{"architectures": ["Qwen2ForCausalLM"], "hidden_size": 8, "intermediate_size": 16,
            "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1,
            "vocab_size": 32, "max_position_embeddings": 64, "tie_word_embeddings": true}"#,
    )
    .unwrap()
}

fn phase<'a>(plan: &'a MemoryPlan, name: &str) -> &'a Phase {
    plan.phases.iter().find(|p| p.name == name).unwrap()
}

fn setup(tp: usize, dp: usize, tokens: usize) -> TrainingSetup {
    TrainingSetup {
        tp,
        dp,
        tokens,
        colocated_engine: false,
    }
}

#[test]
fn tp1_on_the_cpu_by_hand() {
    let c = small();
    assert_eq!(c.num_parameters(), 1480);
    let plan = training_plan(&c, &setup(1, 1, 4), &Target::cpu(), 0).unwrap();
    // f32 weights, gradients, masters + 2 moments.
    assert_eq!(plan.resident_bytes(), 1480 * (4 + 4 + 12));
    // T = 4, f32: [T, d] 128 bytes, q 128, k/v 64, lse 32, [T, I] 256; one buffer set
    // 2x128 + 2x128 + 2x64 + 32 + 3x256 = 1440; recomputed activations 1440 + 2x128 (the
    // buffers move into them: no second set); host arrays 77 x 4.
    let host = 308;
    assert_eq!(
        phase(&plan, "loss").bytes(),
        2 * 128 + 256 + 128 + 2 * 16 * 512 * 4 + host
    );
    assert_eq!(
        phase(&plan, "recompute").bytes(),
        2 * 128 + 256 + 128 + 256 + 128 + 1696 + host
    );
    assert_eq!(
        phase(&plan, "MLP bwd").bytes(),
        128 + 256 + 128 + 256 + 1696 + 384 + 768 + host
    );
    assert_eq!(
        phase(&plan, "attn bwd").bytes(),
        128 + 256 + 128 + 256 + 1696 + 384 + 384 + host
    );
    // The reference loss's two 16 x 512 tiles dwarf a 4-token step.
    assert_eq!(plan.peak().0.name, "loss");
}

#[test]
fn tp2_on_the_cpu_adds_the_sequence_pair_and_host_staging() {
    let c = small();
    let plan = training_plan(&c, &setup(2, 1, 3), &Target::cpu(), 0).unwrap();
    // Padded to T = 4, 2 rows a rank: [rows, d] 64, [T, d] 128, q 64, k/v 64 (the one KV
    // head replicated), lse 16, [T, I/2] 128, the sequence pair 64 + 128; one buffer set
    // 192 + 256 + 128 + 128 + 16 + 384 = 1104, activations 1104 - 192 + 2 x 64 = 1040; the
    // reduce-scatter of [T, d] f32 staged through the host: (2 + 3 x 2) x 128.
    let host = 77 * 4;
    assert_eq!(
        phase(&plan, "MLP bwd").bytes(),
        64 + (128 + 64) + 128 + 128 + 1040 + (256 + 64) + 384 + 1024 + host
    );
    assert_eq!(
        phase(&plan, "recompute").bytes(),
        2 * 64 + (128 + 64) + 128 + 128 + 64 + 1040 + host
    );
    assert_eq!(host_reduce_scatter(1, 1000), 0);
    assert_eq!(host_all_reduce(4, 10), 13 * 40);
}

#[test]
fn zero1_shares_whole_tensors_and_the_kv_cache_counts_blocks() {
    let c = small();
    let local = c.shard(1, 0).unwrap();
    assert_eq!(zero_share(&c, &local, 1), 1480);
    // Dealt by size: the 256-element embedding alone is more than half of nothing else.
    let two = zero_share(&c, &local, 2);
    assert!((740..1480).contains(&two), "{two}");
    // 2 x layers x kv_heads x head_dim x bytes: 2 x 2 x 1 x 4 x 2 = 32 bytes a token.
    assert_eq!(kv_cache_bytes(&c, &local, 3, 16, 2), 3 * 16 * 32);
}

#[test]
fn qwen_72b_at_tp8_on_h200s() {
    let (c, _) = synthetic::preset("qwen2.5-72b-yarn4").unwrap();
    let target = Target::cuda(132, 1 << 30);
    let s = TrainingSetup {
        colocated_engine: true,
        ..setup(8, 16, 131_072)
    };
    let plan = largest_training_plan(&c, &s, &target).unwrap();
    let local = c.shard(8, 0).unwrap();
    let params = local_parameters(&c, &local) as u64;
    assert_eq!(plan.resident_named("weights"), 2 * params);
    assert_eq!(plan.resident_named("f32 gradients"), 4 * params);
    // The largest replica's share is within one tensor (the 19,008 x 8,192 embedding
    // shard) of an even split.
    let share = plan.resident_named("f32 masters") / 12;
    assert!(
        share >= params / 16 && share <= params / 16 + 19_008 * 8192,
        "{share}"
    );
    // KV: 2 x 80 layers x 1 KV head x 128 x 2 bytes = 40,960 bytes a token a GPU.
    let kv = PagedKv::<()>::bytes_per_token(&c, &local, 2);
    assert_eq!(kv, 40_960);
    let rollouts = RolloutSetup {
        tp: 8,
        dp: 16,
        sequences: 10,
        context: 131_072,
        step_tokens: 8192,
        max_num_seqs: 256,
        block_size: 16,
        colocated_trainer: ColocatedTrainer::Absent,
    };
    let r = rollout_plan(&c, &rollouts, &target, 0).unwrap();
    assert_eq!(r.resident_named("KV cache"), (10 * 8192 + 1) * 16 * 40_960);
}

#[test]
fn context_parallelism_is_asked_for_only_when_it_helps() {
    let (c, _) = synthetic::preset("qwen2.5-72b-yarn4").unwrap();
    let target = Target::cuda(132, 1 << 30);
    let s = setup(8, 16, 131_072);
    let plan = largest_training_plan(&c, &s, &target).unwrap();
    let gib = 1u64 << 30;
    // Enough memory: nothing needed.
    let roomy = plan.peak().1 + gib;
    assert_eq!(
        context_parallel_needed(&c, &s, &target, roomy).unwrap(),
        None
    );
    // Just short of the peak: CP 2 halves the activations (and DP 16 becomes 8).
    let short = plan.peak().1 - gib;
    let cp = context_parallel_needed(&c, &s, &target, short)
        .unwrap()
        .unwrap();
    assert_eq!((cp.cp, cp.dp), (2, 8));
    let (before, after) = cp.activations;
    assert!(after < before / 2 + before / 50, "{before} -> {after}");
    // Less than the resident state: no degree helps.
    let tiny = plan.resident_bytes() / 2;
    assert!(context_parallel_needed(&c, &s, &target, tiny).is_err());
}

#[test]
fn counts_are_grouped_by_thousands() {
    assert_eq!(grouped(0), "0");
    assert_eq!(grouped(999), "999");
    assert_eq!(grouped(1000), "1,000");
    assert_eq!(grouped(9_089_429_504), "9,089,429,504");
}
