//! OpenAI-shaped errors: `{"error": {"message", "type", "param", "code"}}` with the HTTP status.
//!
//! Every refusal names what is wrong: `param` is the request field at fault (`max_tokens`,
//! `messages[2].content`, ...) and the message says why, with the token counts for length errors.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;

#[derive(Clone, Debug, PartialEq)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    /// OpenAI's error `type`: `invalid_request_error`, `authentication_error`, ...
    pub kind: &'static str,
    /// The request field at fault, when one is.
    pub param: Option<String>,
    /// Seconds for a `Retry-After` header (429s).
    pub retry_after: Option<u64>,
}

impl ApiError {
    /// 400 about one field.
    pub fn field(param: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            param: Some(param.into()),
            retry_after: None,
        }
    }

    /// 400 about the request as a whole.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self {
            param: None,
            ..Self::field("", message)
        }
    }

    pub fn with_status(mut self, status: StatusCode, kind: &'static str) -> Self {
        self.status = status;
        self.kind = kind;
        self
    }

    pub fn unauthorized(message: impl Into<String>) -> Self {
        Self::bad_request(message).with_status(StatusCode::UNAUTHORIZED, "authentication_error")
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Self::bad_request(message).with_status(StatusCode::NOT_FOUND, "not_found_error")
    }

    pub fn overloaded(message: impl Into<String>, retry_after: u64) -> Self {
        Self {
            retry_after: Some(retry_after),
            ..Self::bad_request(message)
                .with_status(StatusCode::TOO_MANY_REQUESTS, "rate_limit_error")
        }
    }

    /// 500: something failed on our side (the engine stopped, a device error).
    pub fn internal(message: impl Into<String>) -> Self {
        Self::bad_request(message).with_status(StatusCode::INTERNAL_SERVER_ERROR, "server_error")
    }

    /// 503: asleep (`/sleep`): generation needs `/wake_up` first.
    pub fn asleep(level: u8) -> Self {
        let what = if level >= 2 {
            "its KV cache and weights are released"
        } else {
            "its KV cache is released"
        };
        Self::unavailable(format!(
            "the server is asleep (sleep level {level}: {what}): POST /wake_up first"
        ))
    }

    /// 409: the request conflicts with the server's state (e.g. sleeping with requests in
    /// flight).
    pub fn conflict(message: impl Into<String>) -> Self {
        Self::bad_request(message).with_status(StatusCode::CONFLICT, "invalid_request_error")
    }

    /// 503: the server is stopping or the engine is gone.
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::bad_request(message).with_status(StatusCode::SERVICE_UNAVAILABLE, "server_error")
    }

    pub fn body(&self) -> serde_json::Value {
        json!({"error": {
            "message": self.message,
            "type": self.kind,
            "param": self.param,
            "code": self.status.as_u16(),
        }})
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.param {
            Some(p) => write!(f, "{} ({p}): {}", self.status, self.message),
            None => write!(f, "{}: {}", self.status, self.message),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (
            self.status,
            [(header::CONTENT_TYPE, "application/json")],
            self.body().to_string(),
        )
            .into_response();
        if let Some(seconds) = self.retry_after {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        response
    }
}

/// Maps an engine refusal (`"max_tokens: must be at least 1"`, `"temperature = -1: ..."`) to a
/// 400 naming the field its message starts with.
pub fn from_engine_refusal(error: &anyhow::Error) -> ApiError {
    let message = format!("{error:#}");
    let param: String = message
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
        .collect();
    if param.is_empty() {
        ApiError::bad_request(message)
    } else {
        ApiError::field(param, message)
    }
}
