//! Routes and the OpenAI handlers. Every handler returns a response (errors are OpenAI-shaped),
//! counted in the metrics by route and status, with an `X-Weight-Version` header; a request
//! that brought fields this server ignores gets them named in `X-Swerve-Ignored-Fields`.
//!
//! | route | what |
//! | --- | --- |
//! | `POST /v1/completions`, `/v1/chat/completions` | generation, whole or streamed (SSE) |
//! | `POST /v1/chat/completions/tokens` | chat with the prompt's token ids in `tokens` (verifiers) |
//! | `GET /v1/models` | the served model |
//! | `POST /v1/tokenize`, `/v1/detokenize` (and at the root) | text or messages to ids, ids to text |
//! | control routes ([`super::control`]) | weights, pause/resume, sleep/wake, caches, health |
//! | SGLang routes ([`super::sglang`]) | `/generate`, `/abort_request` |

use super::chat_request::{parse_chat, parse_chat_tokens};
use super::context::Context;
use super::control;
use super::error::ApiError;
use super::fields::Fields;
use super::generate::{collect, start, Run};
use super::handler::{
    authorize, both, finish, json_response, mark_ignored, now_unix, parse_blocking, read_body,
    Shared,
};
use super::openai::{parse_completion, Endpoint, Job};
use super::response::{full_response, run_error, Envelope};
use super::sglang;
use super::state::AppState;
use super::stream::SseBody;
use super::tokenize::{parse_detokenize, parse_tokenize};
use axum::body::Body;
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use serde_json::json;
use std::sync::atomic::Ordering;
use std::sync::Arc;

pub fn router(state: Arc<AppState>) -> Router {
    let mut r = Router::new()
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/chat/completions/tokens", post(chat_completions_tokens))
        .route("/v1/models", get(models));
    for path in ["/v1/tokenize", "/tokenize"] {
        r = both(r, path, post(tokenize));
    }
    for path in ["/v1/detokenize", "/detokenize"] {
        r = both(r, path, post(detokenize));
    }
    r = control::routes(r);
    r = sglang::routes(r);
    r.route("/health", get(control::health))
        .route("/metrics", get(control::metrics))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(state)
}

async fn completions(State(state): Shared, headers: HeaderMap, body: Body) -> Response {
    let result = generate(&state, &headers, body, parse_completion).await;
    finish(&state, "/v1/completions", result)
}

async fn chat_completions(State(state): Shared, headers: HeaderMap, body: Body) -> Response {
    let result = generate(&state, &headers, body, parse_chat).await;
    finish(&state, "/v1/chat/completions", result)
}

async fn chat_completions_tokens(State(state): Shared, headers: HeaderMap, body: Body) -> Response {
    let result = generate(&state, &headers, body, parse_chat_tokens).await;
    finish(&state, "/v1/chat/completions/tokens", result)
}

async fn generate(
    state: &Arc<AppState>,
    headers: &HeaderMap,
    body: Body,
    parse: fn(Fields, &Context<'_>) -> Result<Job, ApiError>,
) -> Result<Response, ApiError> {
    authorize(state, headers)?;
    let body = read_body(body).await?;
    let job = parse_blocking(state, body, parse).await?;
    let route = match job.endpoint {
        Endpoint::Completions => "/v1/completions",
        Endpoint::Chat => "/v1/chat/completions",
    };
    let ignored = job.ignored.clone();
    let response = run_job(state, job).await?;
    Ok(mark_ignored(response, route, &ignored))
}

/// Runs a parsed job: an SSE stream, or the whole body once every choice has finished.
pub(super) async fn run_job(state: &Arc<AppState>, job: Job) -> Result<Response, ApiError> {
    let (inflight, mut events) = start(state, &job).await?;
    let prefix = match job.endpoint {
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
    if let Some(error) = run_error(&run) {
        return Err(error);
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
        let t = parse_blocking(&state, body, parse_tokenize).await?;
        let mut v = json!({
            "tokens": t.ids,
            "count": t.ids.len(),
            "max_model_len": state.max_model_len,
            "weight_version": state.weight_version(),
        });
        if t.token_strs {
            v["token_strs"] = json!(t
                .ids
                .iter()
                .map(|&id| state.table.text(id))
                .collect::<Vec<_>>());
        }
        Ok(mark_ignored(json_response(v), "/tokenize", &t.ignored))
    }
    .await;
    finish(&state, "/v1/tokenize", result)
}

async fn detokenize(State(state): Shared, headers: HeaderMap, body: Body) -> Response {
    let result = async {
        authorize(&state, &headers)?;
        let body = read_body(body).await?;
        let (ids, ignored) = parse_blocking(&state, body, parse_detokenize).await?;
        let v = json!({
            "prompt": state.table.decode(&ids, false),
            "weight_version": state.weight_version(),
        });
        Ok(mark_ignored(json_response(v), "/detokenize", &ignored))
    }
    .await;
    finish(&state, "/v1/detokenize", result)
}

async fn not_found(State(state): Shared) -> Response {
    let result = Err(ApiError::not_found(
        "no such route; see the endpoint table in docs/serving.md (/v1/completions, /v1/chat/completions, /v1/models, /tokenize, /generate, /sleep, /wake_up, /update_weights_from_disk, /health, /metrics, ...)",
    ));
    finish(&state, "other", result)
}

async fn method_not_allowed(State(state): Shared) -> Response {
    let result = Err(ApiError::bad_request("method not allowed on this route")
        .with_status(StatusCode::METHOD_NOT_ALLOWED, "invalid_request_error"));
    finish(&state, "other", result)
}
