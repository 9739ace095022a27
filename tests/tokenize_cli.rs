//! `swerve-train tokenize` end to end on the committed Qwen2.5 tokenizer, and on a swerve
//! checkpoint (which carries its model's tokenizer files).

mod common;

use common::{bin_path, root};
use serde_json::{json, Value};
use std::process::Command;
use swerve::tokenizer::Tokenizer;

fn run(lines: &[String]) -> (std::process::Output, Option<String>) {
    run_with(&root().join("assets/qwen2.5"), lines)
}

fn run_with(
    tokenizer: &std::path::Path,
    lines: &[String],
) -> (std::process::Output, Option<String>) {
    let tmp = tempfile::tempdir().unwrap();
    let (input, output) = (tmp.path().join("in.jsonl"), tmp.path().join("out.jsonl"));
    std::fs::write(&input, lines.join("\n") + "\n").unwrap();
    let result = Command::new(bin_path("swerve-train"))
        .args(["tokenize", "--tokenizer"])
        .arg(tokenizer)
        .arg("--input")
        .arg(&input)
        .arg("--output")
        .arg(&output)
        .output()
        .unwrap();
    (result, std::fs::read_to_string(&output).ok())
}

#[test]
fn text_and_conversations() {
    let conversation = json!({
        "messages": [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello!"}
        ]
    });
    let lines = vec![
        json!({"text": "<|im_start|>user\nHi"}).to_string(),
        conversation.to_string(),
    ];
    let (result, output) = run(&lines);
    assert!(
        result.status.success(),
        "{}",
        String::from_utf8_lossy(&result.stderr)
    );
    let output = output.unwrap();
    let rows: Vec<Value> = output
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(rows.len(), 2);

    let tokenizer = Tokenizer::qwen25().unwrap();
    assert_eq!(
        rows[0]["tokens"],
        json!(tokenizer.encode("<|im_start|>user\nHi").unwrap())
    );
    assert_eq!(rows[0]["tokens"][0], json!(151_644));
    assert!(rows[0]["action_mask"]
        .as_array()
        .unwrap()
        .iter()
        .all(|m| m == 0));

    let tokens: Vec<u32> = serde_json::from_value(rows[1]["tokens"].clone()).unwrap();
    let mask: Vec<u8> = serde_json::from_value(rows[1]["action_mask"].clone()).unwrap();
    let text = tokenizer.decode(&tokens, false).unwrap();
    assert_eq!(
        text,
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n\
         <|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n"
    );
    let masked: Vec<u32> = tokens
        .iter()
        .zip(&mask)
        .filter(|(_, &m)| m == 1)
        .map(|(&t, _)| t)
        .collect();
    assert_eq!(
        tokenizer.decode(&masked, false).unwrap(),
        "Hello!<|im_end|>"
    );
}

#[test]
fn bad_lines_name_line_and_message() {
    for (line, want) in [
        (
            json!({"messages": [{"role": "user", "content": "a"}, {"role": "critic", "content": "b"}]}),
            "in.jsonl:2: messages[1]: unknown role",
        ),
        (json!({"text": 5}), "in.jsonl:2: `text` must be a string"),
        (
            json!({"prompt": "x"}),
            "in.jsonl:2: expected `text` or `messages`",
        ),
        (
            json!({"text": "a", "messages": []}),
            "in.jsonl:2: a line has either",
        ),
    ] {
        let (result, output) = run(&[json!({"text": "ok"}).to_string(), line.to_string()]);
        let stderr = String::from_utf8_lossy(&result.stderr);
        assert!(
            !result.status.success() && stderr.contains(want),
            "{line}: {stderr}"
        );
        assert!(output.is_none());
    }
}

#[test]
fn a_checkpoint_carries_the_tokenizer_its_model_used() {
    // preset:tiny has no tokenizer files of its own: it runs with the embedded Qwen2.5
    // tokenizer, so that is what its checkpoints must carry.
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("rft.jsonl");
    let conversation = json!({"messages": [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"}
    ]});
    std::fs::write(&data, format!("{conversation}\n{conversation}\n")).unwrap();
    let out = dir.path().join("out");
    let result = Command::new(bin_path("swerve-train"))
        .args([
            "rft",
            "--model",
            "preset:tiny",
            "--steps",
            "1",
            "--batch-size",
            "2",
        ])
        .args(["--device", "cpu", "--data"])
        .arg(&data)
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    assert!(
        result.status.success(),
        "{}",
        String::from_utf8_lossy(&result.stderr)
    );
    let checkpoint = out.join("final");
    for file in ["tokenizer.json", "tokenizer_config.json"] {
        assert!(
            std::fs::read(checkpoint.join(file)).unwrap()
                == std::fs::read(root().join("assets/qwen2.5").join(file)).unwrap(),
            "{file}"
        );
    }
    let lines = vec![
        json!({"text": "<|im_start|>user\nHi"}).to_string(),
        conversation.to_string(),
    ];
    let (from_checkpoint, tokenized) = run_with(&checkpoint, &lines);
    assert!(
        from_checkpoint.status.success(),
        "{}",
        String::from_utf8_lossy(&from_checkpoint.stderr)
    );
    let (_, expected) = run(&lines);
    assert_eq!(tokenized.unwrap(), expected.unwrap());
}
