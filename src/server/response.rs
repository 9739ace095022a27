//! Response bodies: OpenAI's completion and chat shapes plus the token-in, token-out fields
//! (`token_ids` per choice, `prompt_token_ids`, `usage.cached_tokens`, `weight_version`), whole
//! or as stream chunks.

use super::detok::TokenTable;
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

/// Completions' logprobs object over `tokens`, their logprobs and alternatives.
fn completion_logprobs(
    table: &TokenTable,
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
            let text = table.text(t);
            offsets.push(offset);
            offset += text.chars().count();
            text
        })
        .collect();
    let tops: Vec<Value> = (0..tokens.len())
        .map(|i| match (logprobs[i], top.get(i)) {
            (None, _) => Value::Null,
            (Some(_), Some(alts)) => {
                let mut m = Map::new();
                for &(id, lp) in alts {
                    m.entry(table.text(id)).or_insert(logprob_json(lp));
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
    table: &TokenTable,
    tokens: &[u32],
    logprobs: &[f32],
    top: &[Vec<(u32, f32)>],
) -> Value {
    let entry = |id: u32, lp: f32| json!({"token": table.text(id), "logprob": logprob_json(lp), "bytes": table.raw(id)});
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
    let table = &run.state.table;
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
                            completion_logprobs(table, &ids, &lps, &tops, 0)
                        } else {
                            Value::Null
                        },
                        "finish_reason": finish_reason(c, false),
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
                            chat_logprobs(table, &c.tokens, &c.logprobs, &c.top_logprobs)
                        } else {
                            Value::Null
                        },
                        "finish_reason": finish_reason(c, calls.is_some()),
                    })
                }
            };
            v["token_ids"] = json!(c.tokens);
            v["prompt_token_ids"] = json!(prompt_ids);
            v
        })
        .collect();
    json!({
        "id": envelope.id,
        "object": match job.endpoint { Endpoint::Completions => "text_completion", Endpoint::Chat => "chat.completion" },
        "created": envelope.created,
        "model": envelope.model,
        "choices": choices,
        "usage": usage_json(run.usage()),
        "prompt_token_ids": if job.prompts.len() == 1 { json!(job.prompts[0]) } else { Value::Null },
        "weight_version": run.weight_version(),
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
    let Some(piece) = pending_piece(run, index) else {
        return;
    };
    let c = &run.choices[index];
    let mut choice = match run.job.endpoint {
        Endpoint::Completions => completion_delta(run, index, &piece),
        Endpoint::Chat => chat_delta(run, envelope, index, &piece),
    };
    choice["token_ids"] = json!(&c.tokens[piece.token_range.clone()]);
    if piece.start {
        choice["prompt_token_ids"] = json!(run.job.prompts[c.prompt_index]);
    }
    out.push(piece_chunk(run, envelope, index, &piece, choice));
    let end_text = if piece.finishing {
        c.text().len()
    } else {
        piece.text_end
    };
    let c = &mut run.choices[index];
    c.sent_start = true;
    c.sent_text = end_text;
    c.sent_tokens = c.tokens.len();
    c.sent_finish = piece.finishing;
}

/// What one choice sends in its next chunk.
struct Piece {
    /// The new text (the echoed prompt first, in a completion's first chunk).
    text: String,
    /// Where the choice's text sent so far will end (tool calls are not streamed as text).
    text_end: usize,
    /// The new tokens.
    token_range: std::ops::Range<usize>,
    /// The choice's first chunk.
    start: bool,
    /// The choice's last chunk.
    finishing: bool,
    /// Parsed tool calls of a finishing chat choice, and where its content ends.
    calls: Option<(usize, Vec<ToolCall>)>,
}

/// What choice `index` has to send now; `None` when nothing (finished and sent, its first chunk
/// waiting for the echoed prompt's logprobs, or no new text or tokens).
fn pending_piece(run: &Run, index: usize) -> Option<Piece> {
    let job = &run.job;
    let c = &run.choices[index];
    if c.sent_finish {
        return None;
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
        return None;
    }
    if start && job.endpoint == Endpoint::Completions && job.echo {
        let (echo_text, _) = echo_parts(run, c);
        text.insert_str(0, &echo_text);
    }
    if !start && !finishing && text.is_empty() && token_range.is_empty() {
        return None;
    }
    Some(Piece {
        text,
        text_end,
        token_range,
        start,
        finishing,
        calls,
    })
}

/// A completion choice's chunk: its text and, if asked, logprobs (the echoed prompt's first).
fn completion_delta(run: &Run, index: usize, piece: &Piece) -> Value {
    let (job, table) = (&run.job, &run.state.table);
    let c = &run.choices[index];
    let token_range = piece.token_range.clone();
    let logprobs = job.logprobs.map(|_| {
        let (mut ids, mut lps, mut tops) = (Vec::new(), Vec::new(), Vec::new());
        if piece.start && job.echo {
            if let Some(p) = echo_parts(run, c).1 {
                ids.extend_from_slice(&job.prompts[c.prompt_index]);
                lps.extend(p.logprobs.iter().copied());
                tops.extend(p.top_logprobs.iter().cloned());
            }
        }
        ids.extend_from_slice(&c.tokens[token_range.clone()]);
        lps.extend(c.logprobs[token_range.clone()].iter().map(|&x| Some(x)));
        for i in token_range.clone() {
            tops.push(c.top_logprobs.get(i).cloned().unwrap_or_default());
        }
        completion_logprobs(table, &ids, &lps, &tops, c.sent_text)
    });
    json!({"index": index, "text": piece.text, "logprobs": logprobs, "finish_reason": Value::Null})
}

/// A chat choice's chunk: a delta with the role (first chunk), content, and tool calls (last
/// chunk), and logprobs if asked.
fn chat_delta(run: &Run, envelope: &Envelope, index: usize, piece: &Piece) -> Value {
    let (job, table) = (&run.job, &run.state.table);
    let c = &run.choices[index];
    let token_range = piece.token_range.clone();
    let mut delta = Map::new();
    if piece.start {
        delta.insert("role".into(), json!("assistant"));
    }
    if piece.start || !piece.text.is_empty() {
        delta.insert("content".into(), json!(piece.text));
    }
    if let Some((_, calls)) = &piece.calls {
        let calls: Vec<Value> = calls
            .iter()
            .enumerate()
            .map(|(k, call)| tool_call_json(call, &tool_call_id(envelope, index, k), Some(k)))
            .collect();
        delta.insert("tool_calls".into(), Value::Array(calls));
    }
    let logprobs = job.logprobs.map(|_| {
        let top = if c.top_logprobs.is_empty() {
            &[][..]
        } else {
            &c.top_logprobs[token_range.clone()]
        };
        let tokens = &c.tokens[token_range.clone()];
        chat_logprobs(table, tokens, &c.logprobs[token_range.clone()], top)
    });
    json!({"index": index, "delta": Value::Object(delta), "logprobs": logprobs, "finish_reason": Value::Null})
}

/// The chunk around `choice`; the last one of a choice also has its finish reason, the weight
/// version that finished it, and its error, if any.
fn piece_chunk(
    run: &Run,
    envelope: &Envelope,
    index: usize,
    piece: &Piece,
    mut choice: Value,
) -> Value {
    if !piece.finishing {
        return chunk(run, envelope, choice);
    }
    let c = &run.choices[index];
    choice["finish_reason"] = finish_reason(c, piece.calls.is_some());
    let mut v = chunk(run, envelope, choice);
    let f = c.finish.as_ref().expect("finishing");
    v["weight_version"] = json!(f.weight_version);
    if let Some(e) = &f.error {
        v["error"] =
            json!({"message": e, "type": "server_error", "param": Value::Null, "code": 500});
    }
    v
}

/// The last chunk with `stream_options.include_usage`: no choices, the usage.
pub fn usage_chunk(run: &Run, envelope: &Envelope) -> Value {
    let mut v = chunk(run, envelope, Value::Null);
    v["choices"] = json!([]);
    v["usage"] = usage_json(run.usage());
    v["weight_version"] = json!(run.weight_version());
    v
}
