//! Response bodies: OpenAI's completion and chat shapes plus the token-in, token-out fields
//! (`token_ids` per choice, `prompt_token_ids`, `usage.cached_tokens`, `weight_version`, and per
//! choice `weight_version_first` / `weight_version_last` / `weight_version_change_index`), whole
//! or as stream chunks, and vLLM's `prompt_logprobs`.
//!
//! A choice that ended aborted (shutdown, `/abort_request`, `/pause` with `mode=abort`) or with
//! an engine error has no OpenAI `finish_reason`: the request is answered with an OpenAI error
//! instead (`super::http`; in a stream, an `{"error": ...}` event after the tokens sent so far).

use super::detok::TokenTable;
use super::error::ApiError;
use super::generate::{ChoiceState, Run, Usage};
use super::openai::{Endpoint, Job};
use crate::engine::PromptLogprobs;
use crate::toolcall::{parse_tool_calls, ToolCall, OPEN as TOOL_CALL_OPEN};
use serde_json::{json, Map, Value};

/// JSON has no infinities: a logprob of `-inf` (a token of probability 0) is written as -9999.
pub fn logprob_json(x: f32) -> Value {
    if x.is_finite() {
        json!(x)
    } else {
        json!(-9999.0)
    }
}

/// Ids of one response and the fields every body and chunk repeats.
pub struct Envelope {
    pub id: String,
    pub created: u64,
    pub model: String,
}

fn usage_json(u: Usage) -> Value {
    json!({
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.prompt_tokens + u.completion_tokens,
        "cached_tokens": u.cached_tokens,
        "prompt_tokens_details": {"cached_tokens": u.cached_tokens},
    })
}

/// The tool calls of a finished chat choice and where its content ends: `None` when tool calls
/// are not parsed, or the text has none, or they do not parse (the text is then all content).
fn tool_calls_of(c: &ChoiceState, job: &Job) -> Option<(usize, Vec<ToolCall>)> {
    if !job.parse_tool_calls {
        return None;
    }
    let at = c.text().find(TOOL_CALL_OPEN)?;
    let parsed = parse_tool_calls(c.text()).ok()?;
    (!parsed.tool_calls.is_empty()).then_some((at, parsed.tool_calls))
}

fn tool_call_json(call: &ToolCall, id: &str, index: Option<usize>) -> Value {
    let mut v = json!({
        "id": id,
        "type": "function",
        "function": {"name": call.name, "arguments": call.arguments.to_string()},
    });
    if let Some(i) = index {
        v["index"] = json!(i);
    }
    v
}

fn finish_reason(c: &ChoiceState, tool_calls: bool) -> Value {
    match &c.finish {
        None => Value::Null,
        Some(f) if tool_calls && f.reason == "stop" => json!("tool_calls"),
        Some(f) => json!(f.reason),
    }
}

/// How a logprob entry names a token: its text, or `token_id:N` with vLLM's
/// `return_tokens_as_token_ids` (ids survive where the text of a partial UTF-8 token would not).
#[derive(Clone, Copy)]
pub struct Names<'a> {
    pub table: &'a TokenTable,
    pub as_ids: bool,
}

impl Names<'_> {
    pub fn of(&self, id: u32) -> String {
        if self.as_ids {
            format!("token_id:{id}")
        } else {
            self.table.text(id)
        }
    }

    fn for_job<'a>(run: &'a Run) -> Names<'a> {
        Names {
            table: &run.state.table,
            as_ids: run.job.ext.token_ids_as_text,
        }
    }
}

/// Completions' logprobs object over `tokens`, their logprobs and alternatives.
fn completion_logprobs(
    names: Names<'_>,
    tokens: &[u32],
    logprobs: &[Option<f32>],
    top: &[Vec<(u32, f32)>],
    text_offset_start: usize,
) -> Value {
    let mut offset = text_offset_start;
    let mut offsets = Vec::with_capacity(tokens.len());
    let texts: Vec<String> = tokens
        .iter()
        .map(|&t| {
            offsets.push(offset);
            offset += names.table.text(t).chars().count();
            names.of(t)
        })
        .collect();
    let tops: Vec<Value> = (0..tokens.len())
        .map(|i| match (logprobs[i], top.get(i)) {
            (None, _) => Value::Null,
            (Some(_), Some(alts)) => {
                let mut m = Map::new();
                for &(id, lp) in alts {
                    m.entry(names.of(id)).or_insert(logprob_json(lp));
                }
                Value::Object(m)
            }
            (Some(_), None) => json!({}),
        })
        .collect();
    json!({
        "tokens": texts,
        "token_logprobs": logprobs.iter().map(|lp| lp.map_or(Value::Null, logprob_json)).collect::<Vec<_>>(),
        "top_logprobs": tops,
        "text_offset": offsets,
    })
}

