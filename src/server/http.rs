//! Routes and handlers. Every handler returns a response (errors are OpenAI-shaped), counted in
//! the metrics by route and status, with an `X-Weight-Version` header.
//!
//! | route | what |
//! | --- | --- |
//! | `POST /v1/completions`, `/v1/chat/completions` | generation, whole or streamed (SSE) |
//! | `GET /v1/models` | the served model |
//! | `POST /v1/tokenize`, `/v1/detokenize` | text or messages to ids, ids to text |
//! | `POST /v1/weights/reload` `{"path": DIR}` | swap weights between engine steps; bumps `weight_version` |
//! | `POST /v1/pause`, `/v1/resume` | stop and restart engine steps (requests keep their state) |
//! | `GET /health`, `GET /metrics` | liveness; Prometheus text (no API key needed) |

use super::chat_request::{parse_chat, parse_tokenize};
use super::error::ApiError;
use super::fields::Fields;
use super::generate::{collect, start, Run};
use super::metrics::ServerGauges;
use super::openai::{parse_completion, parse_detokenize, Endpoint};
use super::response::{full_response, Envelope};
use super::state::AppState;
use super::stream::SseBody;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use serde_json::{json, Value};
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

/// Largest request body read (a 131,072-token prompt as JSON ids is about 1 MB).
pub const MAX_BODY_BYTES: usize = 64 << 20;

type Shared = State<Arc<AppState>>;

pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/models", get(models))
        .route("/v1/tokenize", post(tokenize))
        .route("/v1/detokenize", post(detokenize))
        .route("/v1/weights/reload", post(reload_weights))
        .route("/v1/pause", post(pause))
        .route("/v1/resume", post(resume))
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(state)
}

/// Counts the response and stamps the weight version on it.
fn finish(state: &AppState, route: &'static str, result: Result<Response, ApiError>) -> Response {
    let mut response = result.unwrap_or_else(IntoResponse::into_response);
    state.metrics.request(route, response.status().as_u16());
    response.headers_mut().insert(
        "x-weight-version",
        HeaderValue::from(state.weight_version()),
    );
    response
}

fn json_response(value: Value) -> Response {
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json")],
        value.to_string(),
    )
        .into_response()
}

/// With `--api-key`, `/v1/*` needs `Authorization: Bearer KEY`.
fn authorize(state: &AppState, headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(key) = &state.api_key else {
        return Ok(());
    };
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    match given {
        None => Err(ApiError::unauthorized(
            "no API key: send the header `Authorization: Bearer <key>`",
        )),
        // Compare every byte, so the time taken says nothing about where they differ.
        Some(given)
            if given.len() == key.len()
                && given
                    .bytes()
                    .zip(key.bytes())
                    .fold(0u8, |acc, (a, b)| acc | (a ^ b))
                    == 0 =>
        {
            Ok(())
        }
        Some(_) => Err(ApiError::unauthorized("wrong API key")),
    }
}

async fn read_body(body: Body) -> Result<Bytes, ApiError> {
    axum::body::to_bytes(body, MAX_BODY_BYTES)
        .await
        .map_err(|e| {
            ApiError::bad_request(format!(
                "cannot read the request body (at most {MAX_BODY_BYTES} bytes): {e}"
            ))
            .with_status(StatusCode::PAYLOAD_TOO_LARGE, "invalid_request_error")
        })
}

/// Parses a body off the async workers (tokenizing a long prompt takes a while).
async fn parse_blocking<T: Send + 'static>(
    state: &Arc<AppState>,
    body: Bytes,
    parse: fn(Fields, &super::openai::Context<'_>) -> Result<T, ApiError>,
) -> Result<T, ApiError> {
    let state = state.clone();
    tokio::task::spawn_blocking(move || parse(Fields::parse(&body)?, &state.context()))
        .await
        .map_err(|e| ApiError::internal(format!("parsing the request failed: {e}")))?
}

fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

async fn completions(State(state): Shared, headers: HeaderMap, body: Body) -> Response {
    let result = generate(&state, &headers, body, Endpoint::Completions).await;
    finish(&state, "/v1/completions", result)
}

async fn chat_completions(State(state): Shared, headers: HeaderMap, body: Body) -> Response {
    let result = generate(&state, &headers, body, Endpoint::Chat).await;
    finish(&state, "/v1/chat/completions", result)
}

