//! Qwen2-shaped models built deterministically in memory: the embedded default that
//! `swerve-bench` runs with no arguments, and random-weight presets of the real Qwen2.5 shapes
//! for GPU benchmarks (no weights can be downloaded on the GPU hosts; speed does not care).

use crate::config::{LocalSizes, ModelConfig, RopeConfig, RopeScaling, YarnConfig};
use crate::model::params::{ParamKind, Qwen2Params};
use crate::model::weights::write_safetensors;
use crate::rng::{Rng, SplitMix64};
use crate::tensor::HostTensor;
use anyhow::{bail, Context, Result};
use half::bf16;
use std::path::Path;

/// Names accepted by `--preset`.
pub const PRESETS: [&str; 8] = [
    "default",
    "tiny",
    "qwen2.5-0.5b",
    "qwen2.5-1.5b",
    "qwen2.5-7b",
    "qwen2.5-32b",
    "qwen2.5-72b",
    "qwen2.5-72b-tp8",
];

/// A preset's architecture and the tensor-parallel size its benchmark measures one rank of.
pub fn preset(name: &str) -> Result<(ModelConfig, usize)> {
    // `NAME-yarn4`: the shape of NAME with Qwen2.5's recommended 131,072-token YaRN scaling.
    if let Some(base) = name.strip_suffix("-yarn4") {
        let (mut config, tp) = preset(base)?;
        let factor: f64 = 4.0;
        config.rope.scaling = RopeScaling::Yarn(YarnConfig {
            factor,
            original_max_position_embeddings: config.max_position_embeddings,
            beta_fast: 32.0,
            beta_slow: 1.0,
            attention_factor: 0.1 * factor.ln() + 1.0,
            truncate: true,
        });
        config.validate()?;
        return Ok((config, tp));
    }
    // (hidden, intermediate, layers, heads, kv heads, vocab, tied, tp)
    let (d, inter, layers, heads, kv, vocab, tied, tp) = match name {
        // Small enough for a CPU: 4 layers, GQA 4:1, head_dim 64, a 32k vocabulary.
        "default" => (512, 1408, 4, 8, 2, 32768, true, 1),
        // Qwen2.5's whole vocabulary at toy size (2 layers, hidden 64): agent episodes end to end
        // on a CPU, with the real tokenizer and chat template.
        "tiny" => (64, 128, 2, 4, 2, 151936, true, 1),
        "qwen2.5-0.5b" => (896, 4864, 24, 14, 2, 151936, true, 1),
        "qwen2.5-1.5b" => (1536, 8960, 28, 12, 2, 151936, true, 1),
        "qwen2.5-7b" => (3584, 18944, 28, 28, 4, 152064, false, 1),
        "qwen2.5-32b" => (5120, 27648, 64, 40, 8, 152064, false, 1),
        // The whole model (`swerve-bench plan` splits it as told); `-tp8` is one rank's shape.
        "qwen2.5-72b" => (8192, 29568, 80, 64, 8, 152064, false, 1),
        "qwen2.5-72b-tp8" => (8192, 29568, 80, 64, 8, 152064, false, 8),
        other => bail!(
            "unknown preset {other:?}; choose one of {} (each also as NAME-yarn4: 131,072-token YaRN; `--model preset:toy` is the toy task's model)",
            PRESETS.join(", ")
        ),
    };
    let config = ModelConfig {
        hidden_size: d,
        intermediate_size: inter,
        num_hidden_layers: layers,
        num_attention_heads: heads,
        num_key_value_heads: kv,
        head_dim: d / heads,
        vocab_size: vocab,
        max_position_embeddings: 32768,
        rms_norm_eps: 1e-6,
        tie_word_embeddings: tied,
        rope: RopeConfig {
            theta: 1e6,
            scaling: RopeScaling::None,
        },
    };
    config.validate()?;
    Ok((config, tp))
}

