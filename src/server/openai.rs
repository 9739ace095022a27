//! The OpenAI request bodies this server accepts, read into a [`Job`]: the prompts as token ids
//! and one engine request per choice. Every field is type-checked and range-checked here, with an
//! error naming it; the engine re-validates what it receives. `/v1/completions` and the fields
//! both generation endpoints share are read here; the chat bodies (messages and tools through
//! the chat template) in [`super::chat_request`].
//!
//! Beyond OpenAI's fields (the token-in, token-out extensions vLLM also has):
//! `prompt_token_ids` (instead of `prompt` or `messages`), `top_k`, `min_p`, `stop_token_ids`,
//! `ignore_eos`, `skip_special_tokens`, `add_generation_prompt` (chat), `repetition_penalty`
//! (1 only).

use super::error::ApiError;
use super::fields::{type_name, wrong_type, Fields};
use crate::chat::ChatTemplate;
use crate::engine::sampler::{SamplingError, MAX_TOP_LOGPROBS};
use crate::engine::{GenerationRequest, SamplingParams};
use crate::tokenizer::Tokenizer;
use serde_json::Value;

/// Choices one request may ask for (prompts x `n`).
pub const MAX_CHOICES: usize = 256;
/// Stop strings one request may give.
pub const MAX_STOP_STRINGS: usize = 16;
/// OpenAI's default `max_tokens` for `/v1/completions`.
pub const COMPLETIONS_DEFAULT_MAX_TOKENS: usize = 16;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endpoint {
    Completions,
    Chat,
}

/// Sampling used for fields a request leaves unset: RL-correct (temperature 1, no filters) unless
/// the server was started with `--use-generation-config`.
#[derive(Clone, Debug, PartialEq)]
pub struct SamplingDefaults {
    pub temperature: f32,
    pub top_p: f32,
    pub top_k: Option<usize>,
    pub min_p: f32,
}

impl Default for SamplingDefaults {
    fn default() -> Self {
        let p = SamplingParams::default();
        Self {
            temperature: p.temperature,
            top_p: p.top_p,
            top_k: p.top_k,
            min_p: p.min_p,
        }
    }
}

/// What parsing needs to know about the server.
pub struct Context<'a> {
    pub tokenizer: &'a Tokenizer,
    pub template: &'a ChatTemplate,
    pub served_model_name: &'a str,
    /// Rows of the model's embedding: token ids must be below it.
    pub model_vocab: usize,
    pub max_model_len: usize,
    pub defaults: &'a SamplingDefaults,
    /// Stop ids used unless `ignore_eos` (the tokenizer's `<|im_end|>`, `<|endoftext|>`).
    pub eos_ids: &'a [u32],
}

/// One generation request as the server runs it.
#[derive(Clone, Debug)]
pub struct Job {
    pub endpoint: Endpoint,
    pub prompts: Vec<Vec<u32>>,
    /// The prompt as text where it came as text (for `echo`).
    pub prompt_texts: Vec<Option<String>>,
    pub n: usize,
    /// Per prompt.
    pub max_tokens: Vec<usize>,
    pub params: SamplingParams,
    pub stop_strings: Vec<String>,
    pub stop_ids: Vec<u32>,
    pub stream: bool,
    pub include_usage: bool,
    /// Logprobs wanted, with this many alternatives per token.
    pub logprobs: Option<usize>,
    pub echo: bool,
    pub skip_special_tokens: bool,
    /// Parse `<tool_call>` blocks into `tool_calls` (chat with tools, `tool_choice` not "none").
    pub parse_tool_calls: bool,
}

