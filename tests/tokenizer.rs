//! The Qwen2.5 tokenizer against tiktoken with the `qwen.tiktoken` ranks (expected ids generated
//! by tests/fixtures/tokenizer/generate.py, committed).

mod common;

use swerve::tokenizer::Tokenizer;

#[derive(serde::Deserialize)]
struct Case {
    text: String,
    ids: Vec<u32>,
}

fn cases() -> Vec<Case> {
    let path = common::root().join("tests/fixtures/tokenizer/encodings.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

#[test]
fn encodings_equal_tiktoken_with_qwen_ranks() {
    let tokenizer = Tokenizer::qwen25().unwrap();
    let cases = cases();
    assert!(cases.len() >= 20);
    for case in &cases {
        assert_eq!(
            tokenizer.encode(&case.text).unwrap(),
            case.ids,
            "text {:?}",
            case.text
        );
        assert_eq!(
            tokenizer.decode(&case.ids, false).unwrap(),
            case.text,
            "decode of {:?}",
            case.text
        );
    }
}

#[test]
fn added_tokens_have_their_ids_and_special_flags() {
    let tokenizer = Tokenizer::qwen25().unwrap();
    let added = [
        "<|endoftext|>",
        "<|im_start|>",
        "<|im_end|>",
        "<|object_ref_start|>",
        "<|object_ref_end|>",
        "<|box_start|>",
        "<|box_end|>",
        "<|quad_start|>",
        "<|quad_end|>",
        "<|vision_start|>",
        "<|vision_end|>",
        "<|vision_pad|>",
        "<|image_pad|>",
        "<|video_pad|>",
        "<tool_call>",
        "</tool_call>",
        "<|fim_prefix|>",
        "<|fim_middle|>",
        "<|fim_suffix|>",
        "<|fim_pad|>",
        "<|repo_name|>",
        "<|file_sep|>",
    ];
    for (i, token) in added.iter().enumerate() {
        let id = 151_643 + i as u32;
        assert_eq!(tokenizer.token_id(token), Some(id), "{token}");
        assert_eq!(tokenizer.encode(token).unwrap(), [id], "{token}");
        // The first 14 are special: skipped when decoding with skip_special.
        let skipped = tokenizer.decode(&[id], true).unwrap();
        assert_eq!(skipped.is_empty(), i < 14, "{token} decoded as {skipped:?}");
    }
    assert_eq!(tokenizer.vocab_size(), 151_665);
    assert_eq!(tokenizer.stop_ids(), [151_645, 151_643]);
    tokenizer.check_embedding_rows(151_936).unwrap();
    let e = tokenizer
        .check_embedding_rows(151_000)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("151665 tokens") && e.contains("151000 rows"),
        "{e}"
    );
}

#[test]
fn nfc_normalisation_applies() {
    let tokenizer = Tokenizer::qwen25().unwrap();
    // "é" written as e + combining acute encodes as the precomposed character.
    assert_eq!(
        tokenizer.encode("caf\u{65}\u{301}").unwrap(),
        tokenizer.encode("caf\u{e9}").unwrap()
    );
}

#[test]
fn a_model_folder_brings_its_own_files() {
    let dir = tempfile::tempdir().unwrap();
    let assets = common::root().join("assets/qwen2.5");
    // A folder without tokenizer files gets the embedded Qwen2.5 tokenizer and template.
    assert!(Tokenizer::for_model_dir(dir.path())
        .unwrap()
        .chat_template()
        .unwrap()
        .contains("<|im_start|>"));
    std::fs::copy(
        assets.join("tokenizer.json"),
        dir.path().join("tokenizer.json"),
    )
    .unwrap();
    let tokenizer = Tokenizer::for_model_dir(dir.path()).unwrap();
    assert!(tokenizer.chat_template().is_none());
    std::fs::write(
        dir.path().join("tokenizer_config.json"),
        r#"{"chat_template": "{{ messages }}"}"#,
    )
    .unwrap();
    assert_eq!(
        Tokenizer::from_dir(dir.path()).unwrap().chat_template(),
        Some("{{ messages }}")
    );
    std::fs::write(
        dir.path().join("tokenizer_config.json"),
        r#"{"chat_template": 3}"#,
    )
    .unwrap();
    let e = format!("{:#}", Tokenizer::from_dir(dir.path()).err().unwrap());
    assert!(e.contains("chat_template` must be a string"), "{e}");
    std::fs::write(dir.path().join("tokenizer.json"), "{").unwrap();
    let e = format!("{:#}", Tokenizer::from_dir(dir.path()).err().unwrap());
    assert!(
        e.contains("tokenizer.json is not a valid HF tokenizer"),
        "{e}"
    );
}