/// Random bf16 parameters for one rank: matrices uniform with variance 1/fan_in (activations keep
/// their scale through the layers), biases small, norm weights near 1.
pub fn random_params(
    config: &ModelConfig,
    local: &LocalSizes,
    seed: u64,
) -> Result<Qwen2Params<HostTensor<'static>>> {
    let mut rng = SplitMix64::new(seed);
    Qwen2Params::try_build(config, local, |_, shape, shard| {
        Ok(random_tensor(&mut rng, shape, shard.kind))
    })
}

fn random_tensor(rng: &mut SplitMix64, shape: &[usize], kind: ParamKind) -> HostTensor<'static> {
    let numel: usize = shape.iter().product();
    let (center, half_width) = match (kind, shape.len()) {
        (ParamKind::Norm, _) => (1.0, 0.1),
        (_, 1) => (0.0, 0.1),
        _ => (0.0, (3.0 / shape[1] as f32).sqrt()),
    };
    let values: Vec<bf16> = (0..numel)
        .map(|_| bf16::from_f32(center + half_width * rng.next_signed_f32()))
        .collect();
    HostTensor::from_bf16(shape.to_vec(), &values)
}

/// Writes a (tensor-parallel size 1) model with [`random_params`]' weights for `seed` as an HF
/// folder: `config.json` and `model.safetensors`, which `swerve-serve` and transformers load (the
/// tokenizer is the embedded Qwen2.5 one). Used to benchmark the server on preset shapes.
pub fn write_model_dir(config: &ModelConfig, seed: u64, dir: &Path) -> Result<()> {
    let local = config.local_sizes(1)?;
    let mut rng = SplitMix64::new(seed);
    let mut tensors = Vec::new();
    Qwen2Params::<()>::try_build(config, &local, |name, shape, shard| {
        tensors.push((name.to_string(), random_tensor(&mut rng, shape, shard.kind)));
        Ok(())
    })?;
    write_hf_config(config, dir)?;
    write_safetensors(&dir.join("model.safetensors"), &tensors)
}

/// `config.json` for `config` in `dir` (created), as transformers writes Qwen2's.
fn write_hf_config(config: &ModelConfig, dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let rope_scaling = match &config.rope.scaling {
        RopeScaling::None => serde_json::Value::Null,
        RopeScaling::Yarn(yarn) => serde_json::json!({
            "type": "yarn",
            "factor": yarn.factor,
            "original_max_position_embeddings": yarn.original_max_position_embeddings,
            "beta_fast": yarn.beta_fast,
            "beta_slow": yarn.beta_slow,
            "attention_factor": yarn.attention_factor,
            "truncate": yarn.truncate,
        }),
    };
    let hf = serde_json::json!({
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "hidden_act": "silu",
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_hidden_layers": config.num_hidden_layers,
        "num_attention_heads": config.num_attention_heads,
        "num_key_value_heads": config.num_key_value_heads,
        "vocab_size": config.vocab_size,
        "max_position_embeddings": config.max_position_embeddings,
        "rms_norm_eps": config.rms_norm_eps,
        "rope_theta": config.rope.theta,
        "rope_scaling": rope_scaling,
        "tie_word_embeddings": config.tie_word_embeddings,
        "use_sliding_window": false,
        "torch_dtype": "bfloat16",
    });
    let config_path = dir.join("config.json");
    std::fs::write(&config_path, serde_json::to_string_pretty(&hf)? + "\n")
        .with_context(|| format!("cannot write {}", config_path.display()))
}