impl Job {
    /// The engine request of every choice, in choice order (prompt-major: choice `p * n + j`).
    /// With a seed, choice j of a prompt samples with `seed + j`. With `echo` and `logprobs`, the
    /// first choice of each prompt also computes the prompt's logprobs (the others share its
    /// prompt through the prefix cache).
    pub fn requests(&self) -> Vec<GenerationRequest> {
        let mut out = Vec::new();
        for (p, prompt) in self.prompts.iter().enumerate() {
            for j in 0..self.n {
                let mut params = self.params.clone();
                params.seed = params.seed.map(|s| s.wrapping_add(j as u64));
                out.push(GenerationRequest {
                    prompt: prompt.clone(),
                    params,
                    max_tokens: self.max_tokens[p],
                    stop_ids: self.stop_ids.clone(),
                    prompt_logprobs: (j == 0 && self.wants_prompt_logprobs())
                        .then(|| self.logprobs.unwrap_or(0)),
                });
            }
        }
        out
    }

    /// Whether the prompts' own logprobs are returned (completions' `echo` with `logprobs`).
    pub fn wants_prompt_logprobs(&self) -> bool {
        self.echo && self.logprobs.is_some()
    }

    pub fn num_choices(&self) -> usize {
        self.prompts.len() * self.n
    }
}

