//! swerve-serve end to end over loopback sockets on the CPU backend, with the scripted Qwen-vocab
//! model (tests/common/serve.rs): completions and chat (tools, stop strings, logprobs, echo,
//! streaming), token-in/token-out, greedy equal to the engine's, seeds, every bad-input case.
//! The life cycle (API key, pause, reloads, metrics, 429, SIGTERM) is in serve_lifecycle.rs.

mod common;

use common::serve::*;
use serde_json::{json, Value};
use swerve::backend::cpu::CpuBackend;
use swerve::engine::{Engine, EngineConfig, EngineEvent, GenerationRequest, SamplingParams};
use swerve::model::Qwen2Model;
use swerve::tokenizer::Tokenizer;

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap_or_else(|| panic!("not an id list: {v}"))
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

fn im_end() -> u32 {
    Tokenizer::qwen25().unwrap().token_id("<|im_end|>").unwrap()
}

#[test]
fn completions_chat_tools_streaming_logprobs_and_token_ids() {
    let server = Server::start(&scripted_model(), &[]);
    let tokenizer = Tokenizer::qwen25().unwrap();
    let (prompt_ids, answer_ids) = completions_text_and_token_ids(&server, &tokenizer);
    completions_stops_and_lengths(&server, &prompt_ids, &answer_ids);
    let echo_prompt_logprobs = completions_logprobs_and_echo(&server, &prompt_ids);
    let out_ids = chat_tool_calls(&server, &tokenizer);
    streaming_chat_with_tools(&server, &out_ids);
    streaming_completions_and_n(&server);
    streaming_echo_with_n_and_logprobs(&server, &prompt_ids, &answer_ids, &echo_prompt_logprobs);
    tokenize_models_and_health(&server, &tokenizer);
    server.wait_idle();
}

