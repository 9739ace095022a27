//! The chat bodies: `POST /v1/chat/completions` read into a [`Job`], and `POST /v1/tokenize`
//! (text, or `messages` and `tools` rendered with the model's chat template into token ids).
//! The fields the chat endpoint shares with `/v1/completions` (sampling, stops, lengths) are read
//! by [`super::openai`].
//!
//! `/v1/chat/completions`, stage by stage (the order in which a body's errors are found):
//!
//! ```text
//!  model ─► tools ─► tool_choice ─► messages | prompt_token_ids ─► shared fields ─► logprobs
//!        ─► lengths against the context ─► Job (one prompt; tool calls parsed unless "none")
//! ```

use super::error::ApiError;
use super::fields::{wrong_type, Fields};
use super::openai::{
    check_model, finish_job, read_common, resolve_lengths, token_ids, tokenize, Context, Endpoint,
    Job,
};
use crate::chat::Conversation;
use crate::engine::sampler::MAX_TOP_LOGPROBS;
use serde_json::Value;

/// `POST /v1/chat/completions`.
pub fn parse_chat(mut fields: Fields, ctx: &Context<'_>) -> Result<Job, ApiError> {
    check_model(&mut fields, ctx)?;
    let tools = read_tools(&mut fields)?;
    let tool_choice_none = read_tool_choice_none(&mut fields)?;
    fields.ignore(&["parallel_tool_calls"]);
    let add_generation_prompt = fields.boolean("add_generation_prompt")?.unwrap_or(true);
    let (prompt, prompt_field) =
        read_chat_prompt(&mut fields, tools.as_deref(), add_generation_prompt, ctx)?;
    let common = read_common(&mut fields, ctx, &["max_tokens", "max_completion_tokens"])?;
    let logprobs = read_chat_logprobs(&mut fields)?;
    fields.finish()?;
    let prompts = vec![prompt];
    let max_tokens = resolve_lengths(
        &prompts,
        common.max_tokens,
        None,
        prompt_field,
        common.max_tokens_field,
        ctx,
    )?;
    let parse_tools = tools.is_some_and(|t| !t.is_empty()) && !tool_choice_none;
    finish_job(
        Endpoint::Chat,
        prompts,
        vec![None],
        max_tokens,
        common,
        logprobs,
        false,
        parse_tools,
    )
}

/// `tools`: an array of functions, each with a non-empty name.
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

/// `tool_choice`: `"auto"` (the default) or `"none"` (then `true`: no tool calls parsed).
fn read_tool_choice_none(fields: &mut Fields) -> Result<bool, ApiError> {
    match fields.take("tool_choice") {
        None => Ok(false),
        Some(Value::String(s)) if s == "auto" => Ok(false),
        Some(Value::String(s)) if s == "none" => Ok(true),
        Some(other) => Err(ApiError::field(
            "tool_choice",
            format!("`tool_choice` {other} is not supported: use \"auto\" or \"none\""),
        )),
    }
}

/// The prompt as token ids, from `messages` (rendered with the chat template) or
/// `prompt_token_ids`, and the field it came from.
fn read_chat_prompt(
    fields: &mut Fields,
    tools: Option<&[Value]>,
    add_generation_prompt: bool,
    ctx: &Context<'_>,
) -> Result<(Vec<u32>, &'static str), ApiError> {
    let mut messages = fields.take("messages");
    if fields.has("prompt_token_ids")
        && messages
            .as_ref()
            .is_some_and(|m| m == &Value::Array(Vec::new()))
    {
        // Clients whose `messages` is required (the openai package) send [] with token ids.
        messages = None;
    }
    match (messages, fields.take("prompt_token_ids")) {
        (Some(_), Some(_)) => Err(ApiError::field(
            "prompt_token_ids",
            "give `messages` or `prompt_token_ids`, not both",
        )),
        (None, Some(ids)) => Ok((
            token_ids(&ids, "prompt_token_ids", ctx)?,
            "prompt_token_ids",
        )),
        (Some(Value::Array(messages)), None) => {
            if messages.is_empty() {
                return Err(ApiError::field(
                    "messages",
                    "`messages` is empty: a chat needs at least one message",
                ));
            }
            let ids = render_messages(&messages, tools, add_generation_prompt, ctx)?;
            Ok((ids, "messages"))
        }
        (Some(other), None) => Err(wrong_type("messages", "an array of messages", &other)),
        (None, None) => Err(ApiError::field("messages", "`messages` is required")),
    }
}

