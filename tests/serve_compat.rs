//! swerve-serve as the rollout backend of the RL frameworks people run: each framework's request
//! payloads, exactly as its published client code builds them (file and commit cited at each),
//! replayed over loopback against the server with the scripted model (tests/common/serve.rs),
//! and the response fields that client reads checked. Also the field policy (implemented,
//! refused with a reason, ignored with a header) and vLLM's extension fields end to end.

mod common;

use common::serve::*;
use serde_json::{json, Value};
use swerve::tokenizer::Tokenizer;

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap_or_else(|| panic!("not an id list: {v}"))
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

fn ok(r: &Response) -> Value {
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()
}

fn answer_ids() -> (Vec<u32>, Vec<u32>) {
    let t = Tokenizer::qwen25().unwrap();
    (t.encode(ANSWER_PROMPT).unwrap(), t.encode(ANSWER).unwrap())
}

/// SkyRL's remote inference engine (NovaSky-AI/SkyRL, skyrl-train/skyrl_train/inference_engines/
/// remote_inference_engine.py at 01dc9de5, its sampling params from utils.py
/// `get_vllm_sampling_params` / `get_sglang_sampling_params` at 14b14aaf).
#[test]
fn skyrl_remote_vllm_and_sglang_payloads() {
    let server = Server::start(&scripted_model(), &[]);
    let (prompt, answer) = answer_ids();
    // vLLM backend: the sampling params copied into a /v1/completions body, prompts as id lists.
    let payload = json!({
        "min_tokens": 1, "skip_special_tokens": true, "include_stop_str_in_output": true,
        "max_tokens": 10, "temperature": 1.0, "top_p": 1.0, "top_k": -1, "min_p": 0.0,
        "logprobs": null, "stop": null,
        "model": MODEL_NAME, "prompt": [prompt.clone(), prompt.clone()],
    });
    let body = ok(&server.post("/v1/completions", &payload));
    for (i, choice) in body["choices"].as_array().unwrap().iter().enumerate() {
        // SkyRL asserts the order and re-tokenizes `text`.
        assert_eq!(choice["index"], i);
        assert_eq!(choice["text"], " forty-two.");
        assert_eq!(choice["finish_reason"], "stop");
        assert_eq!(ids(&choice["token_ids"]), answer);
    }
    // SGLang backend: /generate with input_ids as a batch; a list comes back.
    let payload = json!({
        "input_ids": [prompt.clone()],
        "sampling_params": {"skip_special_tokens": true, "no_stop_trim": true,
            "max_new_tokens": 10, "temperature": 1.0, "top_p": 1.0, "top_k": -1, "min_p": 0.0},
    });
    let out = ok(&server.post("/generate", &payload));
    let out = &out.as_array().expect("a batch answers a list")[0];
    assert_eq!(ids(&out["output_ids"]), answer);
    assert_eq!(out["meta_info"]["finish_reason"]["type"], "stop");
    // Its control calls: reset_prefix_cache / flush_cache without a body, sleep {"level"},
    // wake_up {"tags": 1}.
    for path in ["/reset_prefix_cache", "/flush_cache"] {
        let r = server.post_raw(path, &[], b"");
        assert_eq!(r.status, 200, "{path}: {}", r.text());
    }
    ok(&server.post("/sleep", &json!({"level": 1})));
    assert_eq!(server.get("/is_sleeping").json()["is_sleeping"], true);
    ok(&server.post("/wake_up", &json!({"tags": 1})));
    assert_eq!(server.get("/is_sleeping").json()["is_sleeping"], false);
    server.wait_idle();
}