/// Text in, text and ids out; the stop token ends the choice and is in its ids. Returns the
/// prompt's ids and the answer's.
fn completions_text_and_token_ids(server: &Server, tokenizer: &Tokenizer) -> (Vec<u32>, Vec<u32>) {
    let r = server.post(
        "/v1/completions",
        &json!({"model": MODEL_NAME, "prompt": ANSWER_PROMPT, "max_tokens": 10}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("x-weight-version"), Some("0"));
    let body = r.json();
    let choice = &body["choices"][0];
    assert_eq!(choice["text"], " forty-two.", "{body}");
    assert_eq!(choice["finish_reason"], "stop");
    let answer_ids = tokenizer.encode(ANSWER).unwrap();
    assert_eq!(ids(&choice["token_ids"]), answer_ids);
    assert_eq!(*answer_ids.last().unwrap(), im_end());
    let prompt_ids = tokenizer.encode(ANSWER_PROMPT).unwrap();
    assert_eq!(ids(&body["prompt_token_ids"]), prompt_ids);
    assert_eq!(ids(&choice["prompt_token_ids"]), prompt_ids);
    assert_eq!(body["usage"]["prompt_tokens"], prompt_ids.len());
    assert_eq!(body["usage"]["completion_tokens"], answer_ids.len());
    assert_eq!(
        body["usage"]["total_tokens"],
        prompt_ids.len() + answer_ids.len()
    );
    assert!(body["usage"]["cached_tokens"].is_u64());
    assert_eq!(body["weight_version"], 0);
    assert_eq!(body["object"], "text_completion");
    (prompt_ids, answer_ids)
}

/// The prompt as token ids, a stop string, and `max_tokens`.
fn completions_stops_and_lengths(server: &Server, prompt_ids: &[u32], answer_ids: &[u32]) {
    // The same prompt as token ids, through `prompt` and through `prompt_token_ids`.
    for key in ["prompt", "prompt_token_ids"] {
        let r = server.post(
            "/v1/completions",
            &json!({key: prompt_ids, "max_tokens": 10, "temperature": 0}),
        );
        assert_eq!(r.json()["choices"][0]["text"], " forty-two.", "{key}");
    }

    // A stop string: the text ends before it, the ids end with the token that completed it.
    let r = server.post(
        "/v1/completions",
        &json!({"prompt": ANSWER_PROMPT, "max_tokens": 10, "stop": ["-two", "zzz"]}),
    );
    let choice = &r.json()["choices"][0];
    assert_eq!(choice["text"], " forty", "{choice}");
    assert_eq!(choice["finish_reason"], "stop");
    assert_eq!(ids(&choice["token_ids"]), answer_ids[..2].to_vec());
    assert_eq!(r.json()["usage"]["completion_tokens"], 2);

    // max_tokens cuts it: finish_reason length.
    let r = server.post(
        "/v1/completions",
        &json!({"prompt": ANSWER_PROMPT, "max_tokens": 1}),
    );
    assert_eq!(r.json()["choices"][0]["finish_reason"], "length");
    assert_eq!(r.json()["choices"][0]["text"], " forty");
}

/// Logprobs (legacy completions shape) with alternatives, and echo with prompt logprobs; returns
/// the prompt's logprobs.
fn completions_logprobs_and_echo(server: &Server, prompt_ids: &[u32]) -> Vec<Value> {
    let r = server.post(
        "/v1/completions",
        &json!({"prompt": ANSWER_PROMPT, "max_tokens": 3, "logprobs": 2, "echo": true}),
    );
    let body = r.json();
    let choice = &body["choices"][0];
    assert_eq!(choice["text"], format!("{ANSWER_PROMPT} forty-two."));
    let lp = &choice["logprobs"];
    let n = prompt_ids.len() + 3;
    assert_eq!(lp["tokens"].as_array().unwrap().len(), n, "{lp}");
    assert_eq!(lp["token_logprobs"][0], Value::Null);
    assert_eq!(lp["top_logprobs"][0], Value::Null);
    for t in 1..n {
        let x = lp["token_logprobs"][t].as_f64().unwrap();
        assert!(x <= 0.0 && x > -100.0, "{lp}");
        assert_eq!(lp["top_logprobs"][t].as_object().unwrap().len(), 2, "{lp}");
    }
    // The scripted continuation is near-certain.
    assert!(
        lp["token_logprobs"][prompt_ids.len()].as_f64().unwrap() > -0.01,
        "{lp}"
    );
    assert_eq!(lp["tokens"][prompt_ids.len()], " forty");
    let echo_prompt_logprobs =
        lp["token_logprobs"].as_array().unwrap()[..prompt_ids.len()].to_vec();
    assert_eq!(lp["text_offset"][prompt_ids.len()], ANSWER_PROMPT.len());
    assert_eq!(ids(&choice["token_ids"]).len(), 3);

    echo_prompt_logprobs
}

fn sleep_tool() -> Value {
    json!([{"type": "function", "function": {"name": "sleep", "description": "Sleep.",
        "parameters": {"type": "object", "properties": {"seconds": {"type": "integer"}}}}}])
}

fn wait_messages() -> Value {
    json!([{"role": "user", "content": "Wait five seconds."}])
}

/// Chat with tools: the generated <tool_call> block comes back as OpenAI tool_calls (without
/// tools it stays text). Returns the completion's ids.
fn chat_tool_calls(server: &Server, tokenizer: &Tokenizer) -> Vec<u32> {
    let (tools, messages) = (sleep_tool(), wait_messages());
    let r = server.post("/v1/chat/completions", &json!({"model": MODEL_NAME, "messages": messages, "tools": tools, "max_tokens": 40, "logprobs": true, "top_logprobs": 3}));
    let body = r.json();
    assert_eq!(r.status, 200, "{body}");
    assert_eq!(body["object"], "chat.completion");
    let choice = &body["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{body}");
    let call = &choice["message"]["tool_calls"][0];
    assert_eq!(call["type"], "function");
    assert_eq!(call["function"]["name"], "sleep");
    let args: Value =
        serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(args, json!({"seconds": 5}));
    assert!(call["id"].as_str().unwrap().starts_with("call_"));
    assert_eq!(choice["message"]["content"], Value::Null);
    let out_ids = ids(&choice["token_ids"]);
    assert_eq!(out_ids, tokenizer.encode(CHAT_TOOL_CALL).unwrap());
    let content = choice["logprobs"]["content"].as_array().unwrap();
    assert_eq!(content.len(), out_ids.len());
    assert_eq!(content[0]["token"], "<tool_call>");
    assert_eq!(content[0]["bytes"], json!("<tool_call>".as_bytes()));
    assert_eq!(content[0]["top_logprobs"].as_array().unwrap().len(), 3);
    // The prompt is the chat template's rendering, tokenized.
    let rendered = server
        .post(
            "/v1/tokenize",
            &json!({"messages": messages, "tools": tools}),
        )
        .json();
    assert_eq!(rendered["tokens"], body["prompt_token_ids"]);
    assert_eq!(rendered["count"], body["usage"]["prompt_tokens"]);

    // Without tools (or with tool_choice none) the block stays text.
    let r = server.post(
        "/v1/chat/completions",
        &json!({"messages": messages, "max_tokens": 40}),
    );
    let choice = &r.json()["choices"][0];
    assert_eq!(choice["finish_reason"], "stop");
    assert_eq!(
        choice["message"]["content"],
        CHAT_TOOL_CALL.trim_end_matches("<|im_end|>")
    );
    assert!(choice["message"].get("tool_calls").is_none());

    out_ids
}

/// Streaming chat with tools: role first, tool call at the end, usage, [DONE].
fn streaming_chat_with_tools(server: &Server, out_ids: &[u32]) {
    let (tools, messages) = (sleep_tool(), wait_messages());
    let r = server.post("/v1/chat/completions", &json!({"messages": messages, "tools": tools, "max_tokens": 40, "stream": true, "stream_options": {"include_usage": true}}));
    assert_eq!(r.status, 200);
    assert!(r
        .header("content-type")
        .unwrap()
        .starts_with("text/event-stream"));
    let events = r.events();
    assert_eq!(events.last().unwrap(), "[DONE]");
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    assert_eq!(chunks[0]["object"], "chat.completion.chunk");
    let streamed: Vec<u32> = chunks
        .iter()
        .flat_map(|c| {
            c["choices"]
                .as_array()
                .unwrap()
                .iter()
                .flat_map(|ch| ids(&ch["token_ids"]))
        })
        .collect();
    assert_eq!(streamed, out_ids);
    let last_choice = &chunks[chunks.len() - 2]["choices"][0];
    assert_eq!(last_choice["finish_reason"], "tool_calls");
    assert_eq!(
        last_choice["delta"]["tool_calls"][0]["function"]["name"],
        "sleep"
    );
    assert_eq!(last_choice["delta"]["tool_calls"][0]["index"], 0);
    let usage = &chunks.last().unwrap()["usage"];
    assert_eq!(usage["completion_tokens"], out_ids.len());
    assert_eq!(chunks.last().unwrap()["choices"], json!([]));
    let content: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(content, "");
}

/// Streaming completions with a stop string held back across tokens, and `n` = 3.
fn streaming_completions_and_n(server: &Server) {
    // Streaming completions with a stop string held back across tokens: text never shows it.
    let r = server.post(
        "/v1/completions",
        &json!({"prompt": ANSWER_PROMPT, "max_tokens": 10, "stream": true, "stop": ["two."]}),
    );
    let events = r.events();
    let text: String = events[..events.len() - 1]
        .iter()
        .map(|e| {
            serde_json::from_str::<Value>(e).unwrap()["choices"][0]["text"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(text, " forty-");

    // n = 3 in one request, all sampled (temperature 1) along the script.
    let r = server.post(
        "/v1/completions",
        &json!({"prompt": ANSWER_PROMPT, "max_tokens": 10, "n": 3, "seed": 7}),
    );
    let body = r.json();
    assert_eq!(body["choices"].as_array().unwrap().len(), 3);
    for (i, c) in body["choices"].as_array().unwrap().iter().enumerate() {
        assert_eq!(c["index"], i);
        assert_eq!(c["text"], " forty-two.");
    }
}

/// Streaming with echo, n = 2 and logprobs: each choice's chunks carry its index, the first
/// one the echoed prompt and its prompt ids.
fn streaming_echo_with_n_and_logprobs(
    server: &Server,
    prompt_ids: &[u32],
    answer_ids: &[u32],
    echo_prompt_logprobs: &[Value],
) {
    let r = server.post("/v1/completions", &json!({"prompt": ANSWER_PROMPT, "max_tokens": 10, "n": 2, "stream": true, "echo": true, "logprobs": 1}));
    let events = r.events();
    assert_eq!(events.last().unwrap(), "[DONE]");
    let mut texts = [String::new(), String::new()];
    let mut tokens: [Vec<u32>; 2] = Default::default();
    let mut finishes = [Value::Null, Value::Null];
    for e in &events[..events.len() - 1] {
        let chunk: Value = serde_json::from_str(e).unwrap();
        let choice = &chunk["choices"][0];
        let i = choice["index"].as_u64().unwrap() as usize;
        if texts[i].is_empty() {
            assert_eq!(ids(&choice["prompt_token_ids"]), prompt_ids);
            // The prompt's logprobs come in the first chunk, the same as without streaming.
            let lps = choice["logprobs"]["token_logprobs"].as_array().unwrap();
            assert_eq!(lps[..prompt_ids.len()], echo_prompt_logprobs[..], "{chunk}");
        }
        texts[i].push_str(choice["text"].as_str().unwrap());
        tokens[i].extend(ids(&choice["token_ids"]));
        if !choice["finish_reason"].is_null() {
            finishes[i] = choice["finish_reason"].clone();
            assert_eq!(chunk["weight_version"], 0);
        }
    }
    for i in 0..2 {
        assert_eq!(texts[i], format!("{ANSWER_PROMPT} forty-two."));
        assert_eq!(tokens[i], answer_ids);
        assert_eq!(finishes[i], "stop");
    }
}

/// Tokenize / detokenize round trip; models; health.
fn tokenize_models_and_health(server: &Server, tokenizer: &Tokenizer) {
    let t = server
        .post("/v1/tokenize", &json!({"prompt": "Hello, 世界"}))
        .json();
    assert_eq!(ids(&t["tokens"]), tokenizer.encode("Hello, 世界").unwrap());
    let d = server
        .post("/v1/detokenize", &json!({"tokens": t["tokens"]}))
        .json();
    assert_eq!(d["prompt"], "Hello, 世界");
    let models = server.get("/v1/models").json();
    assert_eq!(models["data"][0]["id"], MODEL_NAME);
    assert_eq!(models["data"][0]["max_model_len"], CONTEXT);
    let health = server.get("/health");
    assert_eq!(health.status, 200);
    assert_eq!(health.json()["status"], "ok");
}

/// Generates greedily with the engine in process, as the reference.
fn engine_greedy(prompts: &[Vec<u32>], max_tokens: usize) -> Vec<(Vec<u32>, Vec<f32>)> {
    let backend = CpuBackend::new();
    let model = Qwen2Model::load(&backend, &scripted_model()).unwrap();
    let mut engine = Engine::new(backend, model, EngineConfig::for_model(CONTEXT, 1024)).unwrap();
    let mut out = vec![(Vec::new(), Vec::new()); prompts.len()];
    let mut ids = Vec::new();
    for p in prompts {
        ids.push(
            engine
                .add_request(GenerationRequest {
                    prompt: p.clone(),
                    params: SamplingParams::greedy(),
                    max_tokens,
                    stop_ids: vec![],
                    prompt_logprobs: None,
                })
                .unwrap(),
        );
    }
    while engine.has_unfinished() {
        for event in engine.step().unwrap() {
            if let EngineEvent::Finished(r) = event {
                let i = ids.iter().position(|&id| id == r.id).unwrap();
                out[i] = (r.output_tokens, r.logprobs);
            }
        }
    }
    out
}

#[test]
fn greedy_equals_the_engine_and_seeds_repeat() {
    let server = Server::start(&scripted_model(), &[]);
    let prompts: Vec<Vec<u32>> = (0..4u64)
        .map(|p| {
            (0..20 + 7 * p)
                .map(|i| ((i * 7919 + p * 104_729) % 150_000) as u32)
                .collect()
        })
        .collect();
    let want = engine_greedy(&prompts, 12);
    // One request with several prompts, and one request per prompt, both equal the engine.
    let r = server.post("/v1/completions", &json!({"prompt": prompts, "max_tokens": 12, "temperature": 0, "ignore_eos": true, "logprobs": 0}));
    let body = r.json();
    assert_eq!(body["prompt_token_ids"], Value::Null);
    for (p, choice) in body["choices"].as_array().unwrap().iter().enumerate() {
        assert_eq!(ids(&choice["token_ids"]), want[p].0, "prompt {p}");
        assert_eq!(ids(&choice["prompt_token_ids"]), prompts[p]);
        let lps = choice["logprobs"]["token_logprobs"].as_array().unwrap();
        for (k, lp) in lps.iter().enumerate() {
            assert!(
                (lp.as_f64().unwrap() - want[p].1[k] as f64).abs() < 1e-4,
                "prompt {p} token {k}"
            );
        }
    }
    for (p, prompt) in prompts.iter().enumerate() {
        let r = server.post("/v1/chat/completions", &json!({"prompt_token_ids": prompt, "max_tokens": 12, "temperature": 0, "ignore_eos": true}));
        assert_eq!(
            ids(&r.json()["choices"][0]["token_ids"]),
            want[p].0,
            "chat, prompt {p}"
        );
    }

    // Same seed, same sample (temperature 1 over a near-uniform distribution); another seed differs.
    let sample = |seed: u64, n: usize| {
        server
            .post("/v1/completions", &json!({"prompt": prompts[0], "max_tokens": 16, "seed": seed, "n": n, "ignore_eos": true, "logprobs": 1}))
            .json()
    };
    let a = sample(1234, 1);
    let b = sample(1234, 1);
    assert_eq!(a["choices"][0]["token_ids"], b["choices"][0]["token_ids"]);
    assert_eq!(a["choices"][0]["logprobs"], b["choices"][0]["logprobs"]);
    let c = sample(1235, 1);
    assert_ne!(a["choices"][0]["token_ids"], c["choices"][0]["token_ids"]);
    // n = 2 with seed s: choice j samples with seed s + j.
    let pair = sample(1234, 2);
    assert_eq!(
        pair["choices"][0]["token_ids"],
        a["choices"][0]["token_ids"]
    );
    assert_eq!(
        pair["choices"][1]["token_ids"],
        c["choices"][0]["token_ids"]
    );
    server.wait_idle();
}

#[test]
fn bad_inputs_get_400_naming_the_field() {
    let server = Server::start(&scripted_model(), &["--max-model-len", "64"]);
    let long: Vec<u32> = vec![100; 60];
    let mut cases = completions_bad_inputs(&long);
    cases.extend(completions_bad_sampling_inputs());
    cases.extend(completions_bad_stop_stream_and_other_inputs());
    cases.extend(chat_and_other_bad_inputs());
    for (path, body, param) in &cases {
        let r = server.post(path, body);
        let err = r.assert_error(400, *param);
        assert_eq!(
            err["error"]["type"], "invalid_request_error",
            "{path} {body}: {err}"
        );
    }
    length_errors_carry_the_token_counts(&server, &long);
    malformed_bodies_get_400(&server);
    unknown_model_gets_404_naming_it(&server);
    // Unknown routes and methods: OpenAI-shaped too.
    server.get("/v1/nothing").assert_error(404, None);
    server.get("/v1/completions").assert_error(405, None);
    // Nothing was admitted, nothing leaked.
    server.wait_idle();
}

/// A bad field (or field combination) per case, against the 64-token context of
/// [`bad_inputs_get_400_naming_the_field`], and the `param` its 400 names.
type BadInput = (&'static str, Value, Option<&'static str>);

/// `/v1/completions` bodies with a bad prompt or length (`long`: 60 of the 64 tokens).
fn completions_bad_inputs(long: &[u32]) -> Vec<BadInput> {
    let too_long: Vec<u32> = vec![100; 64];
    vec![
        ("/v1/completions", json!({"max_tokens": 3}), Some("prompt")),
        ("/v1/completions", json!({"prompt": ""}), Some("prompt")),
        ("/v1/completions", json!({"prompt": []}), Some("prompt")),
        ("/v1/completions", json!({"prompt": 5}), Some("prompt")),
        (
            "/v1/completions",
            json!({"prompt": [1, 2, 999_999]}),
            Some("prompt[2]"),
        ),
        (
            "/v1/completions",
            json!({"prompt": [1, -2]}),
            Some("prompt[1]"),
        ),
        (
            "/v1/completions",
            json!({"prompt": [[1, 2], "x", 3]}),
            Some("prompt[2]"),
        ),
        (
            "/v1/completions",
            json!({"prompt_token_ids": [1, 2, 151_936]}),
            Some("prompt_token_ids[2]"),
        ),
        (
            "/v1/completions",
            json!({"prompt": "x", "prompt_token_ids": [1]}),
            Some("prompt_token_ids"),
        ),
        (
            "/v1/completions",
            json!({"prompt": long, "max_tokens": 5}),
            Some("max_tokens"),
        ),
        (
            "/v1/completions",
            json!({"prompt": too_long}),
            Some("prompt"),
        ),
        (
            "/v1/completions",
            json!({"prompt": "x", "max_tokens": 0}),
            Some("max_tokens"),
        ),
        (
            "/v1/completions",
            json!({"prompt": "x", "max_tokens": "5"}),
            Some("max_tokens"),
        ),
        (
            "/v1/completions",
            json!({"prompt": "x", "max_tokens": 2.5}),
            Some("max_tokens"),
        ),
    ]
}

/// `/v1/completions` bodies with one bad sampling field or `n`.
fn completions_bad_sampling_inputs() -> Vec<BadInput> {
    vec![
        (
            "/v1/completions",
            json!({"prompt": "x", "temperature": -1}),
            Some("temperature"),
        ),
        (
            "/v1/completions",
            json!({"prompt": "x", "temperature": "hot"}),
            Some("temperature"),
        ),
        (
            "/v1/completions",
            json!({"prompt": "x", "top_p": 0}),
            Some("top_p"),
        ),
        (
            "/v1/completions",
            json!({"prompt": "x", "top_p": 1.5}),
            Some("top_p"),
        ),
        (
            "/v1/completions",
            json!({"prompt": "x", "top_k": 0}),
            Some("top_k"),
        ),
        (
            "/v1/completions",
            json!({"prompt": "x", "top_k": -5}),
            Some("top_k"),
        ),
        (
            "/v1/completions",
            json!({"prompt": "x", "min_p": 2}),
            Some("min_p"),
        ),
        (
            "/v1/completions",
            json!({"prompt": "x", "logprobs": 21}),
            Some("logprobs"),
        ),
        ("/v1/completions", json!({"prompt": "x", "n": 0}), Some("n")),
        (
            "/v1/completions",
            json!({"prompt": "x", "n": 1000}),
            Some("n"),
        ),
    ]
}

/// `/v1/completions` bodies with one bad stop, seed or streaming field, or a refused one.
fn completions_bad_stop_stream_and_other_inputs() -> Vec<BadInput> {
    vec![
        (
            "/v1/completions",
            json!({"prompt": "x", "stop": 3}),
            Some("stop"),
        ),
        (
            "/v1/completions",
            json!({"prompt": "x", "stop": ["a", 1]}),
            Some("stop[1]"),
        ),
        (
            "/v1/completions",
            json!({"prompt": "x", "stop": [""]}),
            Some("stop"),
        ),
        (
            "/v1/completions",
            json!({"prompt": "x", "seed": "abc"}),
            Some("seed"),
        ),
        (
            "/v1/completions",
            json!({"prompt": "x", "stream": "yes"}),
            Some("stream"),
        ),
        (
            "/v1/completions",
            json!({"prompt": "x", "stream_options": {"include_usage": true}}),
            Some("stream_options"),
        ),
        (
            "/v1/completions",
            json!({"prompt": "x", "frequency_penalty": 0.5}),
            Some("frequency_penalty"),
        ),
        (
            "/v1/completions",
            json!({"prompt": "x", "logit_bias": {"5": 10}}),
            Some("logit_bias"),
        ),
        (
            "/v1/completions",
            json!({"prompt": "x", "stop_token_ids": [1, 999_999]}),
            Some("stop_token_ids[1]"),
        ),
    ]
}

/// Chat, tokenize, detokenize and reload bodies, each with one bad field.
fn chat_and_other_bad_inputs() -> Vec<BadInput> {
    let msgs = json!([{"role": "user", "content": "hi"}]);
    vec![
        (
            "/v1/chat/completions",
            json!({"messages": []}),
            Some("messages"),
        ),
        ("/v1/chat/completions", json!({}), Some("messages")),
        (
            "/v1/chat/completions",
            json!({"messages": "hi"}),
            Some("messages"),
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"content": "no role"}]}),
            Some("messages[0]"),
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "a"}, {"role": "wizard", "content": "b"}]}),
            Some("messages[1]"),
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": 5}]}),
            Some("messages[0]"),
        ),
        (
            "/v1/chat/completions",
            json!({"messages": msgs, "tools": {"a": 1}}),
            Some("tools"),
        ),
        (
            "/v1/chat/completions",
            json!({"messages": msgs, "tools": [{"type": "function"}]}),
            Some("tools[0]"),
        ),
        (
            "/v1/chat/completions",
            json!({"messages": msgs, "tool_choice": "required"}),
            Some("tool_choice"),
        ),
        (
            "/v1/chat/completions",
            json!({"messages": msgs, "max_tokens": 1000}),
            Some("max_tokens"),
        ),
        (
            "/v1/chat/completions",
            json!({"messages": msgs, "max_completion_tokens": 1000}),
            Some("max_completion_tokens"),
        ),
        (
            "/v1/chat/completions",
            json!({"messages": msgs, "top_logprobs": 3}),
            Some("top_logprobs"),
        ),
        (
            "/v1/chat/completions",
            json!({"messages": msgs, "logprobs": true, "top_logprobs": 50}),
            Some("top_logprobs"),
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "x".repeat(400)}]}),
            Some("messages"),
        ),
        ("/v1/tokenize", json!({"prompt": 5}), Some("prompt")),
        ("/v1/tokenize", json!({}), Some("prompt")),
        (
            "/v1/detokenize",
            json!({"tokens": [1, "a"]}),
            Some("tokens[1]"),
        ),
        ("/v1/weights/reload", json!({}), Some("path")),
        (
            "/v1/weights/reload",
            json!({"path": "/nonexistent/model"}),
            Some("path"),
        ),
    ]
}

