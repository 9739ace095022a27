//! swerve-serve's life cycle over loopback sockets on the CPU backend: the API key, pause and
//! resume, weight reloads (weight_version everywhere, prefix cache reset), metrics, the
//! admission bound (429 with Retry-After) and SIGTERM (grace period, then abort, exit 0).

mod common;

use common::serve::*;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

#[test]
fn api_key_pause_resume_reload_and_metrics() {
    let second = tempfile::tempdir().unwrap();
    write_scripted_model(second.path(), 0xBEEF);
    let server = Server::start(&scripted_model(), &["--api-key", "sekrit"]);
    the_api_key_is_required_but_not_for_health_and_metrics(&server);
    let prompt: Vec<u32> = (0..40).map(|i| 1000 + i).collect();
    let first = pause_holds_a_request_until_resume(&server, &prompt);
    the_same_prompt_again_hits_the_prefix_cache(&server, &prompt, &first);
    reloads_bump_the_version_and_reset_the_prefix_cache(&server, second.path(), &prompt, &first);
    metrics_have_the_figures(&server);
}

/// POST with the test's API key.
fn post(server: &Server, path: &str, body: Value) -> Response {
    let auth = [("Authorization", "Bearer sekrit")];
    server.post_raw(path, &auth, body.to_string().as_bytes())
}

/// 401 without the key or with the wrong one; /health and /metrics stay open.
fn the_api_key_is_required_but_not_for_health_and_metrics(server: &Server) {
    server
        .post("/v1/completions", &json!({"prompt": "x"}))
        .assert_error(401, None);
    server
        .post_raw(
            "/v1/completions",
            &[("Authorization", "Bearer nope")],
            b"{\"prompt\": \"x\"}",
        )
        .assert_error(401, None);
    assert_eq!(server.get("/v1/models").status, 401);
    assert_eq!(server.get("/health").status, 200);
    assert_eq!(server.get("/metrics").status, 200);
}

/// Pause: a request waits (no tokens), then finishes after resume. Returns its body.
fn pause_holds_a_request_until_resume(server: &Server, prompt: &[u32]) -> Value {
    assert_eq!(post(server, "/v1/pause", json!({})).json()["paused"], true);
    assert_eq!(server.get("/health").json()["paused"], true);
    let addr = server.addr;
    let body = json!({"prompt": prompt, "max_tokens": 4, "temperature": 0, "ignore_eos": true});
    let waiter = std::thread::spawn(move || {
        request(
            addr,
            "POST",
            "/v1/completions",
            &[("Authorization", "Bearer sekrit")],
            body.to_string().as_bytes(),
        )
    });
    std::thread::sleep(Duration::from_millis(500));
    assert!(!waiter.is_finished(), "a request finished while paused");
    assert_eq!(server.metric("swerve_paused"), 1.0);
    assert_eq!(server.metric("swerve_sequences_in_flight"), 1.0);
    let before = server.metric("swerve_engine_steps_total");
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(
        server.metric("swerve_engine_steps_total"),
        before,
        "steps ran while paused"
    );
    assert_eq!(
        post(server, "/v1/resume", json!({})).json()["paused"],
        false
    );
    let first = waiter.join().unwrap().json();
    assert_eq!(
        first["choices"][0]["token_ids"].as_array().unwrap().len(),
        4
    );
    assert_eq!(first["weight_version"], 0);

    first
}

/// The same prompt again hits the prefix cache.
fn the_same_prompt_again_hits_the_prefix_cache(server: &Server, prompt: &[u32], first: &Value) {
    let again = post(
        server,
        "/v1/completions",
        json!({"prompt": prompt, "max_tokens": 4, "temperature": 0, "ignore_eos": true}),
    )
    .json();
    assert_eq!(again["usage"]["cached_tokens"], 32, "{again}");
    assert_eq!(
        again["choices"][0]["token_ids"],
        first["choices"][0]["token_ids"]
    );
}

/// Reload: version 1 everywhere, prefix cache forgotten, new weights in use; then back to the
/// first weights: version 2, the first output again.
fn reloads_bump_the_version_and_reset_the_prefix_cache(
    server: &Server,
    second: &std::path::Path,
    prompt: &[u32],
    first: &Value,
) {
    let r = post(server, "/v1/weights/reload", json!({"path": second}));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["weight_version"], 1);
    let after = post(
        server,
        "/v1/completions",
        json!({"prompt": prompt, "max_tokens": 4, "temperature": 0, "ignore_eos": true}),
    );
    assert_eq!(after.header("x-weight-version"), Some("1"));
    let after = after.json();
    assert_eq!(after["weight_version"], 1);
    assert_eq!(after["usage"]["cached_tokens"], 0);
    assert_ne!(
        after["choices"][0]["token_ids"],
        first["choices"][0]["token_ids"]
    );
    assert_eq!(server.get("/health").json()["weight_version"], 1);
    // Back to the first weights: version 2, the first output again.
    post(
        server,
        "/v1/weights/reload",
        json!({"path": scripted_model()}),
    );
    let back = post(
        server,
        "/v1/completions",
        json!({"prompt": prompt, "max_tokens": 4, "temperature": 0, "ignore_eos": true}),
    )
    .json();
    assert_eq!(back["weight_version"], 2);
    assert_eq!(
        back["choices"][0]["token_ids"],
        first["choices"][0]["token_ids"]
    );
}