/// prime-rl's orchestrator: chat with `extra_body` (src/prime_rl/orchestrator/client.py at
/// 44b0e3f0: `top_k`, `min_p`, `min_tokens`, `return_tokens_as_token_ids`), the weight update
/// (inference_admin.py at 07858eec: `/pause?mode=keep&clear_cache=false`, `/update_weights
/// {"weight_dir"}`, `/resume`) and `/tokenize` at the root with messages.
#[test]
fn prime_rl_chat_weight_update_and_tokenize() {
    let second = tempfile::tempdir().unwrap();
    write_scripted_model(second.path(), 0xBEEF);
    let server = Server::start(&scripted_model(), &[]);
    let messages = json!([{"role": "user", "content": "Wait five seconds."}]);
    let body = json!({
        "messages": messages, "model": MODEL_NAME, "temperature": 1.0, "top_p": 1.0,
        "max_tokens": 40, "seed": 3, "logprobs": true,
        "top_k": -1, "min_p": 0.0, "min_tokens": 0, "return_tokens_as_token_ids": true,
    });
    let r = ok(&server.post("/v1/chat/completions", &body));
    let choice = &r["choices"][0];
    let tokens = ids(&choice["token_ids"]);
    let content = choice["logprobs"]["content"].as_array().unwrap();
    assert_eq!(content.len(), tokens.len());
    for (entry, id) in content.iter().zip(&tokens) {
        assert_eq!(entry["token"], format!("token_id:{id}"));
    }
    assert_eq!(choice["weight_version_first"], 0);
    // The weight update around a pause that keeps requests.
    ok(&server.post_raw("/pause?mode=keep&clear_cache=false", &[], b""));
    let r = ok(&server.post("/update_weights", &json!({"weight_dir": second.path()})));
    assert_eq!(r["weight_version"], 1);
    ok(&server.post_raw("/resume", &[], b""));
    // Older prime-rl: {"model_path"}; and /reload_weights back to the base model.
    ok(&server.post("/update_weights", &json!({"model_path": second.path()})));
    assert_eq!(
        ok(&server.post("/reload_weights", &json!({})))["weight_version"],
        3
    );
    // vLLM's NCCL update body is refused with what to send instead.
    let err = server
        .post("/update_weights", &json!({"update_info": {}}))
        .assert_error(400, Some("update_info"));
    assert!(err.to_string().contains("weight_dir"));
    let t = ok(&server.post(
        "/tokenize",
        &json!({"model": MODEL_NAME, "messages": messages}),
    ));
    assert_eq!(t["count"], t["tokens"].as_array().unwrap().len());
    assert!(t["max_model_len"].is_u64());
    server.wait_idle();
}

/// verifiers' token client (PrimeIntellect-ai/verifiers, verifiers/clients/
/// openai_chat_completions_token_client.py at 0374f0cd): `/tokenize` at the root (it strips
/// `/v1`) with `add_generation_prompt: false`, then `/v1/chat/completions/tokens` with the exact
/// prompt ids in `tokens`, `max_completion_tokens`, `logprobs` and `return_token_ids`.
#[test]
fn verifiers_token_in_token_out_chat() {
    let server = Server::start(&scripted_model(), &[]);
    let tools = json!([{"type": "function", "function": {"name": "sleep",
        "parameters": {"type": "object", "properties": {"seconds": {"type": "integer"}}}}}]);
    let dummy = json!([{"role": "assistant", "content": "x"}]);
    let base = ok(&server.post(
        "/tokenize",
        &json!({"model": MODEL_NAME, "messages": dummy, "tools": tools, "add_generation_prompt": false}),
    ));
    let full = ok(&server.post(
        "/tokenize",
        &json!({"model": MODEL_NAME, "messages": [dummy[0], {"role": "tool", "content": "ok"}], "tools": tools}),
    ));
    let (base, full) = (ids(&base["tokens"]), ids(&full["tokens"]));
    assert_eq!(full[..base.len() - 1], base[..base.len() - 1]);
    let body = json!({
        "model": MODEL_NAME, "messages": [{"role": "user", "content": "hi"}], "tools": tools,
        "tokens": full, "max_completion_tokens": 40, "logprobs": true, "return_token_ids": true,
    });
    let r = ok(&server.post("/v1/chat/completions/tokens", &body));
    assert_eq!(ids(&r["prompt_token_ids"]), full);
    assert_eq!(r["choices"][0]["finish_reason"], "tool_calls");
    assert_eq!(
        r["choices"][0]["message"]["tool_calls"][0]["function"]["name"],
        "sleep"
    );
    server.wait_idle();
}

