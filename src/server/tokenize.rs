//! `/tokenize` and `/detokenize` (also under `/v1`), with vLLM's fields: `prompt` (text) or
//! `messages` (+ `tools`, `add_generation_prompt`, `continue_final_message`,
//! `chat_template_kwargs`), `add_special_tokens`, `return_token_strs`.

use super::chat_request::read_chat_render;
use super::context::Context;
use super::error::ApiError;
use super::fields::{wrong_type, Fields};
use super::prompts::{check_model, render_chat, token_ids, tokenize};
use serde_json::Value;

/// A parsed `/tokenize` body.
pub struct Tokenized {
    pub ids: Vec<u32>,
    /// `return_token_strs`: each token's text too.
    pub token_strs: bool,
    pub ignored: Vec<String>,
}

/// `POST /tokenize`: `{"prompt": text}` or `{"messages": [...], "tools"?, ...}`.
pub fn parse_tokenize(mut fields: Fields, ctx: &Context<'_>) -> Result<Tokenized, ApiError> {
    check_model(fields.string("model")?, ctx)?;
    let token_strs = fields.boolean("return_token_strs")?.unwrap_or(false);
    let ids = match (fields.take("prompt"), fields.take("messages")) {
        (Some(Value::String(text)), None) => {
            let add = fields.boolean("add_special_tokens")?.unwrap_or(true);
            tokenize(&text, "prompt", add, ctx)?
        }
        (Some(other), None) => return Err(wrong_type("prompt", "a string", &other)),
        (None, Some(Value::Array(messages))) => {
            if messages.is_empty() {
                return Err(ApiError::field("messages", "`messages` is empty"));
            }
            let tools = match fields.take("tools") {
                None => None,
                Some(Value::Array(t)) => Some(t),
                Some(other) => return Err(wrong_type("tools", "an array", &other)),
            };
            let how = read_chat_render(&mut fields)?;
            render_chat(&messages, tools.as_deref(), &how, ctx)?
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
    Ok(Tokenized {
        ids,
        token_strs,
        ignored: fields.finish(),
    })
}

/// `POST /detokenize`: `{"tokens": [ids]}`; returns the ids and the ignored fields.
pub fn parse_detokenize(
    mut fields: Fields,
    ctx: &Context<'_>,
) -> Result<(Vec<u32>, Vec<String>), ApiError> {
    check_model(fields.string("model")?, ctx)?;
    let ids = match fields.take("tokens") {
        Some(v) => token_ids(&v, "tokens", ctx)?,
        None => return Err(ApiError::field("tokens", "`tokens` is required")),
    };
    Ok((ids, fields.finish()))
}
