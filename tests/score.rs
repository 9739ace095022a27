//! `swerve-train score` end to end: the binary on a fixture model reproduces transformers'
//! float64 logprobs, whatever the packing; bad input lines are named.

mod common;

use common::{bin_path, expected, fixture_dir, relative_error, FIXTURE_MODELS};
use std::process::Command;

fn run_score(
    model: &str,
    input_lines: &[String],
    batch_tokens: usize,
) -> (std::process::Output, Option<String>) {
    run_score_on("cpu", model, input_lines, batch_tokens)
}

/// The CPU reference's tolerances apply to `--device cpu`; tests/gpu_model.rs runs `cuda`.
pub fn run_score_on(
    device: &str,
    model: &str,
    input_lines: &[String],
    batch_tokens: usize,
) -> (std::process::Output, Option<String>) {
    run_score_with(device, model, input_lines, batch_tokens, &[])
}

fn run_score_with(
    device: &str,
    model: &str,
    input_lines: &[String],
    batch_tokens: usize,
    extra: &[&str],
) -> (std::process::Output, Option<String>) {
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("in.jsonl");
    let output = tmp.path().join("out.jsonl");
    std::fs::write(&input, input_lines.join("\n") + "\n").unwrap();
    let result = Command::new(bin_path("swerve-train"))
        .args(["score", "--model"])
        .arg(fixture_dir(model))
        .arg("--input")
        .arg(&input)
        .arg("--output")
        .arg(&output)
        .args(["--batch-tokens", &batch_tokens.to_string()])
        .args(["--device", device])
        .args(extra)
        .output()
        .unwrap();
    (result, std::fs::read_to_string(&output).ok())
}

#[test]
fn score_reproduces_the_oracle_logprobs() {
    for model in FIXTURE_MODELS {
        let cases = expected(model);
        let lines: Vec<String> = cases
            .iter()
            .map(|c| serde_json::json!({ "tokens": c.tokens }).to_string())
            .collect();
        // 1 token per batch (every sequence alone) and everything in one batch.
        for batch_tokens in [1, 100_000] {
            let (result, output) = run_score(model, &lines, batch_tokens);
            assert!(
                result.status.success(),
                "{}",
                String::from_utf8_lossy(&result.stderr)
            );
            assert!(String::from_utf8_lossy(&result.stderr).contains("backend: cpu"));
            let output = output.unwrap();
            let out_lines: Vec<&str> = output.lines().collect();
            assert_eq!(out_lines.len(), cases.len());
            for (case, line) in cases.iter().zip(out_lines) {
                let value: serde_json::Value = serde_json::from_str(line).unwrap();
                let logprobs = value["logprobs"].as_array().unwrap();
                assert_eq!(logprobs.len(), case.tokens.len());
                assert!(logprobs[0].is_null());
                let got: Vec<f32> = logprobs[1..]
                    .iter()
                    .map(|v| v.as_f64().unwrap() as f32)
                    .collect();
                if case.tokens.len() > 1 {
                    let err = relative_error(&got, &case.logprobs);
                    assert!(err <= 1e-4, "{model}: logprob relative error {err:.3e}");
                }
            }
        }
    }
}

#[test]
fn score_over_tensor_parallel_ranks_reproduces_the_oracle_logprobs() {
    for (model, degrees) in [
        ("tied-gqa4-bf16", ["2", "3"]),
        ("untied-gqa2-odd-f32", ["4", "5"]),
    ] {
        let cases = expected(model);
        let mut lines: Vec<String> = cases
            .iter()
            .map(|c| serde_json::json!({ "tokens": c.tokens }).to_string())
            .collect();
        lines.push(r#"{"tokens": []}"#.to_string());
        for tp in degrees {
            let (result, output) =
                run_score_with("cpu", model, &lines, 64, &["--tensor-parallel", tp]);
            let stderr = String::from_utf8_lossy(&result.stderr);
            assert!(result.status.success(), "{stderr}");
            assert!(
                stderr.contains(&format!("tensor-parallel {tp}")),
                "{stderr}"
            );
            let output = output.unwrap();
            let out_lines: Vec<&str> = output.lines().collect();
            assert_eq!(
                out_lines.len(),
                lines.len(),
                "one line per input line, written once"
            );
            assert_eq!(out_lines[cases.len()], r#"{"logprobs":[]}"#);
            for (case, line) in cases.iter().zip(out_lines) {
                let value: serde_json::Value = serde_json::from_str(line).unwrap();
                let got: Vec<f32> = value["logprobs"].as_array().unwrap()[1..]
                    .iter()
                    .map(|v| v.as_f64().unwrap() as f32)
                    .collect();
                if case.tokens.len() > 1 {
                    let err = relative_error(&got, &case.logprobs);
                    assert!(
                        err <= 1e-4,
                        "{model} tp {tp}: logprob relative error {err:.3e}"
                    );
                }
            }
        }
    }
}

#[test]
fn empty_and_single_token_sequences_keep_their_lines() {
    let lines = vec![
        r#"{"tokens": []}"#.to_string(),
        r#"{"tokens": [5], "id": "x"}"#.to_string(),
    ];
    let (result, output) = run_score("tied-gqa4-bf16", &lines, 64);
    assert!(
        result.status.success(),
        "{}",
        String::from_utf8_lossy(&result.stderr)
    );
    assert_eq!(
        output.unwrap(),
        "{\"logprobs\":[]}\n{\"logprobs\":[null]}\n"
    );
}

#[test]
fn bad_lines_are_named_and_nothing_is_written() {
    for (line, message) in [
        (
            r#"{"tokens": [1, 2, 320]}"#,
            "in.jsonl:2: tokens[2] = 320 is not a token id below the vocabulary size 320",
        ),
        (r#"{"tokens": [1, -2]}"#, "in.jsonl:2: tokens[1] = -2"),
        (
            r#"{"text": "hello"}"#,
            "in.jsonl:2: expected an object with a `tokens` array",
        ),
        (r#"{"tokens": [1, 2"#, "in.jsonl:2: not valid JSON"),
        ("", "in.jsonl:2: empty line"),
    ] {
        let lines = vec![r#"{"tokens": [1, 2, 3]}"#.to_string(), line.to_string()];
        let (result, output) = run_score("tied-gqa4-bf16", &lines, 64);
        let stderr = String::from_utf8_lossy(&result.stderr);
        assert!(!result.status.success(), "{line:?} was accepted");
        assert!(stderr.contains(message), "{line:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
        assert!(output.is_none(), "a failed run left an output file");
    }
}

#[test]
fn sequence_longer_than_the_context_is_refused() {
    let tokens: Vec<u32> = (0..129).map(|i| i % 300).collect();
    let lines = vec![serde_json::json!({ "tokens": tokens }).to_string()];
    let (result, _) = run_score("untied-gqa2-odd-f32", &lines, 64);
    let stderr = String::from_utf8_lossy(&result.stderr);
    assert!(
        stderr.contains("in.jsonl:1: 129 tokens exceed the model's context of 64"),
        "{stderr}"
    );
}

#[test]
fn missing_model_folder_is_named() {
    let (result, _) = run_score("no-such-model", &[r#"{"tokens": [1]}"#.to_string()], 64);
    let stderr = String::from_utf8_lossy(&result.stderr);
    assert!(stderr.contains("no-such-model/config.json"), "{stderr}");
}
