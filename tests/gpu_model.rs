//! The whole model on the CUDA backend against the committed transformers fixtures.
//!
//! Tolerance: the fixtures record how far transformers' own bf16 run of each model lands from
//! the float64 answer (`bf16_logits_error_i`, `bf16_logprobs_error_i`); swerve's bf16 GPU run
//! must land within twice that, for every sequence, alone and packed with the others.
//!
//! Needs a CUDA GPU: run through scripts/gpu-pack.sh. Without one these tests fail, never pass.

mod common;

use common::{bin_path, expected, fixture_dir, FIXTURE_MODELS};
use std::process::Command;
use swerve::backend::cuda::CudaBackend;
use swerve::backend::Backend;
use swerve::model::{PackedBatch, Qwen2Model};

fn gpu() -> CudaBackend {
    CudaBackend::open_default()
        .expect("these tests need a CUDA GPU and a build with kernels (SWERVE_REQUIRE_CUDA=1)")
}

fn max_abs_diff(got: &[f32], want: &[f64]) -> f64 {
    assert_eq!(got.len(), want.len());
    got.iter().zip(want).fold(0.0f64, |m, (g, w)| {
        if g.is_nan() {
            f64::INFINITY
        } else {
            m.max((*g as f64 - w).abs())
        }
    })
}

#[test]
#[cfg_attr(
    not(swerve_emu),
    ignore = "needs a CUDA GPU (or a SWERVE_EMU=1 build: the emulated device)"
)]
fn logits_and_logprobs_within_twice_transformers_bf16_error() {
    let gpu = gpu();
    for name in FIXTURE_MODELS {
        let model = Qwen2Model::load(&gpu, &fixture_dir(name)).unwrap();
        let cases = expected(name);
        let vocab = model.config.vocab_size;
        let sequences: Vec<Vec<u32>> = cases.iter().map(|c| c.tokens.clone()).collect();
        let packed = PackedBatch::from_sequences(&sequences);
        let packed_logits = gpu
            .to_host(&model.forward_logits(&gpu, &packed).unwrap())
            .unwrap();
        for (i, case) in cases.iter().enumerate() {
            let batch = PackedBatch::from_sequences(std::slice::from_ref(&case.tokens));
            let logits_dev = model.forward_logits(&gpu, &batch).unwrap();
            let logits = gpu.to_host(&logits_dev).unwrap();
            let err = max_abs_diff(&logits, &case.logits);
            let range = packed.sequence_range(i);
            let packed_err = max_abs_diff(
                &packed_logits[range.start * vocab..range.end * vocab],
                &case.logits,
            );
            println!(
                "{name} seq {i} ({} tokens): logits error {err:.3e} alone, {packed_err:.3e} packed; transformers bf16 {:.3e}",
                case.tokens.len(),
                case.bf16_logits_error
            );
            assert!(err <= 2.0 * case.bf16_logits_error, "{name} seq {i}: {err}");
            assert!(
                packed_err <= 2.0 * case.bf16_logits_error,
                "{name} seq {i} packed: {packed_err}"
            );

            if case.tokens.len() > 1 {
                let targets: Vec<u32> = case.tokens[1..].to_vec();
                let rows = gpu
                    .slice_rows(&logits_dev, 0..case.tokens.len() - 1)
                    .unwrap();
                let logprobs = gpu.token_logprobs(&rows, &targets).unwrap();
                let lp_err = max_abs_diff(&logprobs, &case.logprobs);
                println!(
                    "    logprobs error {lp_err:.3e}; transformers bf16 {:.3e}",
                    case.bf16_logprobs_error
                );
                assert!(
                    lp_err <= 2.0 * case.bf16_logprobs_error,
                    "{name} seq {i} logprobs: {lp_err}"
                );
            }
        }
    }
}

#[test]
#[cfg_attr(
    not(swerve_emu),
    ignore = "needs a CUDA GPU (or a SWERVE_EMU=1 build: the emulated device)"
)]
fn a_repeated_forward_makes_no_device_allocation() {
    let gpu = gpu();
    let model = Qwen2Model::load(&gpu, &fixture_dir("yarn4-f16")).unwrap();
    let batch = PackedBatch::from_sequences(&[vec![1u32; 100], vec![2u32; 37]]);
    let first = gpu
        .to_host(&model.forward_logits(&gpu, &batch).unwrap())
        .unwrap();
    let before = gpu.pool.stats();
    let second = gpu
        .to_host(&model.forward_logits(&gpu, &batch).unwrap())
        .unwrap();
    let after = gpu.pool.stats();
    assert_eq!(
        first, second,
        "the same batch twice must give identical logits"
    );
    assert_eq!(
        after.device_allocations, before.device_allocations,
        "second forward allocated from the driver: {before:?} -> {after:?}"
    );
    assert!(after.reuses > before.reuses);
    assert_eq!(
        after.bytes_in_use, before.bytes_in_use,
        "a forward leaked pooled buffers"
    );
}

#[test]
#[cfg_attr(
    not(swerve_emu),
    ignore = "needs a CUDA GPU (or a SWERVE_EMU=1 build: the emulated device)"
)]
fn score_command_runs_on_the_gpu() {
    let name = "tied-gqa4-bf16";
    let cases = expected(name);
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("in.jsonl");
    let output = tmp.path().join("out.jsonl");
    let lines: Vec<String> = cases
        .iter()
        .map(|c| serde_json::json!({ "tokens": c.tokens }).to_string())
        .collect();
    std::fs::write(&input, lines.join("\n") + "\n").unwrap();
    let result = Command::new(bin_path("swerve-train"))
        .args(["score", "--device", "cuda", "--model"])
        .arg(fixture_dir(name))
        .arg("--input")
        .arg(&input)
        .arg("--output")
        .arg(&output)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&result.stderr);
    assert!(result.status.success(), "{stderr}");
    assert!(stderr.contains("backend: cuda:"), "{stderr}");
    let text = std::fs::read_to_string(&output).unwrap();
    for (line, case) in text.lines().zip(&cases) {
        let value: serde_json::Value = serde_json::from_str(line).unwrap();
        let got: Vec<f32> = value["logprobs"].as_array().unwrap()[1..]
            .iter()
            .map(|v| v.as_f64().unwrap() as f32)
            .collect();
        if case.tokens.len() > 1 {
            let err = max_abs_diff(&got, &case.logprobs);
            assert!(err <= 2.0 * case.bf16_logprobs_error, "score on GPU: {err}");
        }
    }
}
