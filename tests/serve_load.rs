//! swerve-serve under hostile and heavy traffic, over loopback sockets on the CPU backend:
//! thousands of random and mutated request bodies (and some bytes that are not HTTP at all) never
//! get a 5xx or crash the server; 256 concurrent streaming clients, a quarter of them hanging up
//! mid-stream, all get well-formed streams, and afterwards the KV pool has zero used blocks.

mod common;

use common::serve::*;
use serde_json::{json, Map, Value};
use std::io::{Read, Write};
use std::time::{Duration, Instant};
use swerve::rng::{Rng, SplitMix64};

const KEYS: &[&str] = &[
    "model",
    "prompt",
    "prompt_token_ids",
    "messages",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "n",
    "stop",
    "stop_token_ids",
    "stream",
    "stream_options",
    "logprobs",
    "top_logprobs",
    "echo",
    "tools",
    "tool_choice",
    "ignore_eos",
    "skip_special_tokens",
    "frequency_penalty",
    "logit_bias",
    "user",
    "tokens",
    "path",
    "role",
    "content",
    "tool_calls",
    "function",
    "name",
    "arguments",
    "include_usage",
    "bogus",
    // vLLM's extension fields and the field policy (issue 17).
    "min_tokens",
    "priority",
    "cache_salt",
    "include_stop_str_in_output",
    "return_tokens_as_token_ids",
    "spaces_between_special_tokens",
    "prompt_logprobs",
    "add_special_tokens",
    "chat_template_kwargs",
    "continue_final_message",
    "add_generation_prompt",
    "request_id",
    "repetition_penalty",
    "bad_words",
    "guided_json",
    "response_format",
    "best_of",
    // SGLang's /generate.
    "input_ids",
    "text",
    "sampling_params",
    "max_new_tokens",
    "min_new_tokens",
    "no_stop_trim",
    "return_logprob",
    "top_logprobs_num",
    "logprob_start_len",
    "return_text_in_logprobs",
    "rid",
    "extra_key",
];

fn random_number(rng: &mut SplitMix64) -> Value {
    match rng.below(8) {
        0 => json!(0),
        1 => json!(-1),
        2 => json!(rng.below(5)),
        3 => json!(rng.below(200_000)),
        4 => json!(u64::MAX),
        5 => json!(i64::MIN),
        6 => json!((rng.below(4000) as f64 - 1000.0) / 997.0),
        _ => json!(1e300),
    }
}

fn random_string(rng: &mut SplitMix64) -> String {
    let pieces = [
        "",
        "a",
        "The answer is",
        "<|im_end|>",
        "<tool_call>",
        "{",
        "\n",
        "世界",
        "\u{0}",
        "🎉",
        "user",
        "assistant",
        "system",
        "tool",
        "function",
        "text",
    ];
    (0..rng.below(4)).map(|_| *rng.pick(&pieces)).collect()
}

fn random_value(rng: &mut SplitMix64, depth: usize) -> Value {
    match rng.below(if depth > 3 { 4 } else { 7 }) {
        0 => Value::Null,
        1 => json!(rng.below(2) == 0),
        2 => random_number(rng),
        3 => json!(random_string(rng)),
        4 => Value::Array(
            (0..rng.below(5))
                .map(|_| random_value(rng, depth + 1))
                .collect(),
        ),
        5 => Value::Array(
            (0..rng.below(20))
                .map(|_| json!(rng.below(152_000)))
                .collect(),
        ),
        _ => {
            let mut m = Map::new();
            for _ in 0..rng.below(5) {
                m.insert(rng.pick(KEYS).to_string(), random_value(rng, depth + 1));
            }
            Value::Object(m)
        }
    }
}

/// Valid bodies the mutations start from.
fn seeds() -> Vec<(&'static str, Value)> {
    let msgs = json!([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Wait."},
        {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "sleep", "arguments": "{\"seconds\": 1}"}}]},
        {"role": "tool", "content": "done"}]);
    let tools = json!([{"type": "function", "function": {"name": "sleep", "parameters": {"type": "object"}}}]);
    vec![
        (
            "/v1/completions",
            json!({"model": MODEL_NAME, "prompt": ANSWER_PROMPT, "max_tokens": 4}),
        ),
        (
            "/v1/completions",
            json!({"prompt": [1, 2, 3, 4], "max_tokens": 3, "logprobs": 2, "echo": true, "seed": 3}),
        ),
        (
            "/v1/completions",
            json!({"prompt": ["a", [5, 6]], "max_tokens": 2, "n": 2, "stop": ["x"], "stream": true}),
        ),
        (
            "/v1/chat/completions",
            json!({"messages": msgs, "tools": tools, "max_tokens": 6, "logprobs": true, "top_logprobs": 2}),
        ),
        (
            "/v1/chat/completions",
            json!({"prompt_token_ids": [7, 8, 9], "max_tokens": 3, "stream": true, "stream_options": {"include_usage": true}}),
        ),
        ("/v1/tokenize", json!({"messages": msgs, "tools": tools})),
        ("/v1/detokenize", json!({"tokens": [1, 2, 151_644]})),
        (
            "/generate",
            json!({"input_ids": [[1, 2, 3], [4, 5]], "return_logprob": true, "top_logprobs_num": 2,
                "logprob_start_len": 0, "sampling_params": {"max_new_tokens": 3, "min_new_tokens": 1,
                "no_stop_trim": true, "stop": ["x"]}}),
        ),
        (
            "/v1/chat/completions/tokens",
            json!({"tokens": [7, 8, 9], "messages": [], "max_completion_tokens": 3, "min_tokens": 1,
                "cache_salt": "s", "priority": 2, "prompt_logprobs": 1}),
        ),
        (
            "/tokenize",
            json!({"messages": [{"role": "developer", "content": "x"}, {"role": "assistant", "content": "y"}],
                "continue_final_message": true, "add_generation_prompt": false,
                "chat_template_kwargs": {"enable_thinking": false}}),
        ),
    ]
}

