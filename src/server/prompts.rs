//! Prompts as token ids: the model check, token-id lists, text tokenized (with
//! `add_special_tokens` when asked), `/v1/completions`' `prompt` forms, and chat messages
//! rendered with the model's template (`chat_template_kwargs` passed to it,
//! `continue_final_message` ending the text inside the last message, as HF and vLLM do).

use super::context::Context;
use super::error::ApiError;
use super::fields::{type_name, wrong_type};
use crate::chat::Conversation;
use serde_json::{Map, Value};

/// Checks `model`, if given, against the served name: another name is a 404, as vLLM and
/// OpenAI answer (clients take it as fatal instead of retrying).
pub fn check_model(model: Option<String>, ctx: &Context<'_>) -> Result<(), ApiError> {
    if let Some(model) = model {
        if model != ctx.served_model_name {
            let mut error = ApiError::not_found(format!(
                "The model `{model}` does not exist; this server serves `{}`",
                ctx.served_model_name
            ));
            error.param = Some("model".into());
            return Err(error);
        }
    }
    Ok(())
}

/// Token ids from a JSON array, each below the model's vocabulary.
pub fn token_ids(value: &Value, name: &str, ctx: &Context<'_>) -> Result<Vec<u32>, ApiError> {
    let Value::Array(items) = value else {
        return Err(wrong_type(name, "an array of token ids", value));
    };
    items
        .iter()
        .enumerate()
        .map(|(i, v)| match v.as_u64() {
            Some(t) if (t as usize) < ctx.model_vocab => Ok(t as u32),
            Some(t) => Err(ApiError::field(
                format!("{name}[{i}]"),
                format!(
                    "token id {t} is outside the vocabulary (the model has {} token ids)",
                    ctx.model_vocab
                ),
            )),
            None => Err(ApiError::field(
                format!("{name}[{i}]"),
                format!(
                    "a token id must be a non-negative integer, found {}",
                    type_name(v)
                ),
            )),
        })
        .collect()
}

/// Tokenizes `text` (with the tokenizer's special tokens added when `add_special_tokens`, a
/// no-op for Qwen2.5's, which adds none); every id must be below the model's vocabulary.
pub fn tokenize(
    text: &str,
    name: &str,
    add_special_tokens: bool,
    ctx: &Context<'_>,
) -> Result<Vec<u32>, ApiError> {
    let ids = if add_special_tokens {
        ctx.tokenizer
            .hf()
            .encode(text, true)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| anyhow::anyhow!("{e}"))
    } else {
        ctx.tokenizer.encode(text)
    }
    .map_err(|e| ApiError::field(name, format!("cannot tokenize: {e:#}")))?;
    if let Some((i, &t)) = ids
        .iter()
        .enumerate()
        .find(|(_, &t)| t as usize >= ctx.model_vocab)
    {
        return Err(ApiError::field(
            name,
            format!(
                "the text's token {i} is id {t}, outside the model's vocabulary of {} ids (the tokenizer does not match the model)",
                ctx.model_vocab
            ),
        ));
    }
    Ok(ids)
}

/// Prompts as token ids, with their text where they came as text.
pub type PromptsAndTexts = (Vec<Vec<u32>>, Vec<Option<String>>);

/// `prompt` of /v1/completions: a string, strings, token ids, or lists of token ids.
pub fn completion_prompts(
    value: &Value,
    add_special_tokens: bool,
    ctx: &Context<'_>,
) -> Result<PromptsAndTexts, ApiError> {
    let empty = || ApiError::field("prompt", "`prompt` is empty");
    match value {
        Value::String(text) => Ok((
            vec![tokenize(text, "prompt", add_special_tokens, ctx)?],
            vec![Some(text.clone())],
        )),
        Value::Array(items) if items.is_empty() => Err(empty()),
        Value::Array(items) if items.iter().all(Value::is_number) => {
            Ok((vec![token_ids(value, "prompt", ctx)?], vec![None]))
        }
        Value::Array(items) => {
            let mut prompts = Vec::new();
            let mut texts = Vec::new();
            for (i, item) in items.iter().enumerate() {
                let name = format!("prompt[{i}]");
                match item {
                    Value::String(text) => {
                        prompts.push(tokenize(text, &name, add_special_tokens, ctx)?);
                        texts.push(Some(text.clone()));
                    }
                    Value::Array(_) => {
                        prompts.push(token_ids(item, &name, ctx)?);
                        texts.push(None);
                    }
                    other => {
                        return Err(ApiError::field(
                            name,
                            format!(
                                "each prompt must be a string or an array of token ids, found {}",
                                type_name(other)
                            ),
                        ))
                    }
                }
            }
            Ok((prompts, texts))
        }
        other => Err(wrong_type(
            "prompt",
            "a string, an array of strings, or an array of token ids",
            other,
        )),
    }
}

/// `prompt_token_ids`: one list of ids, or several.
pub fn prompt_token_ids(value: &Value, ctx: &Context<'_>) -> Result<Vec<Vec<u32>>, ApiError> {
    match value {
        Value::Array(items) if !items.is_empty() && items.iter().all(Value::is_array) => items
            .iter()
            .enumerate()
            .map(|(i, v)| token_ids(v, &format!("prompt_token_ids[{i}]"), ctx))
            .collect(),
        _ => Ok(vec![token_ids(value, "prompt_token_ids", ctx)?]),
    }
}

/// Maps `"messages[2]: no `role`"`-style errors to a 400 naming `messages[2]`.
pub fn path_error(default: &'static str) -> impl Fn(anyhow::Error) -> ApiError {
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

/// How chat messages become a prompt.
#[derive(Clone, Debug, Default)]
pub struct ChatRender {
    pub add_generation_prompt: bool,
    /// The text ends inside the last message, which the model continues (HF's and vLLM's
    /// `continue_final_message`; not with `add_generation_prompt`).
    pub continue_final_message: bool,
    /// Extra variables for the template (vLLM's `chat_template_kwargs`).
    pub kwargs: Map<String, Value>,
    pub add_special_tokens: bool,
}

/// Messages (and tools) rendered with the model's chat template and tokenized.
pub fn render_chat(
    messages: &[Value],
    tools: Option<&[Value]>,
    how: &ChatRender,
    ctx: &Context<'_>,
) -> Result<Vec<u32>, ApiError> {
    if how.continue_final_message && how.add_generation_prompt {
        return Err(ApiError::field(
            "continue_final_message",
            "`continue_final_message` and `add_generation_prompt` cannot both be true: send `add_generation_prompt: false` to continue the last message",
        ));
    }
    let conversation = Conversation::new(messages, tools).map_err(path_error("messages"))?;
    let mut text = ctx
        .template
        .render_with(&conversation, how.add_generation_prompt, &how.kwargs)
        .map_err(path_error("messages"))?;
    if how.continue_final_message {
        let last = conversation.messages.last().expect("not empty");
        let content = last["content"].as_str().unwrap_or("");
        let trimmed = content.trim();
        let at = text.rfind(trimmed).ok_or_else(|| {
            ApiError::field(
                "continue_final_message",
                "the last message's content is not in the rendered conversation, so it cannot be continued",
            )
        })?;
        // Keep trailing whitespace only where the rendering kept it too (HF's rule).
        let end = if text[at..].starts_with(content.trim_start()) {
            at + content.trim_start().len()
        } else {
            at + trimmed.len()
        };
        text.truncate(end);
    }
    tokenize(&text, "messages", how.add_special_tokens, ctx)
}
