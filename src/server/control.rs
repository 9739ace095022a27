//! The control routes RL frameworks call on a vLLM or SGLang server, with their paths and
//! payloads (docs/serving.md, "Control and SGLang routes"):
//!
//! | route | what |
//! | --- | --- |
//! | `POST /v1/weights/reload {"path"}`, `/update_weights_from_disk {"model_path"}` (SGLang), `/update_weights {"weight_dir"}` (prime-rl) | load weights from a model folder between steps; bumps `weight_version` |
//! | `POST /reload_weights` (prime-rl) | back to the folder the server started with |
//! | `POST /pause`, `/v1/pause`, `/pause_generation`; `/resume`, `/v1/resume`, `/continue_generation`; `GET /is_paused` | `mode=abort` (vLLM's `/pause` default: abort what is in flight), `wait` (let it finish), `keep` (`/v1/pause`'s default: freeze it) |
//! | `POST /sleep`, `/release_memory_occupation`; `/wake_up`, `/resume_memory_occupation`; `GET /is_sleeping` | level 1 frees the KV cache, level 2 the weights too |
//! | `POST /reset_prefix_cache`, `/flush_cache` | forget every cached prefix |
//! | `GET /health`, `/health_generate`, `/metrics`, `/get_model_info`, `/v1/loads` | liveness, a one-token generation, Prometheus text, the model, the queue |
//!
//! While asleep, generation requests are refused with 503 (`POST /wake_up` first), never queued:
//! the memory they need is given away, and a request held until a wake-up that may come after
//! a long training step would look like a hung server to its client. The engine thread marks
//! itself asleep in the same command that releases the memory, so a request that passed the
//! server's own check just before is refused by the engine, with the same 503.
//!
//! While paused (every mode), a new generation request is admitted but held outside the engine
//! until `/resume`: no request starts after the pause. What differs is the requests in flight at
//! the pause: `abort` ends them, `keep` freezes them, `wait` lets them finish and answers once
//! they have (new ones cannot keep the wait going). `/sleep` is refused with 409 while requests
//! are in the engine (running, or frozen by `keep`); the held ones never started and get the
//! asleep 503, so `/pause` then `/sleep` works however many requests keep coming.

use super::error::ApiError;
use super::fields::Fields;
use super::handler::{authorize, both, finish, json_response, read_body, Routes, Shared};
use super::metrics::ServerGauges;
use super::state::AppState;
use crate::engine::GenerationRequest;
use axum::body::Body;
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{json, Value};
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

pub(super) fn routes(r: Routes) -> Routes {
    let mut r = both(r, "/v1/weights/reload", post(reload_weights));
    r = both(
        r,
        "/update_weights_from_disk",
        post(update_weights_from_disk),
    );
    r = both(r, "/update_weights", post(update_weights));
    r = both(r, "/reload_weights", post(reload_base_weights));
    for path in ["/v1/pause", "/pause", "/pause_generation"] {
        r = both(r, path, post(pause));
    }
    for path in ["/v1/resume", "/resume", "/continue_generation"] {
        r = both(r, path, post(resume));
    }
    r = both(r, "/is_paused", get(is_paused));
    for path in ["/sleep", "/release_memory_occupation"] {
        r = both(r, path, post(sleep));
    }
    for path in ["/wake_up", "/resume_memory_occupation"] {
        r = both(r, path, post(wake_up));
    }
    r = both(r, "/is_sleeping", get(is_sleeping));
    r = both(r, "/reset_prefix_cache", post(reset_prefix_cache));
    r = both(
        r,
        "/flush_cache",
        get(reset_prefix_cache).post(reset_prefix_cache),
    );
    r = both(r, "/health_generate", get(health_generate));
    r = both(r, "/get_model_info", get(model_info));
    both(r, "/v1/loads", get(loads))
}