fn mutate(rng: &mut SplitMix64, body: &Value) -> Value {
    let mut body = body.clone();
    for _ in 0..1 + rng.below(3) {
        let Value::Object(map) = &mut body else { break };
        match rng.below(4) {
            0 if !map.is_empty() => {
                let key = map.keys().nth(rng.below(map.len())).unwrap().clone();
                map.remove(&key);
            }
            1 if !map.is_empty() => {
                let key = map.keys().nth(rng.below(map.len())).unwrap().clone();
                map.insert(key, random_value(rng, 1));
            }
            2 => {
                map.insert(rng.pick(KEYS).to_string(), random_value(rng, 1));
            }
            _ => {
                // Mutate inside a nested value (a message, a tool, a list).
                let at = rng.below(map.len().max(1));
                if let Some(v) = map.values_mut().nth(at) {
                    match v {
                        Value::Array(items) if !items.is_empty() => {
                            let i = rng.below(items.len());
                            items[i] = random_value(rng, 2);
                        }
                        other => *other = random_value(rng, 2),
                    }
                }
            }
        }
    }
    body
}

fn mutate_bytes(rng: &mut SplitMix64, mut bytes: Vec<u8>) -> Vec<u8> {
    for _ in 0..1 + rng.below(4) {
        if bytes.is_empty() {
            break;
        }
        let i = rng.below(bytes.len());
        match rng.below(4) {
            0 => bytes[i] = rng.next_u64() as u8,
            1 => {
                bytes.remove(i);
            }
            2 => bytes.insert(i, *rng.pick(b"{}[]\",:0-e\\")),
            _ => bytes.truncate(i),
        }
    }
    bytes
}

#[test]
fn thousands_of_random_and_mutated_bodies_never_get_a_5xx() {
    let mut server = Server::start(
        &scripted_model(),
        &[
            "--max-model-len",
            "96",
            "--max-num-seqs",
            "16",
            "--max-queue-len",
            "16",
        ],
    );
    let addr = server.addr;
    let started = Instant::now();
    let threads: Vec<_> = (0..4u64)
        .map(|t| std::thread::spawn(move || fuzz_client(addr, 0xF0_0D + t)))
        .collect();
    let mut totals = std::collections::BTreeMap::new();
    for t in threads {
        for (status, n) in t.join().unwrap() {
            *totals.entry(status).or_insert(0) += n;
        }
    }
    bytes_that_are_not_http_get_no_5xx(addr);
    eprintln!(
        "fuzz: statuses {totals:?} in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    assert!(totals.values().sum::<usize>() >= 2000, "{totals:?}");
    assert!(
        totals.get(&200).is_some_and(|&n| n > 50),
        "too few valid requests: {totals:?}"
    );
    assert!(totals.get(&400).is_some_and(|&n| n > 500), "{totals:?}");
    assert!(
        started.elapsed() < Duration::from_secs(150),
        "took {:?}",
        started.elapsed()
    );
    assert!(
        server.child.try_wait().unwrap().is_none(),
        "the server died:\n{}",
        server.stderr()
    );
    assert_eq!(server.get("/health").status, 200);
    server.wait_idle();
    assert!(!server.stderr().contains("panicked"), "{}", server.stderr());
}

/// One fuzzing client: 600 requests, mutated seeds (as JSON and as bytes), random values and
/// random bytes, every 50th hung up on before the answer; none may get a 5xx, and every error
/// is OpenAI-shaped. Returns the count of each status.
fn fuzz_client(addr: std::net::SocketAddr, seed: u64) -> std::collections::BTreeMap<u16, usize> {
    let mut rng = SplitMix64::new(seed);
    let seeds = seeds();
    let paths = [
        "/v1/completions",
        "/v1/chat/completions",
        "/v1/chat/completions/tokens",
        "/v1/tokenize",
        "/v1/detokenize",
        "/generate",
    ];
    let mut statuses = std::collections::BTreeMap::new();
    for i in 0..600 {
        let (path, body) = match rng.below(10) {
            0..=4 => {
                let (p, seed) = rng.pick(&seeds);
                (*p, mutate(&mut rng, seed).to_string().into_bytes())
            }
            5..=6 => {
                let (p, seed) = rng.pick(&seeds);
                (*p, mutate_bytes(&mut rng, seed.to_string().into_bytes()))
            }
            7..=8 => (
                *rng.pick(&paths),
                random_value(&mut rng, 0).to_string().into_bytes(),
            ),
            _ => (
                *rng.pick(&paths),
                (0..rng.below(64)).map(|_| rng.next_u64() as u8).collect(),
            ),
        };
        if i % 50 == 7 {
            // A client that hangs up before the answer.
            let mut s = send_request(addr, "POST", path, &[], &body);
            let mut buf = [0u8; 16];
            let _ = s.read(&mut buf);
            continue;
        }
        let r = request(addr, "POST", path, &[], &body);
        assert!(
            r.status < 500,
            "{path} {}: {} {}",
            String::from_utf8_lossy(&body),
            r.status,
            r.text()
        );
        if r.status >= 400 && r.status != 413 {
            r.assert_error(r.status, None);
        }
        *statuses.entry(r.status).or_insert(0usize) += 1;
    }
    statuses
}

/// Bytes that are not HTTP at all.
fn bytes_that_are_not_http_get_no_5xx(addr: std::net::SocketAddr) {
    let mut rng = SplitMix64::new(99);
    for _ in 0..50 {
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let junk: Vec<u8> = (0..rng.below(300)).map(|_| rng.next_u64() as u8).collect();
        let _ = s.write_all(&junk);
        let _ = s.shutdown(std::net::Shutdown::Write);
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out);
        assert!(
            !String::from_utf8_lossy(&out).starts_with("HTTP/1.1 5"),
            "{out:?}"
        );
    }
}