/// Chat's logprobs object: `{"content": [{token, logprob, bytes, top_logprobs}]}`.
fn chat_logprobs(
    names: Names<'_>,
    tokens: &[u32],
    logprobs: &[f32],
    top: &[Vec<(u32, f32)>],
) -> Value {
    let entry = |id: u32, lp: f32| json!({"token": names.of(id), "logprob": logprob_json(lp), "bytes": names.table.raw(id)});
    let content: Vec<Value> = tokens
        .iter()
        .enumerate()
        .map(|(i, &t)| {
            let mut e = entry(t, logprobs[i]);
            e["top_logprobs"] = Value::Array(
                top.get(i)
                    .map(|alts| alts.iter().map(|&(id, lp)| entry(id, lp)).collect())
                    .unwrap_or_default(),
            );
            e
        })
        .collect();
    json!({"content": content})
}

/// The echoed prompt's text and logprobs of choice `c` (completions with `echo`).
fn echo_parts<'a>(run: &'a Run, c: &ChoiceState) -> (String, Option<&'a PromptLogprobs>) {
    let p = c.prompt_index;
    let text = match &run.job.prompt_texts[p] {
        Some(t) => t.clone(),
        None => run
            .state
            .table
            .decode(&run.job.prompts[p], run.job.skip_special_tokens),
    };
    (text, run.prompt_logprobs.get(p).and_then(Option::as_ref))
}

fn tool_call_id(envelope: &Envelope, choice: usize, k: usize) -> String {
    format!(
        "call_{}_{choice}_{k}",
        envelope.id.rsplit('-').next().unwrap_or("0")
    )
}

/// The whole response of a finished run.
pub fn full_response(run: &Run, envelope: &Envelope) -> Value {
    let job = &run.job;
    let names = Names::for_job(run);
    let choices: Vec<Value> = run
        .choices
        .iter()
        .enumerate()
        .map(|(index, c)| {
            let prompt_ids = &job.prompts[c.prompt_index];
            let mut v = match job.endpoint {
                Endpoint::Completions => {
                    let mut text = String::new();
                    let (mut ids, mut lps, mut tops) = (Vec::new(), Vec::new(), Vec::new());
                    if job.echo {
                        let (echo_text, prompt_lps) = echo_parts(run, c);
                        text.push_str(&echo_text);
                        if let Some(p) = prompt_lps {
                            ids.extend_from_slice(prompt_ids);
                            lps.extend(p.logprobs.iter().copied());
                            tops.extend(p.top_logprobs.iter().cloned());
                        }
                    }
                    text.push_str(c.text());
                    ids.extend_from_slice(&c.tokens);
                    lps.extend(c.logprobs.iter().map(|&x| Some(x)));
                    if c.top_logprobs.is_empty() {
                        tops.extend(std::iter::repeat_n(Vec::new(), c.tokens.len()));
                    } else {
                        tops.extend(c.top_logprobs.iter().cloned());
                    }
                    json!({
                        "index": index,
                        "text": text,
                        "logprobs": if job.logprobs.is_some() {
                            completion_logprobs(names, &ids, &lps, &tops, 0)
                        } else {
                            Value::Null
                        },
                        "finish_reason": finish_reason(c, false),
                        "prompt_logprobs": vllm_prompt_logprobs(run, c.prompt_index),
                    })
                }
                Endpoint::Chat => {
                    let calls = tool_calls_of(c, job);
                    let message = match &calls {
                        Some((_, calls)) => {
                            let content = parse_tool_calls(c.text())
                                .map(|p| p.content)
                                .unwrap_or_default();
                            json!({
                                "role": "assistant",
                                "content": if content.is_empty() { Value::Null } else { json!(content) },
                                "tool_calls": calls.iter().enumerate()
                                    .map(|(k, call)| tool_call_json(call, &tool_call_id(envelope, index, k), None))
                                    .collect::<Vec<_>>(),
                            })
                        }
                        None => json!({"role": "assistant", "content": c.text()}),
                    };
                    json!({
                        "index": index,
                        "message": message,
                        "logprobs": if job.logprobs.is_some() {
                            chat_logprobs(names, &c.tokens, &c.logprobs, &c.top_logprobs)
                        } else {
                            Value::Null
                        },
                        "finish_reason": finish_reason(c, calls.is_some()),
                    })
                }
            };
            v["token_ids"] = json!(c.tokens);
            v["prompt_token_ids"] = json!(prompt_ids);
            add_weight_versions(&mut v, c);
            v
        })
        .collect();
    let mut body = json!({
        "id": envelope.id,
        "object": match job.endpoint { Endpoint::Completions => "text_completion", Endpoint::Chat => "chat.completion" },
        "created": envelope.created,
        "model": envelope.model,
        "choices": choices,
        "usage": usage_json(run.usage()),
        "prompt_token_ids": if job.prompts.len() == 1 { json!(job.prompts[0]) } else { Value::Null },
        "weight_version": run.weight_version(),
    });
    if job.endpoint == Endpoint::Chat {
        body["prompt_logprobs"] = vllm_prompt_logprobs(run, 0);
    }
    body
}