/// The query's `key=value` pairs (values with `%XX` and `+` decoded).
fn query(uri: &Uri) -> Vec<(String, String)> {
    let decode = |s: &str| {
        let bytes = s.replace('+', " ").into_bytes();
        let mut out = Vec::with_capacity(bytes.len());
        let mut i = 0;
        while i < bytes.len() {
            let hex = |b: u8| (b as char).to_digit(16);
            match (
                bytes[i],
                bytes.get(i + 1).copied().and_then(hex),
                bytes.get(i + 2).copied().and_then(hex),
            ) {
                (b'%', Some(h), Some(l)) => {
                    out.push((h * 16 + l) as u8);
                    i += 3;
                }
                (b, _, _) => {
                    out.push(b);
                    i += 1;
                }
            }
        }
        String::from_utf8_lossy(&out).into_owned()
    };
    uri.query()
        .unwrap_or("")
        .split('&')
        .filter(|kv| !kv.is_empty())
        .map(|kv| match kv.split_once('=') {
            Some((k, v)) => (decode(k), decode(v)),
            None => (decode(kv), String::new()),
        })
        .collect()
}

/// A control route's body: an empty body is `{}`.
async fn body_fields(body: Body) -> Result<Fields, ApiError> {
    let bytes = read_body(body).await?;
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(Fields::from_map(Default::default()));
    }
    Fields::parse(&bytes)
}

/// A query parameter or body field (the body wins), as JSON.
fn param(query: &[(String, String)], fields: &mut Fields, name: &str) -> Option<Value> {
    fields.take(name).or_else(|| {
        query
            .iter()
            .rev()
            .find(|(k, _)| k == name)
            .map(|(_, v)| serde_json::from_str(v).unwrap_or_else(|_| Value::String(v.clone())))
    })
}

fn as_bool(name: &str, v: Option<Value>) -> Result<Option<bool>, ApiError> {
    match v {
        None => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(b)),
        Some(Value::String(s)) if s.eq_ignore_ascii_case("true") => Ok(Some(true)),
        Some(Value::String(s)) if s.eq_ignore_ascii_case("false") => Ok(Some(false)),
        Some(other) => Err(ApiError::field(
            name,
            format!("`{name}` must be true or false, found {other}"),
        )),
    }
}

/// Loads weights from `dir` between engine steps; the new version.
async fn load_weights(
    state: &Arc<AppState>,
    dir: String,
    field: &'static str,
    label: Option<String>,
) -> Result<u64, ApiError> {
    let engine = state.engine.clone();
    let path = PathBuf::from(&dir);
    let version = tokio::task::spawn_blocking(move || engine.update_weights(path))
        .await
        .map_err(|e| ApiError::internal(format!("the weight reload failed: {e}")))?
        .map_err(|e| ApiError::field(field, format!("cannot load weights from {dir}: {e:#}")))?;
    state.weight_version.store(version, Ordering::SeqCst);
    if let Ok(mut d) = state.weights_dir.lock() {
        *d = PathBuf::from(&dir);
    }
    if let Ok(mut l) = state.weight_version_label.lock() {
        *l = label;
    }
    if state.sleep_level() == Some(2) {
        // The weights are back (loaded anew); the KV cache still waits for /wake_up.
        state.sleep_level.store(1, Ordering::SeqCst);
    }
    Ok(version)
}

