//! The OpenAI request bodies this server accepts, read into a [`Job`]: the prompts as token ids
//! and one engine request per choice. Every field is type-checked and range-checked here, with an
//! error naming it; the engine re-validates what it receives. The field policy (implemented,
//! refused, ignored) is in [`super::policy`]; vLLM's extension fields in [`super::extensions`];
//! prompts in [`super::prompts`]; chat in [`super::chat_request`].
//!
//! Beyond OpenAI's fields (the token-in, token-out extensions vLLM also has):
//! `prompt_token_ids` (instead of `prompt` or `messages`), `top_k`, `min_p`, `stop_token_ids`,
//! `ignore_eos`, `skip_special_tokens`, and the fields of [`super::extensions`].

pub use super::context::{Context, SamplingDefaults};
use super::error::ApiError;
use super::extensions::{read_extensions, Extensions};
use super::fields::{type_name, wrong_type, Fields};
use super::policy::{refuse_best_of, refuse_distribution_changers, refuse_response_format};
use super::prompts::{check_model, completion_prompts, prompt_token_ids, token_ids};
use crate::engine::sampler::{SamplingError, MAX_TOP_LOGPROBS};
use crate::engine::{GenerationRequest, RequestOptions, SamplingParams};
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

/// One generation request as the server runs it.
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
    /// vLLM's extension fields (`min_tokens`, `priority`, `cache_salt`, ...).
    pub ext: Extensions,
    /// Request fields this server ignored (named in a response header and the log).
    pub ignored: Vec<String>,
}

impl Job {
    /// The engine request of every choice, in choice order (prompt-major: choice `p * n + j`).
    /// With a seed, choice j of a prompt samples with `seed + j`. When the prompt's logprobs are
    /// wanted (`echo` with `logprobs`, or `prompt_logprobs`), the first choice of each prompt
    /// computes them (the others share its prompt through the prefix cache).
    pub fn requests(&self) -> Vec<(GenerationRequest, RequestOptions)> {
        let mut out = Vec::new();
        for (p, prompt) in self.prompts.iter().enumerate() {
            for j in 0..self.n {
                let mut params = self.params.clone();
                params.seed = params.seed.map(|s| s.wrapping_add(j as u64));
                let request = GenerationRequest {
                    prompt: prompt.clone(),
                    params,
                    max_tokens: self.max_tokens[p],
                    stop_ids: self.stop_ids.clone(),
                    prompt_logprobs: if j == 0 {
                        self.prompt_logprobs_top_n()
                    } else {
                        None
                    },
                };
                out.push((request, self.ext.options.clone()));
            }
        }
        out
    }

    /// Whether completions' `echo` returns the prompt's logprobs.
    pub fn wants_prompt_logprobs(&self) -> bool {
        self.prompt_logprobs_top_n().is_some()
    }

    /// Alternatives per prompt position when the prompt's logprobs are computed at all.
    fn prompt_logprobs_top_n(&self) -> Option<usize> {
        let echo = (self.echo && self.logprobs.is_some()).then(|| self.logprobs.unwrap_or(0));
        match (echo, self.ext.prompt_logprobs) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        }
    }

    pub fn num_choices(&self) -> usize {
        self.prompts.len() * self.n
    }
}

