//! SGLang's native routes, as slime, verl's SGLang HTTP engine and SkyRL's remote SGLang client
//! call them: `POST /generate` and `POST /abort_request`.
//!
//! `/generate` takes `text` or `input_ids` (one prompt or a batch), `sampling_params`
//! (`max_new_tokens` (128), `min_new_tokens`, `temperature`, `top_p`, `top_k`, `min_p`, `stop`,
//! `stop_token_ids`, `ignore_eos`, `skip_special_tokens`, `no_stop_trim`, `n`,
//! `sampling_seed`, ...), `return_logprob`, `top_logprobs_num`, `logprob_start_len`,
//! `return_text_in_logprobs`, `rid`, `priority`, `extra_key`/`cache_salt`. The body is mapped
//! onto the completions reader, so every field has the same meaning and the same field policy
//! (refused and ignored fields are named under `sampling_params.` where they came from).
//!
//! The answer is SGLang's: per choice `{"text", "output_ids", "meta_info": {"id",
//! "finish_reason": {"type": "stop"|"length"|"abort", ...}, "prompt_tokens",
//! "completion_tokens", "cached_tokens", "weight_version", "output_token_logprobs": [[logprob,
//! id, text|null], ...], ...}}`, an object for one prompt and one sample, else a list. With
//! `stream: true` the whole answer comes as one cumulative SSE event (then `[DONE]`), which is
//! what SGLang's cumulative stream events add up to.

use super::context::Context;
use super::error::ApiError;
use super::fields::{wrong_type, Fields};
use super::generate::{collect, start, ChoiceState, Run};
use super::handler::{
    authorize, both, finish, json_response, mark_ignored, read_body, Routes, Shared,
};
use super::openai::{parse_completion, Job};
use super::response::{logprob_json, Names};
use super::state::AppState;
use axum::body::Body;
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::{json, Map, Value};
use std::sync::Arc;

/// SGLang's default `max_new_tokens`.
const DEFAULT_MAX_NEW_TOKENS: u64 = 128;

pub(super) fn routes(r: Routes) -> Routes {
    let r = both(r, "/generate", post(generate));
    both(r, "/abort_request", post(abort_request))
}

/// A `/generate` body mapped onto the completions reader, and how to shape the answer.
struct Native {
    job: Job,
    /// One prompt given as one (not a list): answered with an object when `n` is 1.
    single: bool,
    rids: Option<Value>,
    text_in_logprobs: bool,
    input_logprobs: bool,
}

/// Renames a `sampling_params` key to its completions name.
fn completions_name(key: &str) -> &str {
    match key {
        "max_new_tokens" => "max_tokens",
        "min_new_tokens" => "min_tokens",
        "sampling_seed" => "seed",
        "no_stop_trim" => "include_stop_str_in_output",
        other => other,
    }
}

/// `input_ids` or `text`, and whether it was one prompt.
fn read_prompt(fields: &mut Fields) -> Result<(Value, bool), ApiError> {
    Ok(match (fields.take("input_ids"), fields.take("text")) {
        (Some(_), Some(_)) => {
            return Err(ApiError::field(
                "input_ids",
                "give `text` or `input_ids`, not both",
            ))
        }
        (Some(ids), None) => {
            let single = ids
                .as_array()
                .is_some_and(|a| !a.iter().any(Value::is_array));
            (ids, single)
        }
        (None, Some(text)) => {
            let single = text.is_string();
            (text, single)
        }
        (None, None) => {
            return Err(ApiError::field(
                "input_ids",
                "`input_ids` or `text` is required",
            ))
        }
    })
}

/// `sampling_params` moved into the completions body under their completions names; returns
/// those names (errors and ignored fields are reported under `sampling_params.`).
fn move_sampling_params(
    fields: &mut Fields,
    body: &mut Map<String, Value>,
) -> Result<Vec<String>, ApiError> {
    let mut from_params = Vec::new();
    match fields.take("sampling_params") {
        None => {}
        Some(Value::Object(params)) => {
            for (k, v) in params {
                let name = completions_name(&k).to_string();
                from_params.push(name.clone());
                body.insert(name, v);
            }
        }
        Some(Value::Array(list)) => match list.first() {
            // One object per prompt, all the same (SGLang's batch form): that object.
            Some(Value::Object(first)) if list.iter().all(|p| p == &list[0]) => {
                for (k, v) in first.clone() {
                    let name = completions_name(&k).to_string();
                    from_params.push(name.clone());
                    body.insert(name, v);
                }
            }
            _ => {
                return Err(ApiError::field(
                    "sampling_params",
                    "different `sampling_params` per prompt are not supported: send one request per setting",
                ))
            }
        },
        Some(other) => return Err(wrong_type("sampling_params", "an object", &other)),
    }
    Ok(from_params)
}