/// A required string field.
fn required(
    fields: &mut Fields,
    names: &[&'static str],
) -> Result<(String, &'static str), ApiError> {
    for &name in names {
        if let Some(v) = fields.string(name)? {
            return Ok((v, name));
        }
    }
    Err(ApiError::field(
        names[0],
        format!("`{}` (a model folder) is required", names[0]),
    ))
}

async fn reload_weights(State(state): Shared, headers: HeaderMap, body: Body) -> Response {
    let result = async {
        authorize(&state, &headers)?;
        let mut fields = body_fields(body).await?;
        let (path, field) = required(&mut fields, &["path"])?;
        let version = load_weights(&state, path.clone(), field, None).await?;
        Ok(json_response(
            json!({"weight_version": version, "path": path}),
        ))
    }
    .await;
    finish(&state, "/v1/weights/reload", result)
}

/// SGLang's `/update_weights_from_disk {"model_path", "weight_version"?, "abort_all_requests"?}`.
async fn update_weights_from_disk(
    State(state): Shared,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let result = async {
        authorize(&state, &headers)?;
        let mut fields = body_fields(body).await?;
        let (path, field) = required(&mut fields, &["model_path"])?;
        let label = fields.string("weight_version")?;
        if fields.boolean("abort_all_requests")? == Some(true) {
            state.abort_all();
        }
        let version = load_weights(&state, path, field, label).await?;
        Ok(json_response(json!({
            "success": true,
            "message": "Succeeded to update model weights.",
            "num_paused_requests": 0,
            "weight_version": version,
        })))
    }
    .await;
    finish(&state, "/update_weights_from_disk", result)
}

/// prime-rl's `/update_weights {"weight_dir"}` (older: `{"model_path"}`).
async fn update_weights(State(state): Shared, headers: HeaderMap, body: Body) -> Response {
    let result = async {
        authorize(&state, &headers)?;
        let mut fields = body_fields(body).await?;
        if fields.has("update_info") {
            return Err(ApiError::field(
                "update_info",
                "weight transfer over NCCL or IPC is not supported: write the weights to a folder and send {\"weight_dir\": DIR}",
            ));
        }
        let (path, field) = required(&mut fields, &["weight_dir", "model_path"])?;
        let version = load_weights(&state, path, field, None).await?;
        Ok(json_response(json!({"message": "Weights updated", "weight_version": version})))
    }
    .await;
    finish(&state, "/update_weights", result)
}

/// prime-rl's `/reload_weights`: the weights of the folder the server started with.
async fn reload_base_weights(State(state): Shared, headers: HeaderMap) -> Response {
    let result = async {
        authorize(&state, &headers)?;
        let dir = state.base_model_dir.display().to_string();
        let version = load_weights(&state, dir, "model", None).await?;
        Ok(json_response(
            json!({"message": "Weights reloaded", "weight_version": version}),
        ))
    }
    .await;
    finish(&state, "/reload_weights", result)
}

/// The pause modes: what happens to requests in flight at the pause (new ones wait for the
/// resume in every mode).
#[derive(Clone, Copy, PartialEq, Eq)]
enum PauseMode {
    /// Abort them (their clients get an error to retry), with the requests held by an earlier
    /// pause.
    Abort,
    /// Let them finish (frozen ones too); the pause answers once they have.
    Wait,
    /// Freeze them: they keep their state and continue on resume.
    Keep,
}

async fn pause(State(state): Shared, headers: HeaderMap, uri: Uri, body: Body) -> Response {
    let result = async {
        authorize(&state, &headers)?;
        let query = query(&uri);
        let mut fields = body_fields(body).await?;
        // vLLM's /pause aborts by default, SGLang's /pause_generation too; /v1/pause keeps.
        let default = if uri.path().starts_with("/v1/") {
            PauseMode::Keep
        } else {
            PauseMode::Abort
        };
        let wait = as_bool(
            "wait_for_inflight_requests",
            param(&query, &mut fields, "wait_for_inflight_requests"),
        )?;
        let mode = match param(&query, &mut fields, "mode") {
            None if wait == Some(true) => PauseMode::Wait,
            None => default,
            Some(Value::String(m)) => match m.as_str() {
                "abort" => PauseMode::Abort,
                "wait" => PauseMode::Wait,
                // SGLang's modes that keep the requests.
                "keep" | "in_place" | "retract" => PauseMode::Keep,
                other => {
                    return Err(ApiError::field(
                        "mode",
                        format!("`mode` {other:?}: expected \"abort\", \"wait\" or \"keep\""),
                    ))
                }
            },
            Some(other) => {
                return Err(ApiError::field(
                    "mode",
                    format!("`mode` must be a string, found {other}"),
                ))
            }
        };
        let clear_cache =
            as_bool("clear_cache", param(&query, &mut fields, "clear_cache"))?.unwrap_or(true);
        state.paused.store(true, Ordering::SeqCst);
        let stopped = |_| ApiError::unavailable("the engine has stopped");
        let aborted = match mode {
            PauseMode::Abort => {
                // Paused first: the abort, served after it, ends everything that came before.
                state.engine.pause().map_err(stopped)?;
                state.abort_all()
            }
            PauseMode::Wait => {
                // New requests are held from the engine's taking this command, so the wait ends
                // with the requests in flight now, however many more arrive.
                let engine = state.engine.clone();
                tokio::task::spawn_blocking(move || engine.pause_after_in_flight())
                    .await
                    .map_err(|e| ApiError::internal(format!("the pause failed: {e}")))?
                    .map_err(|e| ApiError::conflict(format!("{e:#}: the pause did not happen")))?;
                0
            }
            PauseMode::Keep => {
                state.engine.pause().map_err(stopped)?;
                0
            }
        };
        if clear_cache && mode != PauseMode::Keep {
            reset_cache(&state).await?;
        }
        Ok(json_response(json!({
            "status": "paused", "paused": true, "aborted_requests": aborted,
            "weight_version": state.weight_version(),
        })))
    }
    .await;
    finish(&state, "/pause", result)
}

async fn resume(State(state): Shared, headers: HeaderMap) -> Response {
    let result = async {
        authorize(&state, &headers)?;
        state
            .engine
            .resume()
            .map_err(|_| ApiError::unavailable("the engine has stopped"))?;
        state.paused.store(false, Ordering::SeqCst);
        Ok(json_response(json!({
            "status": "resumed", "paused": false, "weight_version": state.weight_version(),
        })))
    }
    .await;
    finish(&state, "/resume", result)
}

async fn is_paused(State(state): Shared, headers: HeaderMap) -> Response {
    let result = authorize(&state, &headers)
        .map(|()| json_response(json!({"is_paused": state.paused.load(Ordering::SeqCst)})));
    finish(&state, "/is_paused", result)
}

/// `tags` (vLLM's and SGLang's): which memory; absent, null or not a list means all of it.
fn read_tags(query: &[(String, String)], fields: &mut Fields) -> Result<(bool, bool), ApiError> {
    let mut tags: Vec<String> = query
        .iter()
        .filter(|(k, _)| k == "tags")
        .map(|(_, v)| v.clone())
        .collect();
    // SkyRL sends `"tags": 1`; a non-list means everything, as no tags does.
    if let Some(Value::Array(items)) = fields.take("tags") {
        for (i, t) in items.iter().enumerate() {
            match t.as_str() {
                Some(s) => tags.push(s.to_string()),
                None => {
                    return Err(ApiError::field(
                        format!("tags[{i}]"),
                        "a tag must be a string",
                    ))
                }
            }
        }
    }
    if tags.is_empty() {
        return Ok((true, true));
    }
    for t in &tags {
        if !matches!(t.as_str(), "weights" | "kv_cache" | "cuda_graph") {
            return Err(ApiError::field(
                "tags",
                format!("unknown tag {t:?}: expected \"weights\" or \"kv_cache\""),
            ));
        }
    }
    let has = |name: &str| tags.iter().any(|t| t == name);
    Ok((has("weights"), has("kv_cache")))
}

async fn sleep(State(state): Shared, headers: HeaderMap, uri: Uri, body: Body) -> Response {
    let result = async {
        authorize(&state, &headers)?;
        let query = query(&uri);
        let mut fields = body_fields(body).await?;
        let level = if uri.path().starts_with("/release_memory_occupation") {
            // SGLang: the weights go too unless only the KV cache is named.
            if read_tags(&query, &mut fields)?.0 {
                2
            } else {
                1
            }
        } else {
            match param(&query, &mut fields, "level") {
                None => 1,
                Some(v) => match v.as_u64() {
                    Some(l @ 1..=2) => l as u8,
                    _ => {
                        return Err(ApiError::field(
                            "level",
                            format!(
                                "`level` {v}: expected 1 (the KV cache) or 2 (the weights too)"
                            ),
                        ))
                    }
                },
            }
        };
        let engine = state.engine.clone();
        let released = tokio::task::spawn_blocking(move || engine.sleep(level))
            .await
            .map_err(|e| ApiError::internal(format!("sleep failed: {e}")))?
            .map_err(|e| {
                ApiError::conflict(format!(
                    "{e:#}: let them finish, or abort them (POST /pause?mode=abort), then sleep"
                ))
            })?;
        let level = level.max(state.sleep_level().unwrap_or(0));
        state.sleep_level.store(level, Ordering::SeqCst);
        Ok(json_response(json!({
            "status": "sleeping", "is_sleeping": true, "level": level,
            "released": {
                "kv_cache_bytes": released.kv_cache_bytes,
                "weight_bytes": released.weight_bytes,
                "total_bytes": released.kv_cache_bytes + released.weight_bytes,
            },
        })))
    }
    .await;
    finish(&state, "/sleep", result)
}

async fn wake_up(State(state): Shared, headers: HeaderMap, uri: Uri, body: Body) -> Response {
    let result = async {
        authorize(&state, &headers)?;
        let query = query(&uri);
        let mut fields = body_fields(body).await?;
        let (weights, kv_cache) = read_tags(&query, &mut fields)?;
        let dir = state
            .weights_dir
            .lock()
            .map(|d| d.clone())
            .unwrap_or_default();
        let engine = state.engine.clone();
        let woken = tokio::task::spawn_blocking(move || engine.wake_up(dir, weights, kv_cache))
            .await
            .map_err(|e| ApiError::internal(format!("wake-up failed: {e}")))?
            .map_err(|e| ApiError::internal(format!("wake-up failed: {e:#}")))?;
        state
            .weight_version
            .store(woken.weight_version, Ordering::SeqCst);
        let level = match state.sleep_level() {
            Some(2) if !woken.weights_loaded => 2,
            Some(_) if !kv_cache => 1,
            _ => 0,
        };
        state.sleep_level.store(level, Ordering::SeqCst);
        Ok(json_response(json!({
            "status": if level == 0 { "awake" } else { "sleeping" },
            "is_sleeping": level > 0,
            "weights_loaded": woken.weights_loaded,
            "kv_cache_restored": woken.kv_cache_restored,
            "weight_version": woken.weight_version,
        })))
    }
    .await;
    finish(&state, "/wake_up", result)
}

async fn is_sleeping(State(state): Shared, headers: HeaderMap) -> Response {
    let result = authorize(&state, &headers).map(|()| {
        let level = state.sleep_level();
        json_response(json!({"is_sleeping": level.is_some(), "level": level}))
    });
    finish(&state, "/is_sleeping", result)
}

async fn reset_cache(state: &Arc<AppState>) -> Result<usize, ApiError> {
    let engine = state.engine.clone();
    tokio::task::spawn_blocking(move || engine.reset_prefix_cache())
        .await
        .map_err(|e| ApiError::internal(format!("the prefix-cache reset failed: {e}")))?
        .map_err(|_| ApiError::unavailable("the engine has stopped"))
}

async fn reset_prefix_cache(State(state): Shared, headers: HeaderMap) -> Response {
    let result = async {
        authorize(&state, &headers)?;
        let dropped = reset_cache(&state).await?;
        Ok(json_response(
            json!({"success": true, "cached_blocks_dropped": dropped}),
        ))
    }
    .await;
    finish(&state, "/reset_prefix_cache", result)
}

pub(super) async fn health(State(state): Shared) -> Response {
    let stopping = state.stopping.load(Ordering::SeqCst);
    let body = json!({
        "status": if stopping { "stopping" } else { "ok" },
        "paused": state.paused.load(Ordering::SeqCst),
        "is_sleeping": state.sleep_level().is_some(),
        "weight_version": state.weight_version(),
    });
    let status = if stopping {
        StatusCode::SERVICE_UNAVAILABLE
    } else {
        StatusCode::OK
    };
    let response = (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response();
    finish(&state, "/health", Ok(response))
}

/// SGLang's `/health_generate`: 200 once a one-token generation went through the engine (while
/// paused, once the engine thread answered: a generation would wait for the resume).
async fn health_generate(State(state): Shared) -> Response {
    let result = async {
        if state.stopping.load(Ordering::SeqCst) {
            return Err(ApiError::unavailable("the server is shutting down"));
        }
        if let Some(level) = state.sleep_level() {
            return Err(ApiError::asleep(level));
        }
        let engine = state.engine.clone();
        let paused = state.paused.load(Ordering::SeqCst);
        let probe = tokio::task::spawn_blocking(move || -> anyhow::Result<()> {
            if paused {
                return engine.stats().map(|_| ());
            }
            let request = GenerationRequest {
                prompt: vec![0],
                params: crate::engine::SamplingParams::greedy(),
                max_tokens: 1,
                stop_ids: Vec::new(),
                prompt_logprobs: None,
            };
            let (_, events) = engine.submit(request)?;
            while let Ok(event) = events.recv_timeout(Duration::from_secs(30)) {
                if let crate::engine::RequestEvent::Finished(_) = event {
                    return Ok(());
                }
            }
            anyhow::bail!("no token within 30 s")
        });
        probe
            .await
            .map_err(|e| ApiError::internal(format!("the health generation failed: {e}")))?
            .map_err(|e| ApiError::unavailable(format!("the health generation failed: {e:#}")))?;
        Ok(json_response(json!({})))
    }
    .await;
    finish(&state, "/health_generate", result)
}

async fn model_info(State(state): Shared, headers: HeaderMap) -> Response {
    let result = authorize(&state, &headers).map(|()| {
        let dir = state
            .weights_dir
            .lock()
            .map(|d| d.display().to_string())
            .unwrap_or_default();
        json_response(json!({
            "model_path": dir, "tokenizer_path": dir, "is_generation": true,
            "served_model_name": state.served_model_name,
            "weight_version": state.weight_version_label(),
            "max_model_len": state.max_model_len,
        }))
    });
    finish(&state, "/get_model_info", result)
}

/// SGLang's `/v1/loads` (slime polls it until a server is idle).
async fn loads(State(state): Shared, headers: HeaderMap) -> Response {
    let result = async {
        authorize(&state, &headers)?;
        let engine = state.engine.clone();
        let stats = tokio::task::spawn_blocking(move || engine.stats())
            .await
            .ok()
            .and_then(Result::ok)
            .ok_or_else(|| ApiError::unavailable("the engine has stopped"))?;
        let waiting = stats.waiting + stats.held;
        Ok(json_response(json!({"loads": [{
            "dp_rank": 0,
            "num_running_reqs": stats.running,
            "num_waiting_reqs": waiting,
            "num_total_reqs": stats.running + waiting,
        }]})))
    }
    .await;
    finish(&state, "/v1/loads", result)
}

pub(super) async fn metrics(State(state): Shared) -> Response {
    let engine = state.engine.clone();
    let result = match tokio::task::spawn_blocking(move || engine.stats()).await {
        Ok(Ok(stats)) => {
            let gauges = ServerGauges {
                in_flight: state.admission.in_flight(),
                capacity: state.admission.capacity,
                paused: state.paused.load(Ordering::SeqCst),
                weight_version: state.weight_version(),
            };
            Ok((
                StatusCode::OK,
                [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
                state.metrics.render(&stats, &gauges),
            )
                .into_response())
        }
        _ => Err(ApiError::unavailable("the engine has stopped")),
    };
    finish(&state, "/metrics", result)
}