/// slime's rollout (THUDM/slime, slime/rollout/sglang_rollout.py at 0044b40d: `/generate` with
/// `sampling_params`, `return_logprob`, `input_ids`; `meta_info.output_token_logprobs` read as
/// [logprob, id, ...]) and its drain (slime/backends/sglang_utils/server_control.py at 15b8e507:
/// `/abort_request {"abort_all": true}`, `/v1/loads`, `/health_generate`).
#[test]
fn slime_generate_abort_and_loads() {
    let server = Server::start(&scripted_model(), &[]);
    let (prompt, answer) = answer_ids();
    let payload = json!({
        "sampling_params": {"temperature": 1.0, "top_p": 1.0, "top_k": -1,
            "max_new_tokens": 10, "stop": null, "stop_token_ids": null,
            "skip_special_tokens": false, "no_stop_trim": true,
            "spaces_between_special_tokens": false},
        "return_logprob": true, "input_ids": prompt,
    });
    let out = ok(&server.post("/generate", &payload));
    let meta = &out["meta_info"];
    let pairs = meta["output_token_logprobs"].as_array().unwrap();
    let tokens: Vec<u32> = pairs
        .iter()
        .map(|p| p[1].as_u64().unwrap() as u32)
        .collect();
    assert_eq!(tokens, answer);
    assert_eq!(ids(&out["output_ids"]), answer);
    assert!(pairs.iter().all(|p| p[0].as_f64().unwrap() <= 0.0));
    assert_eq!(meta["finish_reason"]["type"], "stop");
    assert_eq!(meta["finish_reason"]["matched"], *answer.last().unwrap());
    // no_stop_trim keeps the stop token's text (special tokens not skipped).
    assert_eq!(out["text"], " forty-two.<|im_end|>");
    assert_eq!(meta["weight_version"], "0");
    assert_eq!(meta["prompt_tokens"], prompt.len());
    // A partial rollout: aborted requests come back with finish reason "abort" and their tokens.
    server.post("/pause", &json!({"mode": "keep"}));
    let addr = server.addr;
    let long = json!({"input_ids": prompt, "rid": "r-1", "return_logprob": true,
        "sampling_params": {"max_new_tokens": 50, "ignore_eos": true}});
    let waiter = std::thread::spawn(move || {
        request(addr, "POST", "/generate", &[], long.to_string().as_bytes())
    });
    while server.metric("swerve_sequences_in_flight") < 1.0 {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert_eq!(
        server.get("/v1/loads").json()["loads"][0]["num_total_reqs"],
        1
    );
    ok(&server.post("/abort_request", &json!({"abort_all": true})));
    let aborted = ok(&waiter.join().unwrap());
    assert_eq!(aborted["meta_info"]["finish_reason"]["type"], "abort");
    server.post("/resume", &json!({}));
    assert_eq!(
        server.get("/v1/loads").json()["loads"][0]["num_total_reqs"],
        0
    );
    assert_eq!(server.get("/health_generate").status, 200);
    server.wait_idle();
}

/// verl's SGLang HTTP adapter (volcengine/verl, verl/workers/rollout/sglang_rollout/
/// http_server_engine.py at 03620c95): GET `/health_generate` and `/flush_cache` at start,
/// `/release_memory_occupation` and `/resume_memory_occupation {"tags"}`, `/generate` with the
/// None-valued keys dropped, `/abort_request {"rid", "abort_all"}`.
#[test]
fn verl_http_server_adapter_calls() {
    let server = Server::start(&scripted_model(), &[]);
    let (prompt, answer) = answer_ids();
    assert_eq!(server.get("/health_generate").status, 200);
    assert_eq!(server.get("/flush_cache").status, 200);
    for tags in [json!(["kv_cache"]), json!(null)] {
        let r = ok(&server.post("/release_memory_occupation", &json!({"tags": tags})));
        assert_eq!(r["is_sleeping"], true);
        // Asleep: generation is refused with 503 saying what to do.
        let err = server
            .post("/generate", &json!({"input_ids": prompt}))
            .assert_error(503, None);
        assert!(err.to_string().contains("wake_up"), "{err}");
        ok(&server.post("/resume_memory_occupation", &json!({"tags": tags})));
    }
    let payload = json!({"sampling_params": {"temperature": 0, "max_new_tokens": 10},
        "input_ids": prompt, "return_logprob": false});
    let out = ok(&server.post("/generate", &payload));
    assert_eq!(ids(&out["output_ids"]), answer);
    assert_eq!(out["text"], " forty-two.");
    assert!(out["meta_info"].get("output_token_logprobs").is_none());
    ok(&server.post(
        "/abort_request",
        &json!({"rid": "nothing", "abort_all": false}),
    ));
    server.wait_idle();
}

/// The field policy: fields nobody implements are ignored and named; `null` means the default;
/// fields that change the sampled distribution are refused with the reason; OpenAI's newer
/// shapes (role `developer`) are accepted.
#[test]
fn the_field_policy_ignores_refuses_and_explains() {
    let server = Server::start(&scripted_model(), &[]);
    let body = json!({"prompt": ANSWER_PROMPT, "max_tokens": 10, "x": null, "max_token": 5,
        "frequency_penalty": null, "vllm_xargs": {"a": 1}, "stream_options": null});
    let r = server.post("/v1/completions", &body);
    assert_eq!(ok(&r)["choices"][0]["text"], " forty-two.");
    assert_eq!(
        r.header("x-swerve-ignored-fields"),
        Some("max_token, vllm_xargs")
    );
    assert!(
        server.stderr_comes_to_contain("ignored request fields"),
        "{}",
        server.stderr()
    );
    let refused = [
        (
            "/v1/completions",
            json!({"prompt": "x", "repetition_penalty": 1.1}),
            "repetition_penalty",
        ),
        (
            "/v1/completions",
            json!({"prompt": "x", "logit_bias": {"5": 10}}),
            "logit_bias",
        ),
        (
            "/v1/completions",
            json!({"prompt": "x", "bad_words": ["x"]}),
            "bad_words",
        ),
        (
            "/v1/completions",
            json!({"prompt": "x", "guided_json": {}}),
            "guided_json",
        ),
        (
            "/v1/completions",
            json!({"prompt": "x", "use_beam_search": true}),
            "use_beam_search",
        ),
        (
            "/v1/completions",
            json!({"prompt": "x", "best_of": 3}),
            "best_of",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "x"}],
            "response_format": {"type": "json_object"}}),
            "response_format",
        ),
        (
            "/generate",
            json!({"text": "x", "sampling_params": {"frequency_penalty": 0.5}}),
            "sampling_params.frequency_penalty",
        ),
        (
            "/generate",
            json!({"text": "x", "sampling_params": {"json_schema": "{}"}}),
            "sampling_params.json_schema",
        ),
    ];
    for (path, body, param) in refused {
        let err = server.post(path, &body).assert_error(400, Some(param));
        let message = err["error"]["message"].as_str().unwrap();
        assert!(
            message.contains("policy") || message.contains("sampling from the policy"),
            "{param}: {message}"
        );
    }
    // tool_choice "required" and a named function: refused, saying what is supported.
    let messages = json!([{"role": "developer", "content": "Be brief."},
        {"role": "user", "content": "Wait."}]);
    let tools = json!([{"type": "function", "function": {"name": "sleep", "parameters": {}}}]);
    for choice in [
        json!("required"),
        json!({"type": "function", "function": {"name": "sleep"}}),
    ] {
        let err = server
            .post(
                "/v1/chat/completions",
                &json!({"messages": messages, "tools": tools, "tool_choice": choice}),
            )
            .assert_error(400, Some("tool_choice"));
        assert!(err.to_string().contains("\\\"auto\\\""), "{err}");
    }
    // The developer role renders as the system message.
    let r = ok(&server.post(
        "/v1/chat/completions",
        &json!({"messages": messages, "tools": tools, "max_tokens": 40}),
    ));
    assert_eq!(r["choices"][0]["finish_reason"], "tool_calls");
    let system = ok(&server.post(
        "/tokenize",
        &json!({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Wait."}], "tools": tools}),
    ));
    assert_eq!(r["prompt_token_ids"], system["tokens"]);
    server.wait_idle();
}

/// vLLM's extension fields with vLLM's meaning: `min_tokens` (stop tokens masked, the logprob
/// of the masked distribution), `include_stop_str_in_output`, `cache_salt`, `prompt_logprobs`,
/// `priority`, `chat_template_kwargs`, `continue_final_message`, `add_special_tokens`.
#[test]
fn vllm_extension_fields_keep_their_meaning() {
    let server = Server::start(&scripted_model(), &[]);
    let (prompt, answer) = answer_ids();
    // The script ends with <|im_end|> as its token k; min_tokens k + 1 masks it there.
    let k = answer.len() - 1;
    let body = json!({"prompt": prompt, "max_tokens": k + 2, "min_tokens": k + 1,
        "temperature": 0, "logprobs": 3});
    let r = ok(&server.post("/v1/completions", &body));
    let choice = &r["choices"][0];
    let out = ids(&choice["token_ids"]);
    assert_eq!(out[..k], answer[..k]);
    assert_ne!(out[k], answer[k], "the stop token was masked");
    let masked_lp = choice["logprobs"]["token_logprobs"][k].as_f64().unwrap();
    let tops = choice["logprobs"]["top_logprobs"][k].as_object().unwrap();
    assert!(!tops.contains_key("<|im_end|>"), "{tops:?}");
    // The same token scored in context by the unmasked model (prompt_logprobs of the sequence).
    let mut seq = prompt.clone();
    seq.extend_from_slice(&out[..=k]);
    let scored = ok(&server.post(
        "/v1/completions",
        &json!({"prompt": seq, "max_tokens": 1, "prompt_logprobs": 0}),
    ));
    let pl = &scored["choices"][0]["prompt_logprobs"];
    assert_eq!(pl[0], Value::Null);
    let last = &pl[seq.len() - 1][out[k].to_string()];
    let unmasked_lp = last["logprob"].as_f64().unwrap();
    assert!(last["rank"].as_u64().unwrap() >= 2, "{last}");
    // Renormalised without the near-certain stop token: far more likely than unmasked.
    assert!(
        masked_lp > unmasked_lp + 1.0,
        "{masked_lp} vs {unmasked_lp}"
    );
    // include_stop_str_in_output keeps the matched stop string.
    for (include, text) in [(false, " forty"), (true, " forty-two")] {
        let r = ok(&server.post(
            "/v1/completions",
            &json!({"prompt": ANSWER_PROMPT,
            "max_tokens": 10, "stop": ["-two"], "include_stop_str_in_output": include}),
        ));
        assert_eq!(r["choices"][0]["text"], text);
    }
    // cache_salt: the same prompt shares cached blocks only under the same salt.
    let long: Vec<u32> = (0..40).map(|i| 500 + i).collect();
    let cached = |salt: Value| {
        let r = ok(&server.post(
            "/v1/completions",
            &json!({"prompt": long, "max_tokens": 1,
            "cache_salt": salt, "priority": -3}),
        ));
        r["usage"]["cached_tokens"].as_u64().unwrap()
    };
    assert_eq!(cached(json!("tenant-a")), 0);
    assert_eq!(cached(json!("tenant-a")), 32);
    assert_eq!(cached(json!("tenant-b")), 0);
    assert_eq!(cached(Value::Null), 0);
    server
        .post("/v1/completions", &json!({"prompt": "x", "cache_salt": ""}))
        .assert_error(400, Some("cache_salt"));
    server
        .post(
            "/v1/completions",
            &json!({"prompt": "x", "min_tokens": 20, "max_tokens": 5}),
        )
        .assert_error(400, Some("min_tokens"));
    // continue_final_message: the prompt ends inside the last (assistant) message.
    let msgs = json!([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "The answer is"}]);
    let r = ok(&server.post(
        "/v1/chat/completions",
        &json!({"messages": msgs, "max_tokens": 10,
        "continue_final_message": true, "add_generation_prompt": false,
        "chat_template_kwargs": {"enable_thinking": false}, "add_special_tokens": false}),
    ));
    assert_eq!(r["choices"][0]["message"]["content"], " forty-two.");
    server
        .post(
            "/v1/chat/completions",
            &json!({"messages": msgs, "continue_final_message": true}),
        )
        .assert_error(400, Some("continue_final_message"));
    server.wait_idle();
}