fn parse_generate(mut fields: Fields, ctx: &Context<'_>) -> Result<Native, ApiError> {
    let mut body = Map::new();
    let prompt_field = if fields.has("input_ids") {
        "input_ids"
    } else {
        "text"
    };
    let (prompt, single) = read_prompt(&mut fields)?;
    body.insert("prompt".into(), prompt);
    for unsupported in ["input_embeds", "image_data", "video_data", "audio_data"] {
        if fields.has(unsupported) {
            return Err(ApiError::field(
                unsupported,
                format!("`{unsupported}`: this server serves text models only"),
            ));
        }
    }
    let from_params = move_sampling_params(&mut fields, &mut body)?;
    body.entry("max_tokens")
        .or_insert(json!(DEFAULT_MAX_NEW_TOKENS));
    let return_logprob = fields.boolean("return_logprob")?.unwrap_or(false);
    let top = fields.count("top_logprobs_num")?.unwrap_or(0);
    let start = fields.integer("logprob_start_len")?.unwrap_or(-1);
    if return_logprob {
        body.insert("logprobs".into(), json!(top));
        if start >= 0 {
            body.insert("prompt_logprobs".into(), json!(top));
        }
    }
    let text_in_logprobs = fields.boolean("return_text_in_logprobs")?.unwrap_or(false);
    let rids = fields.take("rid");
    if let Some(Value::String(rid)) = &rids {
        body.insert("request_id".into(), json!(rid));
    }
    for (from, to) in [
        ("extra_key", "cache_salt"),
        ("cache_salt", "cache_salt"),
        ("priority", "priority"),
        ("stream", "stream"),
    ] {
        if let Some(v) = fields.take(from) {
            body.insert(to.into(), v);
        }
    }
    // Everything else at the top level is read (or ignored) by the completions reader.
    for name in fields.finish() {
        body.entry(name).or_insert(Value::Null);
    }
    let mut job = parse_completion(Fields::from_map(body), ctx).map_err(|mut e| {
        if let Some(p) = &e.param {
            if from_params
                .iter()
                .any(|n| p == n || p.starts_with(&format!("{n}[")))
            {
                e.param = Some(format!("sampling_params.{p}"));
            } else if let Some(rest) = p.strip_prefix("prompt") {
                // The prompt came as `input_ids` or `text`: name that field.
                e.param = Some(format!("{prompt_field}{rest}"));
                e.message = e.message.replace("`prompt`", &format!("`{prompt_field}`"));
            }
        }
        e
    })?;
    for name in job.ignored.iter_mut() {
        if from_params.contains(name) {
            *name = format!("sampling_params.{name}");
        }
    }
    job.stream = false;
    Ok(Native {
        job,
        single,
        rids,
        text_in_logprobs,
        input_logprobs: return_logprob && start >= 0,
    })
}

async fn generate(State(state): Shared, headers: HeaderMap, body: Body) -> Response {
    let result = async {
        authorize(&state, &headers)?;
        let bytes = read_body(body).await?;
        let stream = serde_json::from_slice::<Value>(&bytes)
            .ok()
            .and_then(|v| v.get("stream").and_then(Value::as_bool))
            .unwrap_or(false);
        let st = state.clone();
        let native = tokio::task::spawn_blocking(move || {
            parse_generate(Fields::parse(&bytes)?, &st.context())
        })
        .await
        .map_err(|e| ApiError::internal(format!("parsing the request failed: {e}")))??;
        let ignored = native.job.ignored.clone();
        let (inflight, mut events) = start(&state, &native.job).await?;
        let mut run = Run::new(state.clone(), native.job.clone(), inflight);
        collect(&mut run, &mut events).await;
        // An abort is an answer here (finish reason `abort`, the tokens so far); an engine
        // error is not.
        if let Some(error) = run.error() {
            return Err(ApiError::internal(format!("generation failed: {error}")));
        }
        let answer = answer(&run, &native, &state);
        let response = if stream {
            let text = format!("data: {answer}\n\ndata: [DONE]\n\n");
            (
                StatusCode::OK,
                [(header::CONTENT_TYPE, "text/event-stream")],
                text,
            )
                .into_response()
        } else {
            json_response(answer)
        };
        Ok(mark_ignored(response, "/generate", &ignored))
    }
    .await;
    finish(&state, "/generate", result)
}