/// The weight versions of a choice's first and last tokens, and the index of its first token
/// sampled under other weights than the first token's (null when they are all the same).
fn add_weight_versions(v: &mut Value, c: &ChoiceState) {
    let versions = c.versions;
    v["weight_version_first"] = json!(versions.map(|w| w.first));
    v["weight_version_last"] = json!(versions.map(|w| w.last));
    v["weight_version_change_index"] = json!(versions.and_then(|w| w.change_index));
}

/// vLLM's `prompt_logprobs` of prompt `p` (null unless asked for): `null` for the first token,
/// then per position an object keyed by token id with `logprob`, `rank` and `decoded_token`,
/// holding the prompt's own token and the alternatives asked for.
fn vllm_prompt_logprobs(run: &Run, p: usize) -> Value {
    let (Some(top_n), Some(Some(values))) =
        (run.job.ext.prompt_logprobs, run.prompt_logprobs.get(p))
    else {
        return Value::Null;
    };
    let names = Names::for_job(run);
    let prompt = &run.job.prompts[p];
    let positions = prompt.iter().enumerate().map(|(t, &id)| {
        let Some(Some(lp)) = values.logprobs.get(t) else {
            return Value::Null;
        };
        let mut m = Map::new();
        let entry = |lp: f32, rank: Option<u32>, id: u32| {
            json!({"logprob": logprob_json(lp), "rank": rank, "decoded_token": names.of(id)})
        };
        let rank = values.ranks.get(t).copied().flatten();
        m.insert(id.to_string(), entry(*lp, rank, id));
        let alts = values.top_logprobs.get(t).map_or(&[][..], Vec::as_slice);
        for (r, &(alt, alp)) in alts.iter().take(top_n).enumerate() {
            m.entry(alt.to_string())
                .or_insert_with(|| entry(alp, Some(r as u32 + 1), alt));
        }
        Value::Object(m)
    });
    Value::Array(positions.collect())
}

/// The OpenAI error a run that did not end well is answered with: a choice aborted (503, to be
/// retried) or failed in the engine (500). `None` when every choice ended normally.
pub fn run_error(run: &Run) -> Option<ApiError> {
    (0..run.choices.len()).find_map(|i| run_error_of(run, i))
}

/// The error choice `index` of a run ended with, if it was aborted or failed.
fn run_error_of(run: &Run, index: usize) -> Option<ApiError> {
    let c = &run.choices[index];
    let f = c.finish.as_ref()?;
    if !matches!(f.reason, "abort" | "error") {
        return None;
    }
    Some(match &f.error {
        Some(e) => ApiError::internal(format!("choice {index}: generation failed: {e}")),
        None => {
            let why = if run.state.stopping.load(std::sync::atomic::Ordering::SeqCst) {
                "the server is shutting down"
            } else {
                "aborted by /abort_request or /pause (mode abort)"
            };
            ApiError::unavailable(format!(
                "choice {index}: the request was aborted after {} generated tokens ({why}); send it again",
                c.tokens.len()
            ))
        }
    })
}

fn chunk(run: &Run, envelope: &Envelope, choice: Value) -> Value {
    json!({
        "id": envelope.id,
        "object": match run.job.endpoint { Endpoint::Completions => "text_completion", Endpoint::Chat => "chat.completion.chunk" },
        "created": envelope.created,
        "model": envelope.model,
        "choices": [choice],
    })
}

