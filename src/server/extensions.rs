//! vLLM's extension fields that RL frameworks send (docs/serving.md, "Field policy"), read with vLLM's
//! meaning: `min_tokens`, `priority`, `cache_salt`, `include_stop_str_in_output`,
//! `return_tokens_as_token_ids`, `spaces_between_special_tokens`, `prompt_logprobs`,
//! `add_special_tokens` and `request_id`.

use super::error::ApiError;
use super::fields::Fields;
use crate::engine::sampler::MAX_TOP_LOGPROBS;
use crate::engine::RequestOptions;

/// The extension fields of one request.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Extensions {
    /// `min_tokens`, `priority`, `cache_salt` (hashed).
    pub options: RequestOptions,
    /// `include_stop_str_in_output`: the matched stop string (or stop token's text) stays in
    /// the text.
    pub include_stop_str: bool,
    /// `return_tokens_as_token_ids`: logprob entries name tokens as `token_id:N`.
    pub token_ids_as_text: bool,
    /// `prompt_logprobs`: the prompt's logprobs with this many alternatives per position.
    pub prompt_logprobs: Option<usize>,
    /// `add_special_tokens` when given (tokenizing text prompts).
    pub add_special_tokens: Option<bool>,
    /// `request_id`: the id `/abort_request` can name this request by.
    pub request_id: Option<String>,
}

/// The 64-bit key a cache salt isolates prefix-cache entries with (FNV-1a, then mixed: fixed
/// across runs and machines).
pub fn salt_key(salt: &str) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for b in salt.bytes() {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    crate::rng::mix64(h)
}

/// Reads the extension fields (absent or `null`: the defaults).
pub fn read_extensions(fields: &mut Fields) -> Result<Extensions, ApiError> {
    let min_tokens = fields.count("min_tokens")?.unwrap_or(0);
    let priority = match fields.integer("priority")? {
        None => 0,
        Some(p) => i64::try_from(p).map_err(|_| {
            ApiError::field(
                "priority",
                format!("`priority` = {p} is out of range (a 64-bit integer)"),
            )
        })?,
    };
    let cache_salt = match fields.string("cache_salt")? {
        Some(s) if s.is_empty() => {
            return Err(ApiError::field(
                "cache_salt",
                "`cache_salt` must be a non-empty string",
            ))
        }
        s => s.map(|s| salt_key(&s)),
    };
    let include_stop_str = fields
        .boolean("include_stop_str_in_output")?
        .unwrap_or(false);
    let token_ids_as_text = fields
        .boolean("return_tokens_as_token_ids")?
        .unwrap_or(false);
    // Byte-level BPE (Qwen2.5's) decodes added tokens without spaces whichever the value, as
    // vLLM's fast detokenizer does for such tokenizers: read and checked, nothing to change.
    fields.boolean("spaces_between_special_tokens")?;
    let prompt_logprobs = read_prompt_logprobs(fields)?;
    let add_special_tokens = fields.boolean("add_special_tokens")?;
    let request_id = fields.string("request_id")?;
    Ok(Extensions {
        options: RequestOptions {
            min_tokens: min_tokens.min(usize::MAX as u64) as usize,
            priority,
            cache_salt,
        },
        include_stop_str,
        token_ids_as_text,
        prompt_logprobs,
        add_special_tokens,
        request_id,
    })
}

fn read_prompt_logprobs(fields: &mut Fields) -> Result<Option<usize>, ApiError> {
    match fields.integer("prompt_logprobs")? {
        None => Ok(None),
        Some(k) if (0..=MAX_TOP_LOGPROBS as i128).contains(&k) => Ok(Some(k as usize)),
        Some(-1) => Err(ApiError::field(
            "prompt_logprobs",
            format!(
                "`prompt_logprobs` = -1 (the whole vocabulary per position) is not supported: at most {MAX_TOP_LOGPROBS}"
            ),
        )),
        Some(k) => Err(ApiError::field(
            "prompt_logprobs",
            format!("`prompt_logprobs` = {k}: must be between 0 and {MAX_TOP_LOGPROBS}"),
        )),
    }
}