/// The answer: one object, or a list in choice order.
fn answer(run: &Run, native: &Native, state: &Arc<AppState>) -> Value {
    let outputs: Vec<Value> = run
        .choices
        .iter()
        .enumerate()
        .map(|(i, c)| choice_output(run, native, state, i, c))
        .collect();
    if native.single && outputs.len() == 1 {
        outputs.into_iter().next().expect("one")
    } else {
        Value::Array(outputs)
    }
}

fn choice_output(
    run: &Run,
    native: &Native,
    state: &Arc<AppState>,
    i: usize,
    c: &ChoiceState,
) -> Value {
    let names = Names {
        table: &state.table,
        as_ids: false,
    };
    let entry = |lp: f32, id: u32| {
        let text = if native.text_in_logprobs {
            json!(names.of(id))
        } else {
            Value::Null
        };
        json!([logprob_json(lp), id, text])
    };
    let rid = match &native.rids {
        Some(Value::Array(r)) => r.get(i / run.job.n).cloned().unwrap_or(Value::Null),
        Some(Value::String(r)) if run.choices.len() > 1 => json!(format!("{r}-{i}")),
        Some(r) => r.clone(),
        None => json!(format!("swerve-{i}")),
    };
    let f = c.finish.as_ref().expect("collected");
    let finish_reason = match f.reason {
        "length" => json!({"type": "length", "length": c.tokens.len()}),
        "abort" => json!({"type": "abort", "message": "aborted"}),
        _ => match &c.matched_stop {
            Some(s) => json!({"type": "stop", "matched": s}),
            None => json!({"type": "stop", "matched": c.tokens.last()}),
        },
    };
    let prompt = &run.job.prompts[c.prompt_index];
    let mut meta = json!({
        "id": rid,
        "finish_reason": finish_reason,
        "prompt_tokens": prompt.len(),
        "completion_tokens": c.tokens.len(),
        "cached_tokens": f.cached_tokens,
        "weight_version": state.weight_version_label(),
        "weight_version_first": c.versions.map(|v| v.first),
        "weight_version_last": c.versions.map(|v| v.last),
        "weight_version_change_index": c.versions.and_then(|v| v.change_index),
    });
    if run.job.logprobs.is_some() {
        let out: Vec<Value> = c
            .tokens
            .iter()
            .zip(&c.logprobs)
            .map(|(&id, &lp)| entry(lp, id))
            .collect();
        meta["output_token_logprobs"] = Value::Array(out);
        let tops: Vec<Value> = c
            .top_logprobs
            .iter()
            .map(|alts| Value::Array(alts.iter().map(|&(id, lp)| entry(lp, id)).collect()))
            .collect();
        meta["output_top_logprobs"] = Value::Array(tops);
    }
    if native.input_logprobs {
        if let Some(Some(p)) = run.prompt_logprobs.get(c.prompt_index) {
            let input: Vec<Value> = prompt
                .iter()
                .zip(&p.logprobs)
                .map(|(&id, lp)| match lp {
                    Some(lp) => entry(*lp, id),
                    None => json!([Value::Null, id, Value::Null]),
                })
                .collect();
            meta["input_token_logprobs"] = Value::Array(input);
        }
    }
    json!({"text": c.text(), "output_ids": c.tokens, "meta_info": meta})
}

/// SGLang's `/abort_request {"rid", "abort_all"}`: aborted requests end with finish reason
/// `abort` (on `/generate`) or an error to retry (on the OpenAI routes).
async fn abort_request(State(state): Shared, headers: HeaderMap, body: Body) -> Response {
    let result = async {
        authorize(&state, &headers)?;
        let bytes = read_body(body).await?;
        let mut fields = if bytes.iter().all(u8::is_ascii_whitespace) {
            Fields::from_map(Map::new())
        } else {
            Fields::parse(&bytes)?
        };
        let aborted = if fields.boolean("abort_all")?.unwrap_or(false) {
            state.abort_all()
        } else {
            match fields.string("rid")? {
                Some(rid) if !rid.is_empty() => state.abort_named(&rid),
                _ => {
                    return Err(ApiError::field(
                        "rid",
                        "`rid` (a request id) or `abort_all: true` is required",
                    ))
                }
            }
        };
        Ok(json_response(json!({"aborted_requests": aborted})))
    }
    .await;
    finish(&state, "/abort_request", result)
}