/// The chunks choice `index` has ready: its start (role, echo, prompt ids), new text and tokens,
/// and its finish. Advances the choice's sent counters.
pub fn choice_chunks(run: &mut Run, envelope: &Envelope, index: usize, out: &mut Vec<Value>) {
    let job = &run.job;
    let names = Names::for_job(run);
    let c = &run.choices[index];
    if c.sent_finish {
        return;
    }
    let finishing = c.finish.is_some();
    let calls = if finishing {
        tool_calls_of(c, job)
    } else {
        None
    };
    let text_end = match &calls {
        Some((at, _)) => (*at).max(c.sent_text),
        None => c.streamable_len(job),
    };
    let mut text = c.text()[c.sent_text.min(text_end)..text_end].to_string();
    let token_range = c.sent_tokens..c.tokens.len();
    let start = !c.sent_start;
    if start && !finishing && run.awaits_prompt_logprobs(index) {
        // The first chunk carries the echoed prompt's logprobs: not before they are here.
        return;
    }
    if start && job.endpoint == Endpoint::Completions && job.echo {
        let (echo_text, _) = echo_parts(run, c);
        text.insert_str(0, &echo_text);
    }
    if !start && !finishing && text.is_empty() && token_range.is_empty() {
        return;
    }
    let tokens = &c.tokens[token_range.clone()];
    let mut choice = match job.endpoint {
        Endpoint::Completions => {
            let logprobs = job.logprobs.map(|_| {
                let (mut ids, mut lps, mut tops) = (Vec::new(), Vec::new(), Vec::new());
                if start && job.echo {
                    if let Some(p) = echo_parts(run, c).1 {
                        ids.extend_from_slice(&job.prompts[c.prompt_index]);
                        lps.extend(p.logprobs.iter().copied());
                        tops.extend(p.top_logprobs.iter().cloned());
                    }
                }
                ids.extend_from_slice(tokens);
                lps.extend(c.logprobs[token_range.clone()].iter().map(|&x| Some(x)));
                for i in token_range.clone() {
                    tops.push(c.top_logprobs.get(i).cloned().unwrap_or_default());
                }
                completion_logprobs(names, &ids, &lps, &tops, c.sent_text)
            });
            json!({"index": index, "text": text, "logprobs": logprobs, "finish_reason": Value::Null})
        }
        Endpoint::Chat => {
            let mut delta = Map::new();
            if start {
                delta.insert("role".into(), json!("assistant"));
            }
            if start || !text.is_empty() {
                delta.insert("content".into(), json!(text));
            }
            if let Some((_, calls)) = &calls {
                let calls: Vec<Value> = calls
                    .iter()
                    .enumerate()
                    .map(|(k, call)| {
                        tool_call_json(call, &tool_call_id(envelope, index, k), Some(k))
                    })
                    .collect();
                delta.insert("tool_calls".into(), Value::Array(calls));
            }
            let logprobs = job.logprobs.map(|_| {
                let top = if c.top_logprobs.is_empty() {
                    &[][..]
                } else {
                    &c.top_logprobs[token_range.clone()]
                };
                chat_logprobs(names, tokens, &c.logprobs[token_range.clone()], top)
            });
            json!({"index": index, "delta": Value::Object(delta), "logprobs": logprobs, "finish_reason": Value::Null})
        }
    };
    choice["token_ids"] = json!(tokens);
    if start {
        choice["prompt_token_ids"] = json!(job.prompts[c.prompt_index]);
    }
    push_chunk(run, envelope, index, choice, calls.is_some(), out);
    let end_text = if finishing { c.text().len() } else { text_end };
    let c = &mut run.choices[index];
    c.sent_start = true;
    c.sent_text = end_text;
    c.sent_tokens = c.tokens.len();
    c.sent_finish = finishing;
}

/// Pushes choice `index`'s chunk; when it is the last one, with its finish reason and weight
/// versions, or, for an aborted or failed choice, followed by OpenAI's stream error event (an
/// `error` object, which clients raise).
fn push_chunk(
    run: &Run,
    envelope: &Envelope,
    index: usize,
    mut choice: Value,
    tool_calls: bool,
    out: &mut Vec<Value>,
) {
    let c = &run.choices[index];
    match (&c.finish, run_error_of(run, index)) {
        (Some(f), None) => {
            choice["finish_reason"] = finish_reason(c, tool_calls);
            add_weight_versions(&mut choice, c);
            let mut v = chunk(run, envelope, choice);
            v["weight_version"] = json!(f.weight_version);
            out.push(v);
        }
        (_, error) => {
            out.push(chunk(run, envelope, choice));
            out.extend(error.map(|e| e.body()));
        }
    }
}

/// The last chunk with `stream_options.include_usage`: no choices, the usage.
pub fn usage_chunk(run: &Run, envelope: &Envelope) -> Value {
    let mut v = chunk(run, envelope, Value::Null);
    v["choices"] = json!([]);
    v["usage"] = usage_json(run.usage());
    v["weight_version"] = json!(run.weight_version());
    v
}