/// A model that continues each `(token, next)` pair's token with `next` at probability ~1 at
/// temperature 1 (a logit margin of 40): one layer whose every block weight is zero, so the
/// residual stream is the current token's embedding; one-hot embeddings for the tokens that have
/// a successor; an LM head mapping each to its successor. It runs through the real engine,
/// sampler and kernels, so tests can drive agent scaffolds and clients deterministically (an
/// episode whose every turn is the same tool call, say). Other tokens get uniform logits.
pub fn write_bigram_model(dir: &Path, successors: &[(u32, u32)], vocab_size: usize) -> Result<()> {
    for &(token, next) in successors {
        if let Some(&(_, other)) = successors.iter().find(|&&(t, n)| t == token && n != next) {
            bail!("token {token} is given two successors ({next} and {other})");
        }
    }
    let weighted: Vec<(u32, u32, f64)> = successors.iter().map(|&(t, n)| (t, n, 1.0)).collect();
    write_branching_model(dir, &weighted, vocab_size)
}

/// [`write_bigram_model`] with chosen odds: `(token, next, p)` makes `next` follow `token` with
/// probability `p` at temperature 1 (a token's listed `p` must sum to 1; each successor's logit
/// is `40 + ln p`, so the odds hold up to the bf16 rounding of the LM head, about 0.06 nats).
/// A policy that branches where a test needs it: a tool call or submit, a right or wrong fix.
pub fn write_branching_model(
    dir: &Path,
    successors: &[(u32, u32, f64)],
    vocab_size: usize,
) -> Result<()> {
    let mut sources: Vec<u32> = Vec::new();
    for &(token, next, p) in successors {
        if token as usize >= vocab_size || next as usize >= vocab_size {
            bail!("bigram ({token}, {next}) is outside the vocabulary of {vocab_size}");
        }
        if !(p > 1e-6 && p <= 1.0) {
            bail!("bigram ({token}, {next}): probability {p} is not in (1e-6, 1]");
        }
        if successors
            .iter()
            .filter(|&&(t, n, _)| t == token && n == next)
            .count()
            > 1
        {
            bail!("bigram ({token}, {next}) is listed twice");
        }
        if !sources.contains(&token) {
            sources.push(token);
        }
    }
    for &token in &sources {
        let total: f64 = successors
            .iter()
            .filter(|&&(t, _, _)| t == token)
            .map(|&(_, _, p)| p)
            .sum();
        if (total - 1.0).abs() > 1e-9 {
            bail!("the successors of token {token} have probabilities summing to {total}, not 1");
        }
    }
    let d = sources.len().next_multiple_of(16).max(16);
    let config = ModelConfig {
        hidden_size: d,
        intermediate_size: 16,
        num_hidden_layers: 1,
        num_attention_heads: 2,
        num_key_value_heads: 1,
        head_dim: d / 2,
        vocab_size,
        max_position_embeddings: 32768,
        rms_norm_eps: 1e-6,
        tie_word_embeddings: false,
        rope: RopeConfig {
            theta: 1e6,
            scaling: RopeScaling::None,
        },
    };
    config.validate()?;
    // After the final RMSNorm a one-hot row is sqrt(d) at its column.
    let scale = 1.0 / (d as f64).sqrt();
    let local = config.local_sizes(1)?;
    let mut tensors = Vec::new();
    Qwen2Params::<()>::try_build(&config, &local, |name, shape, shard| {
        let mut values = vec![0.0f32; shape.iter().product()];
        match (name, shard.kind) {
            (_, ParamKind::Norm) => values.fill(1.0),
            ("model.embed_tokens.weight", _) => {
                for (column, &token) in sources.iter().enumerate() {
                    values[token as usize * d + column] = 1.0;
                }
            }
            ("lm_head.weight", _) => {
                for &(token, next, p) in successors {
                    let column = sources.iter().position(|&t| t == token).expect("listed");
                    values[next as usize * d + column] = ((40.0 + p.ln()) * scale) as f32;
                }
            }
            _ => {}
        }
        tensors.push((
            name.to_string(),
            HostTensor::from_f32(shape.to_vec(), &values),
        ));
        Ok(())
    })?;
    write_hf_config(&config, dir)?;
    write_safetensors(&dir.join("model.safetensors"), &tensors)
}
