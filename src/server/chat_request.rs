//! `POST /v1/chat/completions` bodies: `messages` rendered with the model's chat template (or
//! `prompt_token_ids`), `tools`, `tool_choice`, and the rendering fields (`add_generation_prompt`,
//! `continue_final_message`, `chat_template_kwargs`, `add_special_tokens`).
//!
//! `tool_choice`: `"auto"` (the default: the model decides, and `<tool_call>` blocks come back as
//! `tool_calls`) and `"none"` (no parsing) are supported. `"required"` and a named function are
//! refused with a 400 that says why: honouring them means forcing the first tokens into a
//! `<tool_call>` block, and forced tokens are not samples of the policy, whose logprobs the
//! trainer computes.

use super::context::Context;
use super::error::ApiError;
use super::extensions::read_extensions;
use super::fields::{wrong_type, Fields};
use super::openai::{finish_chat_job, Job};
use super::prompts::{check_model, render_chat, token_ids, ChatRender};
use serde_json::{Map, Value};

/// `POST /v1/chat/completions`.
pub fn parse_chat(mut fields: Fields, ctx: &Context<'_>) -> Result<Job, ApiError> {
    check_model(fields.string("model")?, ctx)?;
    let ext = read_extensions(&mut fields)?;
    let tools = read_tools(&mut fields)?;
    let tool_choice_none = read_tool_choice(&mut fields)?;
    let mut how = read_chat_render(&mut fields)?;
    how.add_special_tokens = ext.add_special_tokens.unwrap_or(false);
    if fields.boolean("echo")? == Some(true) {
        return Err(ApiError::field(
            "echo",
            "`echo` is not supported on chat completions (the returned message is what was generated)",
        ));
    }
    let mut messages = fields.take("messages");
    if fields.has("prompt_token_ids")
        && messages
            .as_ref()
            .is_some_and(|m| m == &Value::Array(Vec::new()))
    {
        // Clients whose `messages` is required (the openai package) send [] with token ids.
        messages = None;
    }
    let prompt = match (messages, fields.take("prompt_token_ids")) {
        (Some(_), Some(_)) => {
            return Err(ApiError::field(
                "prompt_token_ids",
                "give `messages` or `prompt_token_ids`, not both",
            ))
        }
        (None, Some(ids)) => (
            token_ids(&ids, "prompt_token_ids", ctx)?,
            "prompt_token_ids",
        ),
        (Some(Value::Array(messages)), None) => {
            if messages.is_empty() {
                return Err(ApiError::field(
                    "messages",
                    "`messages` is empty: a chat needs at least one message",
                ));
            }
            (
                render_chat(&messages, tools.as_deref(), &how, ctx)?,
                "messages",
            )
        }
        (Some(other), None) => return Err(wrong_type("messages", "an array of messages", &other)),
        (None, None) => return Err(ApiError::field("messages", "`messages` is required")),
    };
    let parse_tools = tools.is_some_and(|t| !t.is_empty()) && !tool_choice_none;
    finish_chat_job(fields, ctx, ext, prompt, parse_tools)
}

/// The `/v1/chat/completions/tokens` variant (prime-rl's vLLM route, used by verifiers): the
/// prompt is `tokens`, the conversation's exact ids so far; `messages` only describe it.
pub fn parse_chat_tokens(mut fields: Fields, ctx: &Context<'_>) -> Result<Job, ApiError> {
    let tokens = fields.take("tokens").ok_or_else(|| {
        ApiError::field("tokens", "`tokens` (the prompt's token ids) is required")
    })?;
    fields.take("messages");
    fields.insert("prompt_token_ids", tokens);
    // The chat rendering fields describe `messages`, which are not rendered here.
    for name in [
        "add_generation_prompt",
        "continue_final_message",
        "chat_template_kwargs",
    ] {
        fields.take(name);
    }
    parse_chat(fields, ctx)
}

fn read_tools(fields: &mut Fields) -> Result<Option<Vec<Value>>, ApiError> {
    match fields.take("tools") {
        None => Ok(None),
        Some(Value::Array(tools)) => {
            for (i, tool) in tools.iter().enumerate() {
                let name = tool.get("function").and_then(|f| f.get("name"));
                if !matches!(name, Some(Value::String(s)) if !s.is_empty()) {
                    return Err(ApiError::field(
                        format!("tools[{i}]"),
                        "a tool must be {\"type\": \"function\", \"function\": {\"name\": ..., ...}} with a non-empty name",
                    ));
                }
            }
            Ok(Some(tools))
        }
        Some(other) => Err(wrong_type("tools", "an array", &other)),
    }
}

/// `tool_choice`: true for `"none"`; `"auto"` (or absent) is false; the rest is refused.
fn read_tool_choice(fields: &mut Fields) -> Result<bool, ApiError> {
    let refuse = |what: &str| {
        ApiError::field(
            "tool_choice",
            format!(
                "`tool_choice` {what} is not supported: honouring it means forcing the first tokens into a <tool_call> block, and forced tokens are not samples of the policy (their logprobs are not the trainer's, so RL would train on tokens the model did not choose). Use \"auto\" (the default: the model decides, and its <tool_call> blocks come back as `tool_calls`) or \"none\""
            ),
        )
    };
    match fields.take("tool_choice") {
        None => Ok(false),
        Some(Value::String(s)) if s == "auto" => Ok(false),
        Some(Value::String(s)) if s == "none" => Ok(true),
        Some(Value::String(s)) if s == "required" => Err(refuse("\"required\"")),
        Some(Value::Object(o)) => {
            let name = o
                .get("function")
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str)
                .unwrap_or("?");
            Err(refuse(&format!("naming the function `{name}`")))
        }
        Some(other) => Err(ApiError::field(
            "tool_choice",
            format!("`tool_choice` must be \"auto\", \"none\", \"required\" or a function, found {other}"),
        )),
    }
}

/// The fields that say how messages become a prompt (`add_special_tokens` is read with the
/// extensions by generation, here by `/tokenize`).
pub fn read_chat_render(fields: &mut Fields) -> Result<ChatRender, ApiError> {
    let add_generation_prompt = fields.boolean("add_generation_prompt")?.unwrap_or(true);
    let continue_final_message = fields.boolean("continue_final_message")?.unwrap_or(false);
    let kwargs = match fields.take("chat_template_kwargs") {
        None => Map::new(),
        Some(Value::Object(map)) => map,
        Some(other) => return Err(wrong_type("chat_template_kwargs", "an object", &other)),
    };
    let add_special_tokens = fields.boolean("add_special_tokens")?.unwrap_or(false);
    Ok(ChatRender {
        add_generation_prompt,
        continue_final_message,
        kwargs,
        add_special_tokens,
    })
}
