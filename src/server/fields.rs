//! Reading a JSON request body field by field, so every error names the field, its type and what
//! was expected. A field given as `null` means its default. Fields the server does not know are
//! ignored, as vLLM ignores them, but never silently: [`Fields::finish`] returns their names, and
//! the response names them in its `X-Swerve-Ignored-Fields` header and the server's log
//! (`super::policy`).

use super::error::ApiError;
use serde_json::{Map, Value};

/// The top-level object of a request body, consumed field by field.
pub struct Fields {
    map: Map<String, Value>,
}

/// A short description of a JSON value's type, for error messages.
pub fn type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(n) if n.is_u64() || n.is_i64() => "an integer",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

impl Fields {
    /// Parses a body: malformed JSON or anything but an object is a 400 saying where.
    pub fn parse(body: &[u8]) -> Result<Self, ApiError> {
        if body.iter().all(u8::is_ascii_whitespace) {
            return Err(ApiError::bad_request(
                "the request body is empty: expected a JSON object",
            ));
        }
        let value: Value = serde_json::from_slice(body).map_err(|e| {
            ApiError::bad_request(format!("the request body is not valid JSON: {e}"))
        })?;
        match value {
            Value::Object(map) => Ok(Self { map }),
            other => Err(ApiError::bad_request(format!(
                "the request body must be a JSON object, found {}",
                type_name(&other)
            ))),
        }
    }

    /// Removes a field; `None` when absent or null (OpenAI clients send null for "unset").
    pub fn take(&mut self, name: &str) -> Option<Value> {
        match self.map.remove(name) {
            None | Some(Value::Null) => None,
            Some(v) => Some(v),
        }
    }

    pub fn has(&self, name: &str) -> bool {
        self.map.get(name).is_some_and(|v| !v.is_null())
    }

    pub fn number(&mut self, name: &str) -> Result<Option<f64>, ApiError> {
        match self.take(name) {
            None => Ok(None),
            Some(Value::Number(n)) => Ok(n.as_f64()),
            Some(other) => Err(wrong_type(name, "a number", &other)),
        }
    }

    /// A non-negative integer.
    pub fn count(&mut self, name: &str) -> Result<Option<u64>, ApiError> {
        match self.take(name) {
            None => Ok(None),
            Some(v) => as_count(&v)
                .map(Some)
                .ok_or_else(|| wrong_type(name, "a non-negative integer", &v)),
        }
    }

    /// Any integer (seeds may be negative in some clients; they wrap to u64).
    pub fn integer(&mut self, name: &str) -> Result<Option<i128>, ApiError> {
        match self.take(name) {
            None => Ok(None),
            Some(Value::Number(n)) if n.is_i64() || n.is_u64() => {
                Ok(n.as_i64().map(i128::from).or(n.as_u64().map(i128::from)))
            }
            Some(other) => Err(wrong_type(name, "an integer", &other)),
        }
    }

    pub fn boolean(&mut self, name: &str) -> Result<Option<bool>, ApiError> {
        match self.take(name) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(b)),
            Some(other) => Err(wrong_type(name, "true or false", &other)),
        }
    }

    pub fn string(&mut self, name: &str) -> Result<Option<String>, ApiError> {
        match self.take(name) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(other) => Err(wrong_type(name, "a string", &other)),
        }
    }

    /// Fields accepted for compatibility and not used (`user`, `store`, `metadata`, ...).
    pub fn ignore(&mut self, names: &[&str]) {
        for name in names {
            self.map.remove(*name);
        }
    }

    /// Fields whose only supported value is their neutral one (penalties 0, `logit_bias` {}):
    /// anything else would change the sampled distribution, which RL must not have silently.
    pub fn only_neutral(
        &mut self,
        name: &str,
        neutral: fn(&Value) -> bool,
        what: &str,
    ) -> Result<(), ApiError> {
        match self.take(name) {
            Some(v) if !neutral(&v) => Err(ApiError::field(
                name,
                format!("`{name}` is not supported (found {v}); only {what} is accepted"),
            )),
            _ => Ok(()),
        }
    }

    /// The fields left unread (sorted), `null` ones aside (null means "default", so nothing
    /// was ignored): ignored, and reported as such by the caller.
    pub fn finish(self) -> Vec<String> {
        let mut names: Vec<String> = self
            .map
            .into_iter()
            .filter(|(_, v)| !v.is_null())
            .map(|(k, _)| k)
            .collect();
        names.sort();
        names
    }

    /// Sets a field (a route that renames one before the shared reader reads it).
    pub fn insert(&mut self, name: &str, value: Value) {
        self.map.insert(name.to_string(), value);
    }

    /// Fields over an object read by another convention (SGLang's `sampling_params`).
    pub fn from_map(map: Map<String, Value>) -> Self {
        Self { map }
    }
}

/// A non-negative integer JSON value.
pub fn as_count(value: &Value) -> Option<u64> {
    value.as_u64()
}

pub fn wrong_type(name: &str, expected: &str, found: &Value) -> ApiError {
    ApiError::field(
        name,
        format!("`{name}` must be {expected}, found {}", type_name(found)),
    )
}