/// Length errors carry the token counts.
fn length_errors_carry_the_token_counts(server: &Server, long: &[u32]) {
    let r = server.post("/v1/completions", &json!({"prompt": long, "max_tokens": 5}));
    let message = r.json()["error"]["message"].as_str().unwrap().to_string();
    assert!(
        message.contains("64") && message.contains("60") && message.contains("65"),
        "{message}"
    );
}

/// Malformed JSON, the wrong top-level type, an empty body.
fn malformed_bodies_get_400(server: &Server) {
    for raw in [
        &b"{\"prompt\": "[..],
        b"[1, 2]",
        b"",
        b"\xff\xfe",
        b"{\"prompt\": \"\\ud800\"}",
    ] {
        server
            .post_raw("/v1/completions", &[], raw)
            .assert_error(400, None);
    }
}

/// An unknown model is a 404 naming it, as vLLM and OpenAI answer.
fn unknown_model_gets_404_naming_it(server: &Server) {
    let msgs = json!([{"role": "user", "content": "hi"}]);
    for path in ["/v1/completions", "/v1/chat/completions"] {
        let body = json!({"prompt": "x", "messages": msgs, "model": "gpt-4"});
        let err = server.post(path, &body).assert_error(404, Some("model"));
        assert!(err["error"]["message"].as_str().unwrap().contains("gpt-4"));
    }
}