/// Fields both endpoints read the same way.
struct Common {
    n: usize,
    max_tokens: Option<usize>,
    /// The field `max_tokens` came from (`max_completion_tokens` in chat).
    max_tokens_field: &'static str,
    params: SamplingParams,
    stop_strings: Vec<String>,
    stop_ids: Vec<u32>,
    stream: bool,
    include_usage: bool,
    skip_special_tokens: bool,
    ext: Extensions,
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
/// found): choices and lengths, sampling, stops, streaming, the extensions, then the fields
/// refused unless neutral.
fn read_common(
    fields: &mut Fields,
    ctx: &Context<'_>,
    max_tokens_names: &[&'static str],
    ext: Extensions,
) -> Result<Common, ApiError> {
    let n = read_n(fields)?;
    let (max_tokens, max_tokens_field) = read_max_tokens(fields, max_tokens_names)?;
    let params = read_sampling(fields, ctx)?;
    let (stop_strings, stop_ids) = read_stops(fields, ctx)?;
    let (stream, include_usage) = read_streaming(fields)?;
    let skip_special_tokens = fields.boolean("skip_special_tokens")?.unwrap_or(true);
    refuse_distribution_changers(fields, "")?;
    refuse_response_format(fields)?;
    refuse_best_of(fields, n)?;
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
        ext,
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
                    // Other options (newer OpenAI ones) change nothing this server sends.
                    _ => {}
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

/// Every prompt must leave room to generate, and `max_tokens` must fit the context: the counts are
/// in the message. Resolves each prompt's `max_tokens` (`default` when not given, at most what fits).
fn resolve_lengths(
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
    check_model(fields.string("model")?, ctx)?;
    let ext = read_extensions(&mut fields)?;
    let add_special_tokens = ext.add_special_tokens.unwrap_or(true);
    let (prompts, prompt_texts) = match (fields.take("prompt"), fields.take("prompt_token_ids")) {
        (Some(_), Some(_)) => {
            return Err(ApiError::field(
                "prompt_token_ids",
                "give `prompt` or `prompt_token_ids`, not both",
            ))
        }
        (Some(prompt), None) => completion_prompts(&prompt, add_special_tokens, ctx)?,
        (None, Some(ids)) => {
            let prompts = prompt_token_ids(&ids, ctx)?;
            let texts = vec![None; prompts.len()];
            (prompts, texts)
        }
        (None, None) => return Err(ApiError::field("prompt", "`prompt` is required")),
    };
    let common = read_common(&mut fields, ctx, &["max_tokens"], ext)?;
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
    fields.only_neutral("suffix", |v| v.as_str() == Some(""), "an empty string")?;
    let max_tokens = resolve_lengths(
        &prompts,
        common.max_tokens,
        Some(COMPLETIONS_DEFAULT_MAX_TOKENS),
        "prompt",
        "max_tokens",
        ctx,
    )?;
    finish_job(
        JobShape {
            endpoint: Endpoint::Completions,
            prompts,
            prompt_texts,
            max_tokens,
            logprobs,
            echo,
            parse_tool_calls: false,
        },
        common,
        fields,
    )
}

/// What [`finish_job`] takes besides the common fields.
pub(super) struct JobShape {
    pub endpoint: Endpoint,
    pub prompts: Vec<Vec<u32>>,
    pub prompt_texts: Vec<Option<String>>,
    pub max_tokens: Vec<usize>,
    pub logprobs: Option<usize>,
    pub echo: bool,
    pub parse_tool_calls: bool,
}

/// Checks the choice count and `min_tokens` against the lengths, and builds the job; the fields
/// left unread are the ignored ones.
fn finish_job(shape: JobShape, common: Common, fields: Fields) -> Result<Job, ApiError> {
    let choices = shape.prompts.len().saturating_mul(common.n);
    if choices > MAX_CHOICES {
        return Err(ApiError::field(
            "n",
            format!(
                "{} prompts x n = {} = {choices} choices: at most {MAX_CHOICES}",
                shape.prompts.len(),
                common.n
            ),
        ));
    }
    let min_tokens = common.ext.options.min_tokens;
    if let Some(&shortest) = shape.max_tokens.iter().min().filter(|&&m| min_tokens > m) {
        return Err(ApiError::field(
            "min_tokens",
            format!("`min_tokens` = {min_tokens} is more than the {shortest} tokens `max_tokens` allows"),
        ));
    }
    let mut params = common.params;
    params.top_logprobs = shape.logprobs.unwrap_or(0);
    Ok(Job {
        endpoint: shape.endpoint,
        prompts: shape.prompts,
        prompt_texts: shape.prompt_texts,
        n: common.n,
        max_tokens: shape.max_tokens,
        params,
        stop_strings: common.stop_strings,
        stop_ids: common.stop_ids,
        stream: common.stream,
        include_usage: common.include_usage,
        logprobs: shape.logprobs,
        echo: shape.echo,
        skip_special_tokens: common.skip_special_tokens,
        parse_tool_calls: shape.parse_tool_calls,
        ext: common.ext,
        ignored: fields.finish(),
    })
}

/// The chat endpoint's entry to the shared readers.
pub(super) fn finish_chat_job(
    mut fields: Fields,
    ctx: &Context<'_>,
    ext: Extensions,
    prompt: (Vec<u32>, &'static str),
    parse_tool_calls: bool,
) -> Result<Job, ApiError> {
    let common = read_common(
        &mut fields,
        ctx,
        &["max_tokens", "max_completion_tokens"],
        ext,
    )?;
    let logprobs = read_chat_logprobs(&mut fields)?;
    let prompts = vec![prompt.0];
    let max_tokens = resolve_lengths(
        &prompts,
        common.max_tokens,
        None,
        prompt.1,
        common.max_tokens_field,
        ctx,
    )?;
    finish_job(
        JobShape {
            endpoint: Endpoint::Chat,
            prompts,
            prompt_texts: vec![None],
            max_tokens,
            logprobs,
            echo: false,
            parse_tool_calls,
        },
        common,
        fields,
    )
}

/// Chat's `logprobs` (true/false) and `top_logprobs`.
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
