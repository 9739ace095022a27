//! The field policy (docs/serving.md, "Field policy"): every field an RL framework sends to a vLLM or
//! SGLang server is implemented with vLLM's meaning, refused, or ignored.
//!
//! - **Refused** ([`refuse_distribution_changers`]): fields that change the distribution sampled
//!   from and are off by default (penalties, `logit_bias`, `bad_words`, `allowed_token_ids`,
//!   guided decoding, beam search, logits processors, LoRA adapters). Their neutral value is
//!   accepted; anything else is a 400 saying why it breaks RL: the tokens would come from a
//!   distribution other than the policy the trainer computes, so the importance ratios are
//!   wrong (RL-SPEC.md, "Sampling during rollouts").
//! - **Accepted and inert** ([`INERT`]): bookkeeping that changes nothing generated (`user`,
//!   `metadata`, `store`, `return_token_ids`: the ids are always returned, ...).
//! - **Ignored with a warning**: everything else the server does not read. vLLM ignores unknown
//!   fields; so does this server, but it names them in the response header
//!   [`IGNORED_FIELDS_HEADER`] and in one log line per request, so a typo (`max_token`) or a
//!   feature this server lacks is seen, never a silent change of behaviour.

use super::error::ApiError;
use super::fields::Fields;
use serde_json::Value;

/// The response header naming the request fields that were ignored (comma-separated).
pub const IGNORED_FIELDS_HEADER: &str = "x-swerve-ignored-fields";

/// Fields accepted for compatibility that change nothing generated.
pub const INERT: &[&str] = &[
    "user",
    "store",
    "metadata",
    "service_tier",
    "safety_identifier",
    "prompt_cache_key",
    // The ids are in every response anyway.
    "return_token_ids",
    "return_prompt_token_ids",
    // vLLM's detokenize switch: text is always returned as well.
    "detokenize",
];

const RL_REASON: &str = "it changes the distribution the tokens are sampled from, so they no \
    longer come from the policy the trainer computes and the RL importance ratios are wrong \
    (RL-SPEC.md, \"Sampling during rollouts\")";

/// How a refused field's neutral (accepted) value looks.
enum Neutral {
    Number(f64),
    EmptyObject,
    EmptyArray,
    False,
    /// Only absent or `null` is accepted.
    Absent,
}

impl Neutral {
    fn accepts(&self, value: &Value) -> bool {
        match self {
            Neutral::Number(n) => value.as_f64() == Some(*n),
            Neutral::EmptyObject => value.as_object().is_some_and(|o| o.is_empty()),
            Neutral::EmptyArray => value.as_array().is_some_and(|a| a.is_empty()),
            Neutral::False => value == &Value::Bool(false),
            Neutral::Absent => false,
        }
    }

    fn describe(&self) -> String {
        match self {
            Neutral::Number(n) => format!("{n}"),
            Neutral::EmptyObject => "{}".into(),
            Neutral::EmptyArray => "[]".into(),
            Neutral::False => "false".into(),
            Neutral::Absent => "null".into(),
        }
    }
}

/// Fields refused unless neutral: (name, neutral value, what it does).
const REFUSED: &[(&str, Neutral, &str)] = &[
    ("frequency_penalty", Neutral::Number(0.0), "a penalty"),
    ("presence_penalty", Neutral::Number(0.0), "a penalty"),
    ("repetition_penalty", Neutral::Number(1.0), "a penalty"),
    (
        "length_penalty",
        Neutral::Number(1.0),
        "a beam-search length penalty",
    ),
    ("logit_bias", Neutral::EmptyObject, "a logit bias"),
    ("bad_words", Neutral::EmptyArray, "banned words"),
    ("allowed_token_ids", Neutral::Absent, "a token whitelist"),
    ("use_beam_search", Neutral::False, "beam search"),
    ("guided_json", Neutral::Absent, "guided decoding"),
    ("guided_regex", Neutral::Absent, "guided decoding"),
    ("guided_choice", Neutral::Absent, "guided decoding"),
    ("guided_grammar", Neutral::Absent, "guided decoding"),
    (
        "guided_whitespace_pattern",
        Neutral::Absent,
        "guided decoding",
    ),
    ("structured_outputs", Neutral::Absent, "guided decoding"),
    ("json_schema", Neutral::Absent, "guided decoding"),
    ("regex", Neutral::Absent, "guided decoding"),
    ("ebnf", Neutral::Absent, "guided decoding"),
    ("structural_tag", Neutral::Absent, "guided decoding"),
    ("logits_processors", Neutral::Absent, "a logits processor"),
    (
        "custom_logit_processor",
        Neutral::Absent,
        "a logits processor",
    ),
    (
        "lora_path",
        Neutral::Absent,
        "a LoRA adapter (another model)",
    ),
    (
        "lora_request",
        Neutral::Absent,
        "a LoRA adapter (another model)",
    ),
];

/// Refuses, with a 400 naming the field and the reason, every field of [`REFUSED`] that is
/// present with a non-neutral value (`prefix` names the object read, e.g. `sampling_params.`).
pub fn refuse_distribution_changers(fields: &mut Fields, prefix: &str) -> Result<(), ApiError> {
    for (name, neutral, what) in REFUSED {
        if let Some(value) = fields.take(name) {
            if !neutral.accepts(&value) {
                let shown = shorten(&value.to_string());
                return Err(ApiError::field(
                    format!("{prefix}{name}"),
                    format!(
                        "`{prefix}{name}` = {shown} is refused: {what} is not supported because {RL_REASON}; only {} is accepted",
                        neutral.describe()
                    ),
                ));
            }
        }
    }
    for name in INERT {
        fields.take(name);
    }
    Ok(())
}

/// `response_format` (OpenAI): only `{"type": "text"}`; JSON modes are guided decoding.
pub fn refuse_response_format(fields: &mut Fields) -> Result<(), ApiError> {
    match fields.take("response_format") {
        None => Ok(()),
        Some(v) if v.get("type").and_then(Value::as_str) == Some("text") => Ok(()),
        Some(v) => Err(ApiError::field(
            "response_format",
            format!(
                "`response_format` = {} is refused: guided decoding is not supported because {RL_REASON}; only {{\"type\": \"text\"}} is accepted",
                shorten(&v.to_string())
            ),
        )),
    }
}

/// `best_of` (vLLM and legacy OpenAI): only 1, or equal to `n` (every sample returned).
pub fn refuse_best_of(fields: &mut Fields, n: usize) -> Result<(), ApiError> {
    match fields.take("best_of") {
        None => Ok(()),
        Some(v) if v.as_u64() == Some(1) || v.as_u64() == Some(n as u64) => Ok(()),
        Some(v) => Err(ApiError::field(
            "best_of",
            format!(
                "`best_of` = {} is refused: returning the best of several samples selects tokens by their probability, which is not sampling from the policy (the RL importance ratios would be wrong); use `n` and choose yourself",
                shorten(&v.to_string())
            ),
        )),
    }
}

fn shorten(s: &str) -> String {
    if s.len() <= 80 {
        return s.to_string();
    }
    let mut end = 77;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &s[..end])
}

/// The one log line for a request that brought fields this server ignored.
pub fn log_ignored(route: &str, ignored: &[String]) {
    if !ignored.is_empty() {
        eprintln!(
            "swerve-serve: {route}: ignored request fields this server does not implement: {}",
            ignored.join(", ")
        );
    }
}