/// `logprobs` (a boolean) and `top_logprobs` (alternatives per token, only with `logprobs`).
fn read_chat_logprobs(fields: &mut Fields) -> Result<Option<usize>, ApiError> {
    let want_logprobs = fields.boolean("logprobs")?.unwrap_or(false);
    let top = fields.count("top_logprobs")?;
    match (want_logprobs, top) {
        (false, Some(k)) if k > 0 => Err(ApiError::field(
            "top_logprobs",
            "`top_logprobs` needs `logprobs: true`",
        )),
        (false, _) => Ok(None),
        (true, None) => Ok(Some(0)),
        (true, Some(k)) if k as usize <= MAX_TOP_LOGPROBS => Ok(Some(k as usize)),
        (true, Some(k)) => Err(ApiError::field(
            "top_logprobs",
            format!("`top_logprobs` = {k}: must be between 0 and {MAX_TOP_LOGPROBS}"),
        )),
    }
}

/// `messages` (and `tools`) rendered with the chat template and tokenized; errors name the
/// message at fault.
fn render_messages(
    messages: &[Value],
    tools: Option<&[Value]>,
    add_generation_prompt: bool,
    ctx: &Context<'_>,
) -> Result<Vec<u32>, ApiError> {
    let conversation = Conversation::new(messages, tools).map_err(path_error("messages"))?;
    let text = ctx
        .template
        .render(&conversation, add_generation_prompt)
        .map_err(path_error("messages"))?;
    tokenize(&text, "messages", ctx)
}

/// Maps `"messages[2]: no `role`"`-style errors to a 400 naming `messages[2]`.
fn path_error(default: &'static str) -> impl Fn(anyhow::Error) -> ApiError {
    move |e| {
        let message = format!("{e:#}");
        let path: String = message
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '[' | ']' | '.'))
            .collect();
        let param = if !path.is_empty() && message[path.len()..].starts_with(':') {
            path
        } else {
            default.to_string()
        };
        ApiError::field(param, message)
    }
}

/// `POST /v1/tokenize`: `{"prompt": text}` or `{"messages": [...], "tools"?, "add_generation_prompt"?}`.
pub fn parse_tokenize(mut fields: Fields, ctx: &Context<'_>) -> Result<Vec<u32>, ApiError> {
    check_model(&mut fields, ctx)?;
    let tools = match fields.take("tools") {
        None => None,
        Some(Value::Array(t)) => Some(t),
        Some(other) => return Err(wrong_type("tools", "an array", &other)),
    };
    let add_generation_prompt = fields.boolean("add_generation_prompt")?;
    let ids = match (fields.take("prompt"), fields.take("messages")) {
        (Some(Value::String(text)), None) => {
            if tools.is_some() || add_generation_prompt.is_some() {
                return Err(ApiError::field(
                    "prompt",
                    "`tools` and `add_generation_prompt` go with `messages`, not `prompt`",
                ));
            }
            tokenize(&text, "prompt", ctx)?
        }
        (Some(other), None) => return Err(wrong_type("prompt", "a string", &other)),
        (None, Some(Value::Array(messages))) => {
            if messages.is_empty() {
                return Err(ApiError::field("messages", "`messages` is empty"));
            }
            let add_generation_prompt = add_generation_prompt.unwrap_or(true);
            render_messages(&messages, tools.as_deref(), add_generation_prompt, ctx)?
        }
        (None, Some(other)) => return Err(wrong_type("messages", "an array of messages", &other)),
        (Some(_), Some(_)) => {
            return Err(ApiError::field(
                "messages",
                "give `prompt` or `messages`, not both",
            ))
        }
        (None, None) => {
            return Err(ApiError::field(
                "prompt",
                "`prompt` (text) or `messages` is required",
            ))
        }
    };
    fields.finish()?;
    Ok(ids)
}
