//! Helpers shared by the integration tests: fixture paths and the oracle's expected outputs.
#![allow(dead_code)]

pub mod coin;
pub mod forgeries;
pub mod forgeries_process;
pub mod gpu;
pub mod k8s_standin;
pub mod nccl_ranks;
pub mod paged;
pub mod python;
pub mod ranks;
pub mod serve;
pub mod swebench;
pub mod train_fixture;

use safetensors::{Dtype, SafeTensors};
use std::path::PathBuf;

pub const FIXTURE_MODELS: [&str; 3] = ["tied-gqa4-bf16", "untied-gqa2-odd-f32", "yarn4-f16"];

/// The repository root: `SWERVE_ROOT` when set (the GPU runner sets it, since the test
/// executables travel without the build tree), else where this crate was built.
pub fn root() -> PathBuf {
    match std::env::var_os("SWERVE_ROOT") {
        Some(root) => PathBuf::from(root),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")),
    }
}

/// SplitMix64 token ids below `vocab`: deterministic data for the training tests.
pub fn tokens(seed: u64, n: usize, vocab: u64) -> Vec<u32> {
    use swerve::rng::{Rng, SplitMix64};
    let mut rng = SplitMix64::new(seed);
    (0..n).map(|_| rng.below(vocab as usize) as u32).collect()
}

/// DAPO data lines: two groups (`task-0`, `task-1`) of four completions, each an 8-token prompt
/// and 12 action tokens below `vocab`, with rollout logprobs `logprob(t, i)` on the action tokens
/// (t: position, i: completion) and rewards `reward(i)`.
pub fn dapo_lines(
    vocab: u64,
    logprob: impl Fn(u64, u64) -> f64,
    reward: impl Fn(u64) -> f64,
) -> Vec<serde_json::Value> {
    let mut lines = Vec::new();
    for g in 0..2u64 {
        let prompt = tokens(100 + g, 8, vocab);
        for i in 0..4u64 {
            let completion = tokens(200 + 10 * g + i, 12, vocab);
            let logprobs: Vec<serde_json::Value> = (0..20u64)
                .map(|t| {
                    if t < 8 {
                        serde_json::Value::Null
                    } else {
                        serde_json::json!(logprob(t, i))
                    }
                })
                .collect();
            let all_tokens = [prompt.clone(), completion].concat();
            let action_mask = [vec![0; 8], vec![1; 12]].concat();
            lines.push(
                serde_json::json!({"group": format!("task-{g}"), "tokens": all_tokens,
                "action_mask": action_mask, "logprobs": logprobs, "reward": reward(i)}),
            );
        }
    }
    lines
}

pub fn fixture_dir(name: &str) -> PathBuf {
    root().join("tests/fixtures").join(name)
}

/// Every line of a JSON-lines file the commands wrote, parsed.
pub fn json_lines(path: &std::path::Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// A binary of this crate: from `SWERVE_BIN_DIR` when set (the GPU runner), else cargo's.
pub fn bin_path(name: &str) -> PathBuf {
    let built = match name {
        "swerve-train" => env!("CARGO_BIN_EXE_swerve-train"),
        "swerve-bench" => env!("CARGO_BIN_EXE_swerve-bench"),
        "swerve-serve" => env!("CARGO_BIN_EXE_swerve-serve"),
        other => panic!("no binary {other}"),
    };
    match std::env::var_os("SWERVE_BIN_DIR") {
        Some(dir) => PathBuf::from(dir).join(name),
        None => PathBuf::from(built),
    }
}

/// One sequence of a fixture and what transformers computed for it in float64.
pub struct Expected {
    pub tokens: Vec<u32>,
    /// `[len, vocab]` row-major.
    pub logits: Vec<f64>,
    /// `len - 1` values: log p(tokens[t] | tokens[<t]) for t >= 1.
    pub logprobs: Vec<f64>,
    /// Largest |error| of the same model run by transformers in bf16: GPU tolerances are twice
    /// these.
    pub bf16_logits_error: f64,
    pub bf16_logprobs_error: f64,
}

pub fn expected(name: &str) -> Vec<Expected> {
    let bytes = std::fs::read(fixture_dir(name).join("expected.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let read = |key: &str, dtype: Dtype| {
        let view = st.tensor(key).unwrap();
        assert_eq!(view.dtype(), dtype, "{key}");
        view.data()
            .chunks_exact(8)
            .map(|c| c.try_into().unwrap())
            .collect::<Vec<[u8; 8]>>()
    };
    (0..)
        .take_while(|i| st.tensor(&format!("tokens_{i}")).is_ok())
        .map(|i| Expected {
            tokens: read(&format!("tokens_{i}"), Dtype::I64)
                .into_iter()
                .map(|b| i64::from_le_bytes(b) as u32)
                .collect(),
            logits: read(&format!("logits_{i}"), Dtype::F64)
                .into_iter()
                .map(f64::from_le_bytes)
                .collect(),
            logprobs: read(&format!("logprobs_{i}"), Dtype::F64)
                .into_iter()
                .map(f64::from_le_bytes)
                .collect(),
            bf16_logits_error: f64::from_le_bytes(
                read(&format!("bf16_logits_error_{i}"), Dtype::F64)[0],
            ),
            bf16_logprobs_error: f64::from_le_bytes(
                read(&format!("bf16_logprobs_error_{i}"), Dtype::F64)[0],
            ),
        })
        .collect()
}

/// max |got - want| / max |want|.
pub fn relative_error(got: &[f32], want: &[f64]) -> f64 {
    assert_eq!(got.len(), want.len());
    let scale = want.iter().fold(0.0f64, |m, v| m.max(v.abs()));
    let diff = got
        .iter()
        .zip(want)
        .fold(0.0f64, |m, (g, w)| m.max((*g as f64 - w).abs()));
    assert!(scale > 0.0, "reference is all zeros");
    diff / scale
}