async fn generate(
    state: &Arc<AppState>,
    headers: &HeaderMap,
    body: Body,
    endpoint: Endpoint,
) -> Result<Response, ApiError> {
    authorize(state, headers)?;
    let body = read_body(body).await?;
    let job = match endpoint {
        Endpoint::Completions => parse_blocking(state, body, parse_completion).await?,
        Endpoint::Chat => parse_blocking(state, body, parse_chat).await?,
    };
    let (inflight, mut events) = start(state, &job).await?;
    let prefix = match endpoint {
        Endpoint::Completions => "cmpl",
        Endpoint::Chat => "chatcmpl",
    };
    let envelope = Envelope {
        id: format!(
            "{prefix}-{:x}",
            state.next_response.fetch_add(1, Ordering::Relaxed)
        ),
        created: now_unix(),
        model: state.served_model_name.clone(),
    };
    let mut run = Run::new(state.clone(), job, inflight);
    if run.job.stream {
        let body = SseBody::new(run, events, envelope);
        return Ok((
            StatusCode::OK,
            [
                (header::CONTENT_TYPE, "text/event-stream"),
                (header::CACHE_CONTROL, "no-cache"),
            ],
            Body::new(body),
        )
            .into_response());
    }
    collect(&mut run, &mut events).await;
    if let Some(error) = run.error() {
        return Err(ApiError::internal(format!("generation failed: {error}")));
    }
    Ok(json_response(full_response(&run, &envelope)))
}

async fn models(State(state): Shared, headers: HeaderMap) -> Response {
    let result = authorize(&state, &headers).map(|()| {
        json_response(json!({
            "object": "list",
            "data": [{
                "id": state.served_model_name,
                "object": "model",
                "created": state.started_unix,
                "owned_by": "swerve",
                "max_model_len": state.max_model_len,
                "weight_version": state.weight_version(),
            }],
        }))
    });
    finish(&state, "/v1/models", result)
}

async fn tokenize(State(state): Shared, headers: HeaderMap, body: Body) -> Response {
    let result = async {
        authorize(&state, &headers)?;
        let body = read_body(body).await?;
        let ids = parse_blocking(&state, body, parse_tokenize).await?;
        Ok(json_response(json!({
            "tokens": ids,
            "count": ids.len(),
            "max_model_len": state.max_model_len,
            "weight_version": state.weight_version(),
        })))
    }
    .await;
    finish(&state, "/v1/tokenize", result)
}

async fn detokenize(State(state): Shared, headers: HeaderMap, body: Body) -> Response {
    let result = async {
        authorize(&state, &headers)?;
        let body = read_body(body).await?;
        let ids = parse_blocking(&state, body, parse_detokenize).await?;
        Ok(json_response(json!({
            "prompt": state.table.decode(&ids, false),
            "weight_version": state.weight_version(),
        })))
    }
    .await;
    finish(&state, "/v1/detokenize", result)
}

async fn reload_weights(State(state): Shared, headers: HeaderMap, body: Body) -> Response {
    let result = async {
        authorize(&state, &headers)?;
        let body = read_body(body).await?;
        let mut fields = Fields::parse(&body)?;
        let path = fields
            .string("path")?
            .ok_or_else(|| ApiError::field("path", "`path` (a model folder) is required"))?;
        fields.finish()?;
        let engine = state.engine.clone();
        let dir = PathBuf::from(&path);
        let version = tokio::task::spawn_blocking(move || engine.update_weights(dir))
            .await
            .map_err(|e| ApiError::internal(format!("the weight reload failed: {e}")))?
            .map_err(|e| {
                ApiError::field("path", format!("cannot load weights from {path}: {e:#}"))
            })?;
        state.weight_version.store(version, Ordering::SeqCst);
        Ok(json_response(
            json!({"weight_version": version, "path": path}),
        ))
    }
    .await;
    finish(&state, "/v1/weights/reload", result)
}

async fn pause(State(state): Shared, headers: HeaderMap) -> Response {
    let result = set_paused(&state, &headers, true);
    finish(&state, "/v1/pause", result)
}

async fn resume(State(state): Shared, headers: HeaderMap) -> Response {
    let result = set_paused(&state, &headers, false);
    finish(&state, "/v1/resume", result)
}

fn set_paused(state: &AppState, headers: &HeaderMap, paused: bool) -> Result<Response, ApiError> {
    authorize(state, headers)?;
    let sent = if paused {
        state.engine.pause()
    } else {
        state.engine.resume()
    };
    sent.map_err(|_| ApiError::unavailable("the engine has stopped"))?;
    state.paused.store(paused, Ordering::SeqCst);
    Ok(json_response(
        json!({"paused": paused, "weight_version": state.weight_version()}),
    ))
}

async fn health(State(state): Shared) -> Response {
    let stopping = state.stopping.load(Ordering::SeqCst);
    let body = json!({
        "status": if stopping { "stopping" } else { "ok" },
        "paused": state.paused.load(Ordering::SeqCst),
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

async fn metrics(State(state): Shared) -> Response {
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

async fn not_found(State(state): Shared) -> Response {
    let result = Err(ApiError::not_found(
        "no such route; see /v1/completions, /v1/chat/completions, /v1/models, /v1/tokenize, /v1/detokenize, /v1/weights/reload, /v1/pause, /v1/resume, /health, /metrics",
    ));
    finish(&state, "other", result)
}

async fn method_not_allowed(State(state): Shared) -> Response {
    let result = Err(ApiError::bad_request("method not allowed on this route")
        .with_status(StatusCode::METHOD_NOT_ALLOWED, "invalid_request_error"));
    finish(&state, "other", result)
}