/// Checks `model`, if given, against the served name.
pub fn check_model(fields: &mut Fields, ctx: &Context<'_>) -> Result<(), ApiError> {
    if let Some(model) = fields.string("model")? {
        if model != ctx.served_model_name {
            return Err(ApiError::field(
                "model",
                format!(
                    "the model `{model}` does not exist; this server serves `{}`",
                    ctx.served_model_name
                ),
            ));
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

pub(super) fn tokenize(text: &str, name: &str, ctx: &Context<'_>) -> Result<Vec<u32>, ApiError> {
    let ids = ctx
        .tokenizer
        .encode(text)
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
type PromptsAndTexts = (Vec<Vec<u32>>, Vec<Option<String>>);

/// `prompt` of /v1/completions: a string, strings, token ids, or lists of token ids.
fn completion_prompts(value: &Value, ctx: &Context<'_>) -> Result<PromptsAndTexts, ApiError> {
    let empty = || ApiError::field("prompt", "`prompt` is empty");
    match value {
        Value::String(text) => Ok((
            vec![tokenize(text, "prompt", ctx)?],
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
                        prompts.push(tokenize(text, &name, ctx)?);
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
fn prompt_token_ids(value: &Value, ctx: &Context<'_>) -> Result<Vec<Vec<u32>>, ApiError> {
    match value {
        Value::Array(items) if !items.is_empty() && items.iter().all(Value::is_array) => items
            .iter()
            .enumerate()
            .map(|(i, v)| token_ids(v, &format!("prompt_token_ids[{i}]"), ctx))
            .collect(),
        _ => Ok(vec![token_ids(value, "prompt_token_ids", ctx)?]),
    }
}

/// Fields both endpoints read the same way.
pub(super) struct Common {
    n: usize,
    pub(super) max_tokens: Option<usize>,
    /// The field `max_tokens` came from (`max_completion_tokens` in chat).
    pub(super) max_tokens_field: &'static str,
    params: SamplingParams,
    stop_strings: Vec<String>,
    stop_ids: Vec<u32>,
    stream: bool,
    include_usage: bool,
    skip_special_tokens: bool,
}

fn sampling_field(e: SamplingError) -> ApiError {
    let param = match e {
        SamplingError::Temperature(_) => "temperature",
        SamplingError::TopP(_) => "top_p",
        SamplingError::TopK(_) => "top_k",
        SamplingError::MinP(_) => "min_p",
        SamplingError::TopLogprobs(_) => "top_logprobs",
        SamplingError::EmptyVocab => "model",
    };
    ApiError::field(param, e.to_string())
}

/// Reads the fields both endpoints share, stage by stage (the order in which a body's errors are
/// found): choices and lengths, sampling, stops, streaming, then the fields accepted only at
/// their neutral values.
pub(super) fn read_common(
    fields: &mut Fields,
    ctx: &Context<'_>,
    max_tokens_names: &[&'static str],
) -> Result<Common, ApiError> {
    let n = read_n(fields)?;
    let (max_tokens, max_tokens_field) = read_max_tokens(fields, max_tokens_names)?;
    let params = read_sampling(fields, ctx)?;
    let (stop_strings, stop_ids) = read_stops(fields, ctx)?;
    let (stream, include_usage) = read_streaming(fields)?;
    let skip_special_tokens = fields.boolean("skip_special_tokens")?.unwrap_or(true);
    accept_neutral_fields(fields)?;
    Ok(Common {
        n,
        max_tokens,
        max_tokens_field,
        params,
        stop_strings,
        stop_ids,
        stream,
        include_usage,
        skip_special_tokens,
    })
}

/// `n`: choices per prompt.
fn read_n(fields: &mut Fields) -> Result<usize, ApiError> {
    let n = fields.count("n")?.unwrap_or(1);
    if n == 0 || n as usize > MAX_CHOICES {
        return Err(ApiError::field(
            "n",
            format!("`n` = {n}: must be between 1 and {MAX_CHOICES}"),
        ));
    }
    Ok(n as usize)
}

/// The completion length under any of its names (the last one given wins), and that name.
fn read_max_tokens(
    fields: &mut Fields,
    names: &[&'static str],
) -> Result<(Option<usize>, &'static str), ApiError> {
    let mut max_tokens = None;
    let mut max_tokens_field = "max_tokens";
    for name in names {
        if let Some(m) = fields.count(name)? {
            if m == 0 {
                return Err(ApiError::field(
                    *name,
                    format!("`{name}` = 0: must be at least 1"),
                ));
            }
            max_tokens = Some(m.min(usize::MAX as u64) as usize);
            max_tokens_field = name;
        }
    }
    Ok((max_tokens, max_tokens_field))
}

/// Temperature, top_p, min_p, top_k and seed over the server's defaults, validated.
fn read_sampling(fields: &mut Fields, ctx: &Context<'_>) -> Result<SamplingParams, ApiError> {
    let d = ctx.defaults;
    let temperature = fields
        .number("temperature")?
        .map_or(d.temperature, |v| v as f32);
    let top_p = fields.number("top_p")?.map_or(d.top_p, |v| v as f32);
    let min_p = fields.number("min_p")?.map_or(d.min_p, |v| v as f32);
    let top_k = match fields.integer("top_k")? {
        None => d.top_k,
        Some(-1) => None,
        Some(k) if k < 0 => {
            return Err(ApiError::field(
                "top_k",
                format!("`top_k` = {k}: must be >= 1, or -1 for no limit"),
            ))
        }
        Some(k) => Some(k.min(usize::MAX as i128) as usize),
    };
    let seed = fields.integer("seed")?.map(|s| s as u64);
    let params = SamplingParams {
        temperature,
        top_p,
        top_k,
        min_p,
        seed,
        top_logprobs: 0,
    };
    params.validate(ctx.model_vocab).map_err(sampling_field)?;
    Ok(params)
}

/// `stop` strings, and the stop ids: the tokenizer's end tokens unless `ignore_eos`, plus
/// `stop_token_ids`.
fn read_stops(fields: &mut Fields, ctx: &Context<'_>) -> Result<(Vec<String>, Vec<u32>), ApiError> {
    let stop_strings = match fields.take("stop") {
        None => Vec::new(),
        Some(Value::String(s)) => vec![s],
        Some(Value::Array(items)) => items
            .iter()
            .enumerate()
            .map(|(i, v)| match v {
                Value::String(s) => Ok(s.clone()),
                other => Err(ApiError::field(
                    format!("stop[{i}]"),
                    format!(
                        "a stop sequence must be a string, found {}",
                        type_name(other)
                    ),
                )),
            })
            .collect::<Result<_, _>>()?,
        Some(other) => {
            return Err(wrong_type(
                "stop",
                "a string or an array of strings",
                &other,
            ))
        }
    };
    if stop_strings.len() > MAX_STOP_STRINGS {
        return Err(ApiError::field(
            "stop",
            format!(
                "{} stop sequences: at most {MAX_STOP_STRINGS}",
                stop_strings.len()
            ),
        ));
    }
    if stop_strings.iter().any(String::is_empty) {
        return Err(ApiError::field("stop", "a stop sequence must not be empty"));
    }
    let ignore_eos = fields.boolean("ignore_eos")?.unwrap_or(false);
    let mut stop_ids = if ignore_eos {
        Vec::new()
    } else {
        ctx.eos_ids.to_vec()
    };
    if let Some(v) = fields.take("stop_token_ids") {
        stop_ids.extend(token_ids(&v, "stop_token_ids", ctx)?);
    }
    Ok((stop_strings, stop_ids))
}

/// `stream` and `stream_options.include_usage` (only with `stream: true`).
fn read_streaming(fields: &mut Fields) -> Result<(bool, bool), ApiError> {
    let stream = fields.boolean("stream")?.unwrap_or(false);
    let include_usage = match fields.take("stream_options") {
        None => false,
        Some(Value::Object(options)) => {
            let mut include = false;
            for (key, value) in options {
                match (key.as_str(), value) {
                    ("include_usage", Value::Bool(b)) => include = b,
                    ("continuous_usage_stats", Value::Bool(_)) | (_, Value::Null) => {}
                    ("include_usage", other) => {
                        return Err(wrong_type(
                            "stream_options.include_usage",
                            "true or false",
                            &other,
                        ))
                    }
                    (other, _) => {
                        return Err(ApiError::field(
                            format!("stream_options.{other}"),
                            format!("unrecognized stream option `{other}`"),
                        ))
                    }
                }
            }
            include
        }
        Some(other) => return Err(wrong_type("stream_options", "an object", &other)),
    };
    if include_usage && !stream {
        return Err(ApiError::field(
            "stream_options",
            "`stream_options` is only allowed with `stream: true`",
        ));
    }
    Ok((stream, include_usage))
}

/// Fields accepted and not used, and those accepted only at their neutral values (anything
/// else would change the distribution sampled).
fn accept_neutral_fields(fields: &mut Fields) -> Result<(), ApiError> {
    fields.ignore(&[
        "user",
        "store",
        "metadata",
        "service_tier",
        "safety_identifier",
        "prompt_cache_key",
        "return_token_ids",
    ]);
    let zero = |v: &Value| v.as_f64() == Some(0.0);
    fields.only_neutral("frequency_penalty", zero, "0")?;
    fields.only_neutral("presence_penalty", zero, "0")?;
    fields.only_neutral("repetition_penalty", |v| v.as_f64() == Some(1.0), "1")?;
    fields.only_neutral(
        "logit_bias",
        |v| v.as_object().is_some_and(|o| o.is_empty()),
        "an empty object",
    )?;
    fields.only_neutral(
        "response_format",
        |v| v.get("type").and_then(Value::as_str) == Some("text"),
        "{\"type\": \"text\"}",
    )?;
    Ok(())
}

/// Every prompt must leave room to generate, and `max_tokens` must fit the context: the counts are
/// in the message. Resolves each prompt's `max_tokens` (`default` when not given, at most what fits).
pub(super) fn resolve_lengths(
    prompts: &[Vec<u32>],
    max_tokens: Option<usize>,
    default: Option<usize>,
    prompt_field: &str,
    max_tokens_field: &str,
    ctx: &Context<'_>,
) -> Result<Vec<usize>, ApiError> {
    let limit = ctx.max_model_len;
    prompts
        .iter()
        .enumerate()
        .map(|(i, prompt)| {
            let name = if prompts.len() > 1 {
                format!("{prompt_field}[{i}]")
            } else {
                prompt_field.to_string()
            };
            if prompt.is_empty() {
                return Err(ApiError::field(name, format!("`{prompt_field}` is empty: no tokens to start from")));
            }
            let room = limit.saturating_sub(prompt.len());
            if room == 0 {
                return Err(ApiError::field(
                    name,
                    format!(
                        "this model's maximum context length is {limit} tokens, but the prompt has {} tokens, which leaves no room to generate",
                        prompt.len()
                    ),
                ));
            }
            match max_tokens {
                Some(m) if m > room => Err(ApiError::field(
                    max_tokens_field,
                    format!(
                        "this model's maximum context length is {limit} tokens, but {} prompt tokens + {m} `{max_tokens_field}` = {} tokens",
                        prompt.len(),
                        prompt.len().saturating_add(m)
                    ),
                )),
                Some(m) => Ok(m),
                None => Ok(default.map_or(room, |d| d.min(room))),
            }
        })
        .collect()
}

/// `POST /v1/completions`.
pub fn parse_completion(mut fields: Fields, ctx: &Context<'_>) -> Result<Job, ApiError> {
    check_model(&mut fields, ctx)?;
    let (prompts, prompt_texts) = match (fields.take("prompt"), fields.take("prompt_token_ids")) {
        (Some(_), Some(_)) => {
            return Err(ApiError::field(
                "prompt_token_ids",
                "give `prompt` or `prompt_token_ids`, not both",
            ))
        }
        (Some(prompt), None) => completion_prompts(&prompt, ctx)?,
        (None, Some(ids)) => {
            let prompts = prompt_token_ids(&ids, ctx)?;
            let texts = vec![None; prompts.len()];
            (prompts, texts)
        }
        (None, None) => return Err(ApiError::field("prompt", "`prompt` is required")),
    };
    let common = read_common(&mut fields, ctx, &["max_tokens"])?;
    let logprobs = match fields.count("logprobs")? {
        None => None,
        Some(k) if k as usize <= MAX_TOP_LOGPROBS => Some(k as usize),
        Some(k) => {
            return Err(ApiError::field(
                "logprobs",
                format!("`logprobs` = {k}: must be between 0 and {MAX_TOP_LOGPROBS}"),
            ))
        }
    };
    let echo = fields.boolean("echo")?.unwrap_or(false);
    fields.only_neutral("best_of", |v| v.as_u64() == Some(1), "1")?;
    fields.only_neutral("suffix", |v| v.as_str() == Some(""), "an empty string")?;
    fields.finish()?;
    let max_tokens = resolve_lengths(
        &prompts,
        common.max_tokens,
        Some(COMPLETIONS_DEFAULT_MAX_TOKENS),
        "prompt",
        "max_tokens",
        ctx,
    )?;
    finish_job(
        Endpoint::Completions,
        prompts,
        prompt_texts,
        max_tokens,
        common,
        logprobs,
        echo,
        false,
    )
}

#[allow(clippy::too_many_arguments)]
pub(super) fn finish_job(
    endpoint: Endpoint,
    prompts: Vec<Vec<u32>>,
    prompt_texts: Vec<Option<String>>,
    max_tokens: Vec<usize>,
    common: Common,
    logprobs: Option<usize>,
    echo: bool,
    parse_tool_calls: bool,
) -> Result<Job, ApiError> {
    let choices = prompts.len().saturating_mul(common.n);
    if choices > MAX_CHOICES {
        return Err(ApiError::field(
            "n",
            format!(
                "{} prompts x n = {} = {choices} choices: at most {MAX_CHOICES}",
                prompts.len(),
                common.n
            ),
        ));
    }
    let mut params = common.params;
    params.top_logprobs = logprobs.unwrap_or(0);
    Ok(Job {
        endpoint,
        prompts,
        prompt_texts,
        n: common.n,
        max_tokens,
        params,
        stop_strings: common.stop_strings,
        stop_ids: common.stop_ids,
        stream: common.stream,
        include_usage: common.include_usage,
        logprobs,
        echo,
        skip_special_tokens: common.skip_special_tokens,
        parse_tool_calls,
    })
}

/// `POST /v1/detokenize`: `{"tokens": [ids]}`.
pub fn parse_detokenize(mut fields: Fields, ctx: &Context<'_>) -> Result<Vec<u32>, ApiError> {
    check_model(&mut fields, ctx)?;
    let ids = match fields.take("tokens") {
        Some(v) => token_ids(&v, "tokens", ctx)?,
        None => return Err(ApiError::field("tokens", "`tokens` is required")),
    };
    fields.finish()?;
    Ok(ids)
}