/// The control routes answer bad input with a 400 naming the field, never a 5xx.
#[test]
fn control_routes_refuse_bad_input_naming_the_field() {
    let server = Server::start(&scripted_model(), &[]);
    let cases = [
        ("/sleep", json!({"level": 3}), "level"),
        ("/sleep", json!({"level": "deep"}), "level"),
        ("/wake_up", json!({"tags": ["gpu"]}), "tags"),
        ("/wake_up", json!({"tags": [1]}), "tags[0]"),
        ("/update_weights_from_disk", json!({}), "model_path"),
        (
            "/update_weights_from_disk",
            json!({"model_path": "/nonexistent"}),
            "model_path",
        ),
        ("/update_weights", json!({"weight_dir": 5}), "weight_dir"),
        ("/pause", json!({"mode": "sideways"}), "mode"),
        ("/pause", json!({"clear_cache": "maybe"}), "clear_cache"),
        ("/abort_request", json!({}), "rid"),
        ("/generate", json!({}), "input_ids"),
        (
            "/generate",
            json!({"text": "x", "input_ids": [1]}),
            "input_ids",
        ),
        (
            "/generate",
            json!({"text": "x", "image_data": "a.png"}),
            "image_data",
        ),
        (
            "/generate",
            json!({"text": "x", "sampling_params": [{"n": 1}, {"n": 2}]}),
            "sampling_params",
        ),
        (
            "/generate",
            json!({"input_ids": [1, 999_999]}),
            "input_ids[1]",
        ),
        ("/generate", json!({"text": ""}), "text"),
        (
            "/v1/chat/completions/tokens",
            json!({"messages": []}),
            "tokens",
        ),
        (
            "/v1/completions",
            json!({"prompt": "x", "prompt_logprobs": -1}),
            "prompt_logprobs",
        ),
        (
            "/v1/completions",
            json!({"prompt": "x", "priority": "high"}),
            "priority",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "x"}],
            "chat_template_kwargs": [1]}),
            "chat_template_kwargs",
        ),
    ];
    for (path, body, param) in cases {
        let r = server.post(path, &body);
        r.assert_error(400, Some(param));
    }
    // Nothing was left asleep or paused by the refusals.
    assert_eq!(server.get("/is_sleeping").json()["is_sleeping"], false);
    assert_eq!(server.get("/is_paused").json()["is_paused"], false);
    server.wait_idle();
}
