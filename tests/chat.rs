//! Chat rendering against Python Jinja2 (expected texts from tests/fixtures/chat/generate.py),
//! token ids with action masks, and bad conversations.

mod common;

use serde_json::{json, Value};
use swerve::chat::{ChatTemplate, Conversation};
use swerve::tokenizer::Tokenizer;

fn renderings() -> Vec<Value> {
    let path = common::root().join("tests/fixtures/chat/renderings.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn conversation(case: &Value) -> Conversation {
    Conversation::from_json(case).unwrap()
}

#[test]
fn renders_exactly_what_python_jinja2_renders() {
    let template = ChatTemplate::new(swerve::chat::QWEN25_CHAT_TEMPLATE).unwrap();
    let cases = renderings();
    assert!(cases.len() >= 6);
    for (i, case) in cases.iter().enumerate() {
        let add = case["add_generation_prompt"].as_bool().unwrap();
        let text = template.render(&conversation(case), add).unwrap();
        assert_eq!(text, case["text"].as_str().unwrap(), "conversation {i}");
    }
}

/// OpenAI-style tool calls: `arguments` as a JSON string, which is parsed before rendering.
#[test]
fn string_arguments_render_like_objects() {
    let template = ChatTemplate::new(swerve::chat::QWEN25_CHAT_TEMPLATE).unwrap();
    let mut checked = 0;
    for case in renderings() {
        let mut openai = case.clone();
        for message in openai["messages"].as_array_mut().unwrap() {
            if let Some(calls) = message.get_mut("tool_calls").and_then(Value::as_array_mut) {
                for call in calls {
                    let args = call["function"]["arguments"].to_string();
                    call["function"]["arguments"] = Value::String(args);
                    checked += 1;
                }
            }
        }
        let add = case["add_generation_prompt"].as_bool().unwrap();
        assert_eq!(
            template.render(&conversation(&openai), add).unwrap(),
            case["text"].as_str().unwrap()
        );
    }
    assert!(checked >= 4);
}

#[test]
fn piecewise_tokens_equal_whole_text_tokens_and_mask_assistant_turns() {
    let tokenizer = Tokenizer::qwen25().unwrap();
    let template = ChatTemplate::for_tokenizer(&tokenizer).unwrap();
    let im_end = tokenizer.token_id("<|im_end|>").unwrap();
    for (i, case) in renderings().iter().enumerate() {
        let conv = conversation(case);
        let masked = template.tokenize(&tokenizer, &conv).unwrap();
        let text = template.render(&conv, false).unwrap();
        assert_eq!(
            masked.tokens,
            tokenizer.encode(&text).unwrap(),
            "conversation {i}"
        );
        assert_eq!(masked.tokens.len(), masked.action_mask.len());
        // One masked run per assistant message, each ending with <|im_end|>.
        let assistants = conv
            .messages
            .iter()
            .filter(|m| m["role"] == "assistant")
            .count();
        let mut runs = 0;
        for (t, pair) in masked.action_mask.windows(2).enumerate() {
            if pair == [1, 0] {
                runs += 1;
                assert_eq!(
                    masked.tokens[t], im_end,
                    "conversation {i}: a masked run ends with {}",
                    masked.tokens[t]
                );
            }
        }
        if masked.action_mask.last() == Some(&1) {
            runs += 1;
        }
        assert_eq!(runs, assistants, "conversation {i}");
    }
}

#[test]
fn masked_tokens_are_the_assistant_text() {
    let tokenizer = Tokenizer::qwen25().unwrap();
    let template = ChatTemplate::for_tokenizer(&tokenizer).unwrap();
    let cases = renderings();
    let masked = template
        .tokenize(&tokenizer, &conversation(&cases[2]))
        .unwrap();
    let ids = masked.action_tokens();
    assert_eq!(
        tokenizer.decode(&ids, false).unwrap(),
        "<tool_call>\n{\"name\": \"bash\", \"arguments\": {\"command\": \"ls -la\"}}\n</tool_call><|im_end|>\
         There is one file, a.py.<|im_end|>"
    );
}

#[test]
fn loss_false_keeps_the_turn_but_masks_it() {
    let tokenizer = Tokenizer::qwen25().unwrap();
    let template = ChatTemplate::for_tokenizer(&tokenizer).unwrap();
    let messages = json!([
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "bad answer", "loss": false},
        {"role": "user", "content": "b"},
        {"role": "assistant", "content": "good answer"}
    ]);
    let conv = Conversation::new(messages.as_array().unwrap(), None).unwrap();
    let masked = template.tokenize(&tokenizer, &conv).unwrap();
    let ids = masked.action_tokens();
    assert_eq!(
        tokenizer.decode(&ids, false).unwrap(),
        "good answer<|im_end|>"
    );
    assert!(tokenizer
        .decode(&masked.tokens, false)
        .unwrap()
        .contains("bad answer"));
}

#[test]
fn bad_conversations_name_the_message() {
    let cases = [
        (
            json!([{"role": "user", "content": "x"}, {"role": "robot", "content": "y"}]),
            "messages[1]: unknown role \"robot\"",
        ),
        (
            json!([{"role": "user", "content": "x"}, {"role": "assistant", "tool_calls": [{"function": {"arguments": {}}}]}]),
            "messages[1]: tool_calls[0]: a tool call needs a non-empty `name`",
        ),
        (
            json!([{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{oops"}}]}]),
            "messages[0]: tool_calls[0]: `arguments` of f is a string but not JSON",
        ),
        (json!([{"content": "x"}]), "messages[0]: no `role`"),
        (
            json!([{"role": "user", "content": 3}]),
            "messages[0]: `content` must be a string",
        ),
        (json!([]), "the conversation is empty"),
    ];
    for (messages, want) in cases {
        let e = format!(
            "{:#}",
            Conversation::new(messages.as_array().unwrap(), None).unwrap_err()
        );
        assert!(e.contains(want), "{e}\nwanted: {want}");
    }
}

#[test]
fn a_failing_template_is_a_clear_error() {
    let template = ChatTemplate::new(
        "{% if messages|length > 1 %}{{ raise_exception('only one message') }}{% endif %}ok",
    )
    .unwrap();
    let two = json!([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]);
    let e = format!(
        "{:#}",
        template
            .render(
                &Conversation::new(two.as_array().unwrap(), None).unwrap(),
                false
            )
            .unwrap_err()
    );
    assert!(
        e.contains("messages[1]: the chat template failed to render")
            && e.contains("only one message"),
        "{e}"
    );
    let e = format!("{:#}", ChatTemplate::new("{% for %}").err().unwrap());
    assert!(e.contains("the chat template does not compile"), "{e}");
}
