//! What every handler shares: the state extractor, the route helper, the API key check, body
//! reading and parsing off the async workers, JSON responses, and the response's bookkeeping
//! (metrics, `X-Weight-Version`, `X-Swerve-Ignored-Fields`).

use super::context::Context;
use super::error::ApiError;
use super::fields::Fields;
use super::policy::{log_ignored, IGNORED_FIELDS_HEADER};
use super::state::AppState;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::MethodRouter;
use axum::Router;
use serde_json::Value;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

/// Largest request body read (a 131,072-token prompt as JSON ids is about 1 MB).
pub const MAX_BODY_BYTES: usize = 64 << 20;

pub type Shared = State<Arc<AppState>>;

/// The routes' router before its state is given.
pub type Routes = Router<Arc<AppState>>;

/// Adds `path` and `path/` (some clients end control paths with a slash).
pub fn both(router: Routes, path: &str, method: MethodRouter<Arc<AppState>>) -> Routes {
    router
        .route(path, method.clone())
        .route(&format!("{path}/"), method)
}

/// Counts the response and stamps the weight version on it.
pub fn finish(
    state: &AppState,
    route: &'static str,
    result: Result<Response, ApiError>,
) -> Response {
    let mut response = result.unwrap_or_else(IntoResponse::into_response);
    state.metrics.request(route, response.status().as_u16());
    response.headers_mut().insert(
        "x-weight-version",
        HeaderValue::from(state.weight_version()),
    );
    response
}

pub fn json_response(value: Value) -> Response {
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json")],
        value.to_string(),
    )
        .into_response()
}

/// With `--api-key`, `/v1/*` needs `Authorization: Bearer KEY`.
pub fn authorize(state: &AppState, headers: &HeaderMap) -> Result<(), ApiError> {
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

pub async fn read_body(body: Body) -> Result<Bytes, ApiError> {
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
pub async fn parse_blocking<T: Send + 'static>(
    state: &Arc<AppState>,
    body: Bytes,
    parse: fn(Fields, &Context<'_>) -> Result<T, ApiError>,
) -> Result<T, ApiError> {
    let state = state.clone();
    tokio::task::spawn_blocking(move || parse(Fields::parse(&body)?, &state.context()))
        .await
        .map_err(|e| ApiError::internal(format!("parsing the request failed: {e}")))?
}

pub fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Names the ignored request fields in the response header and the log.
pub fn mark_ignored(mut response: Response, route: &str, ignored: &[String]) -> Response {
    if !ignored.is_empty() {
        log_ignored(route, ignored);
        if let Ok(v) = HeaderValue::from_str(&ignored.join(", ")) {
            response.headers_mut().insert(IGNORED_FIELDS_HEADER, v);
        }
    }
    response
}
