//! `preset:toy`: a model folder small enough to learn the toy task (`builtin:toy`, guess a hidden
//! number) on a CPU in minutes, with its own tiny word-level tokenizer and chat template.
//!
//! ```text
//!   vocabulary: <|endoftext|> <|im_start|> <|im_end|>, one token per complete tool call
//!               (`guess 1` ... `guess 8` through bash, and submit), the words the template and
//!               the game use (task, assistant, error, higher, lower, correct), [UNK]
//!   template:   <|im_start|>task<|im_end|>                      the system prompt and task
//!               <|im_start|>assistant {reply}<|im_end|>          each turn (the space
//!                                                                splits words; no token)
//!               <|im_start|>{tool result}<|im_end|>              each observation
//!               <|im_start|>error<|im_end|>                      a format error's message
//! ```
//!
//! One generated token can be a whole valid turn, so a random model already plays now and then
//! (about half of its draws are tool calls; it wins about a quarter of its episodes), and what
//! it must learn is the game: guesses in range, and "higher"/"lower" read to find the number in
//! fewer turns. The weights are random, as every preset's.

use crate::config::{ModelConfig, RopeConfig, RopeScaling};
use anyhow::{Context, Result};
use serde_json::{json, Value};
use std::path::Path;

/// Numbers the toy's tool-call tokens can guess.
pub const MAX_GUESS: i64 = 8;

pub const CHAT_TEMPLATE: &str = "{%- for message in messages %}\
{%- if message.role == 'user' and loop.index0 <= 1 %}<|im_start|>task<|im_end|>\
{%- elif message.role == 'user' %}<|im_start|>error<|im_end|>\
{%- elif message.role == 'assistant' %}<|im_start|>assistant {{ message.content }}<|im_end|>\
{%- elif message.role == 'tool' %}<|im_start|>{{ message.content }}<|im_end|>\
{%- endif %}\
{%- endfor %}\
{%- if add_generation_prompt %}<|im_start|>assistant{% endif %}";

/// The text of the single-token tool calls, in vocabulary order.
pub fn call_tokens() -> Vec<String> {
    let mut calls: Vec<String> = (1..=MAX_GUESS)
        .map(|n| {
            format!("<tool_call>{{\"name\": \"bash\", \"arguments\": {{\"command\": \"guess {n}\"}}}}</tool_call>")
        })
        .collect();
    calls.push("<tool_call>{\"name\": \"submit\", \"arguments\": {}}</tool_call>".to_string());
    calls
}

const WORDS: [&str; 7] = [
    "task",
    "assistant",
    "error",
    "higher",
    "lower",
    "correct",
    "[UNK]",
];
const SPECIAL: [&str; 3] = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"];

/// The tokenizer.json (HF format: word-level model, whitespace pre-tokenizer, added tokens).
pub fn tokenizer_json() -> Value {
    let calls = call_tokens();
    let mut vocab = serde_json::Map::new();
    let mut added = Vec::new();
    for (id, content) in SPECIAL
        .iter()
        .map(|s| s.to_string())
        .chain(calls)
        .enumerate()
    {
        vocab.insert(content.clone(), json!(id));
        added.push(json!({
            "id": id, "content": content, "single_word": false, "lstrip": false,
            "rstrip": false, "normalized": false, "special": id < SPECIAL.len(),
        }));
    }
    for word in WORDS {
        let id = vocab.len();
        vocab.insert(word.to_string(), json!(id));
    }
    json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": {"type": "Whitespace"},
        "post_processor": null,
        "decoder": null,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "[UNK]"},
    })
}

/// Tokens in the toy vocabulary (the model has exactly as many rows: none never seen).
pub fn vocab_size() -> usize {
    SPECIAL.len() + call_tokens().len() + WORDS.len()
}

/// The toy model's architecture: 2 layers, hidden 32, the toy vocabulary.
pub fn config() -> ModelConfig {
    ModelConfig {
        hidden_size: 32,
        intermediate_size: 64,
        num_hidden_layers: 2,
        num_attention_heads: 2,
        num_key_value_heads: 1,
        head_dim: 16,
        vocab_size: vocab_size(),
        max_position_embeddings: 4096,
        rms_norm_eps: 1e-6,
        tie_word_embeddings: true,
        rope: RopeConfig {
            theta: 10_000.0,
            scaling: RopeScaling::None,
        },
    }
}

/// Writes the toy model folder: config.json and random weights (`seed`), tokenizer.json, and
/// tokenizer_config.json with the chat template.
pub fn write_toy_model_dir(dir: &Path, seed: u64) -> Result<()> {
    let config = config();
    super::synthetic::write_model_dir(&config, seed, dir)?;
    let tokenizer = dir.join("tokenizer.json");
    std::fs::write(
        &tokenizer,
        serde_json::to_string_pretty(&tokenizer_json())? + "\n",
    )
    .with_context(|| format!("cannot write {}", tokenizer.display()))?;
    let tokenizer_config = dir.join("tokenizer_config.json");
    let text = json!({
        "chat_template": CHAT_TEMPLATE,
        "eos_token": "<|im_end|>",
        "model_max_length": config.max_position_embeddings,
        "tokenizer_class": "PreTrainedTokenizerFast",
    });
    std::fs::write(
        &tokenizer_config,
        serde_json::to_string_pretty(&text)? + "\n",
    )
    .with_context(|| format!("cannot write {}", tokenizer_config.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chat::{ChatTemplate, Conversation};
    use crate::tokenizer::Tokenizer;

    #[test]
    fn one_token_per_call_and_the_template_round_trips() {
        let dir = tempfile::tempdir().unwrap();
        write_toy_model_dir(dir.path(), 1).unwrap();
        let tokenizer = Tokenizer::from_dir(dir.path()).unwrap();
        assert_eq!(tokenizer.vocab_size(), config().vocab_size);
        let calls = call_tokens();
        for call in &calls {
            let ids = tokenizer.encode(call).unwrap();
            assert_eq!(ids.len(), 1, "{call}");
            assert_eq!(tokenizer.decode(&ids, false).unwrap(), *call);
        }
        assert_eq!(tokenizer.stop_ids().len(), 2);
        let template = ChatTemplate::for_tokenizer(&tokenizer).unwrap();
        let messages = vec![
            json!({"role": "system", "content": "You are an agent."}),
            json!({"role": "user", "content": "Guess the number."}),
            json!({"role": "assistant", "content": calls[2]}),
            json!({"role": "tool", "content": "higher"}),
            json!({"role": "assistant", "content": "higher", "loss": false}),
            json!({"role": "user", "content": "Format error: no tool call"}),
        ];
        let conversation = Conversation::new(&messages, None).unwrap();
        let text = template.render(&conversation, true).unwrap();
        assert_eq!(
            text,
            format!("<|im_start|>task<|im_end|><|im_start|>assistant {}<|im_end|><|im_start|>higher<|im_end|><|im_start|>assistant higher<|im_end|><|im_start|>error<|im_end|><|im_start|>assistant", calls[2])
        );
        let masked = template.tokenize(&tokenizer, &conversation).unwrap();
        // Actions: the call and its <|im_end|>; the masked turn is not.
        assert_eq!(masked.action_mask.iter().filter(|&&m| m == 1).count(), 2);
        assert!(!tokenizer
            .encode(&text)
            .unwrap()
            .contains(&tokenizer.token_id("[UNK]").unwrap()));
    }
}