#[test]
fn two_hundred_fifty_six_streaming_clients_some_hanging_up_leave_no_blocks_used() {
    let server = Server::start(
        &scripted_model(),
        &["--max-model-len", "512", "--num-kv-blocks", "4096"],
    );
    let addr = server.addr;
    let started = Instant::now();
    let clients: Vec<_> = (0..256u64)
        .map(|c| {
            std::thread::spawn(move || {
                let mut rng = SplitMix64::new(c);
                let prompt: Vec<u32> = (0..8 + rng.below(40)).map(|_| rng.below(150_000) as u32).collect();
                let hang_up = c % 4 == 3;
                let max_tokens = if hang_up { 400 } else { 12 };
                let (path, body) = if c % 2 == 0 {
                    ("/v1/completions", json!({"prompt": prompt, "max_tokens": max_tokens, "ignore_eos": true, "stream": true, "seed": c}))
                } else {
                    ("/v1/chat/completions", json!({"prompt_token_ids": prompt, "max_tokens": max_tokens, "ignore_eos": true, "stream": true, "logprobs": true}))
                };
                let body = body.to_string();
                if hang_up {
                    // Read until the first token arrives, then hang up mid-stream.
                    let mut s = send_request(addr, "POST", path, &[], body.as_bytes());
                    let mut seen = Vec::new();
                    let mut buf = [0u8; 4096];
                    while !String::from_utf8_lossy(&seen).contains("\"token_ids\":[") {
                        let n = s.read(&mut buf).unwrap();
                        assert!(n > 0, "stream ended early: {}", String::from_utf8_lossy(&seen));
                        seen.extend_from_slice(&buf[..n]);
                    }
                    assert!(String::from_utf8_lossy(&seen).starts_with("HTTP/1.1 200"));
                    return 0;
                }
                let r = request(addr, "POST", path, &[], body.as_bytes());
                assert_eq!(r.status, 200, "{}", r.text());
                let events = r.events();
                assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
                let tokens: usize = events[..events.len() - 1]
                    .iter()
                    .map(|e| serde_json::from_str::<Value>(e).unwrap()["choices"][0]["token_ids"].as_array().unwrap().len())
                    .sum();
                assert_eq!(tokens, 12);
                1
            })
        })
        .collect();
    let completed: usize = clients.into_iter().map(|c| c.join().unwrap()).sum();
    let elapsed = started.elapsed();
    eprintln!("load: 256 clients in {:.1} s", elapsed.as_secs_f64());
    assert_eq!(completed, 192);
    assert!(elapsed < Duration::from_secs(150), "took {elapsed:?}");
    server.wait_idle();
    assert_eq!(server.metric("swerve_kv_blocks_used"), 0.0);
    assert_eq!(server.metric("swerve_client_aborts_total"), 64.0);
    let text = server.get("/metrics").text();
    assert!(!text.contains("status=\"5"), "{text}");
    assert!(
        text.contains("swerve_requests_total{route=\"/v1/completions\",status=\"200\"} 128"),
        "{text}"
    );
}