/// Metrics: Prometheus text with the figures the issue names.
fn metrics_have_the_figures(server: &Server) {
    let text = server.get("/metrics").text();
    for name in [
        "swerve_requests_total{route=\"/v1/completions\",status=\"200\"} 4",
        "swerve_requests_total{route=\"/v1/completions\",status=\"401\"} 2",
        "swerve_prompt_tokens_total 160",
        "swerve_generation_tokens_total 16",
        "swerve_prompt_cached_tokens_total 32",
        "swerve_engine_waiting 0",
        "swerve_kv_blocks_used 0",
        "swerve_kv_blocks_total 1023",
        "swerve_prefix_cache_hit_rate ",
        "swerve_engine_step_seconds_total ",
        "swerve_engine_last_step_seconds ",
        "swerve_weight_version 2",
        "# TYPE swerve_generation_tokens_total counter",
    ] {
        assert!(text.contains(name), "no {name:?} in\n{text}");
    }
    assert!(server.metric("swerve_prefix_cache_hit_tokens_total") >= 32.0);
    assert!(server.metric("swerve_engine_steps_total") > 0.0);
}

#[test]
fn the_admission_bound_answers_429_with_retry_after() {
    let server = Server::start(
        &scripted_model(),
        &["--max-num-seqs", "2", "--max-queue-len", "1"],
    );
    server.post("/v1/pause", &json!({}));
    let addr = server.addr;
    let body = json!({"prompt": [5, 6, 7], "max_tokens": 2, "n": 3}).to_string();
    let waiter =
        std::thread::spawn(move || request(addr, "POST", "/v1/completions", &[], body.as_bytes()));
    let deadline = Instant::now() + Duration::from_secs(10);
    while server.metric("swerve_sequences_in_flight") < 3.0 {
        assert!(
            Instant::now() < deadline,
            "the first request was never admitted"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let r = server.post(
        "/v1/completions",
        &json!({"prompt": [5, 6, 7], "max_tokens": 2}),
    );
    r.assert_error(429, None);
    assert_eq!(r.header("retry-after"), Some("1"));
    // More sequences than can ever be admitted is a 400, not a 429 to retry forever.
    let r = server.post(
        "/v1/completions",
        &json!({"prompt": [5, 6, 7], "max_tokens": 2, "n": 4}),
    );
    r.assert_error(400, Some("n"));
    assert_eq!(
        server.metric("swerve_requests_rejected_overload_total"),
        1.0
    );
    server.post("/v1/resume", &json!({}));
    assert_eq!(waiter.join().unwrap().status, 200);
    let r = server.post(
        "/v1/completions",
        &json!({"prompt": [5, 6, 7], "max_tokens": 2}),
    );
    assert_eq!(r.status, 200);
    server.wait_idle();
}

#[test]
fn sigterm_lets_requests_finish_within_the_grace_period_and_exits_zero() {
    let mut server = Server::start(&scripted_model(), &["--shutdown-grace-seconds", "1"]);
    // A stream far longer than the grace period: aborted after it, the stream still ends properly.
    let addr = server.addr;
    let body = json!({"prompt": [1, 2, 3], "max_tokens": 4000, "ignore_eos": true, "stream": true})
        .to_string();
    let long =
        std::thread::spawn(move || request(addr, "POST", "/v1/completions", &[], body.as_bytes()));
    let deadline = Instant::now() + Duration::from_secs(10);
    while server.metric("swerve_engine_running") < 1.0 {
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(20));
    }
    let started = Instant::now();
    let status = std::process::Command::new("kill")
        .args(["-TERM", &server.child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let exit = server.child.wait().unwrap();
    assert_eq!(exit.code(), Some(0), "{}", server.stderr());
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "took {:?}",
        started.elapsed()
    );
    let r = long.join().unwrap();
    let events = r.events();
    assert_eq!(
        events.last().map(String::as_str),
        Some("[DONE]"),
        "{}",
        r.text()
    );
    let last: Value = serde_json::from_str(&events[events.len() - 2]).unwrap();
    assert_eq!(last["choices"][0]["finish_reason"], "abort");
    assert!(
        std::net::TcpStream::connect(addr).is_err(),
        "still accepting after SIGTERM"
    );
    assert!(server.stderr().contains("SIGTERM"), "{}", server.stderr());
}
