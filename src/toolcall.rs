//! Tool calls in generated assistant text: Qwen2.5 writes each as
//! `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`.
//!
//! Parsing never panics: a block that is unclosed, not JSON, or lacks a name is a
//! [`ToolCallFormatError`], which the RL loop penalises or masks.

use serde_json::{Map, Value};

pub const OPEN: &str = "<tool_call>";
pub const CLOSE: &str = "</tool_call>";

#[derive(Clone, Debug, PartialEq)]
pub struct ToolCall {
    pub name: String,
    /// Always a JSON object.
    pub arguments: Value,
}

/// Assistant text split into its content (the text outside the blocks, trimmed) and tool calls.
#[derive(Clone, Debug, PartialEq)]
pub struct ParsedAssistant {
    pub content: String,
    pub tool_calls: Vec<ToolCall>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ToolCallFormatError {
    /// `<tool_call>` number `index` has no `</tool_call>`.
    Unclosed { index: usize },
    /// A `</tool_call>` with no opening tag before it.
    UnexpectedClose { index: usize },
    /// The block's body is not a JSON object.
    BadJson { index: usize, message: String },
    /// No string `name`.
    MissingName { index: usize },
    /// `arguments` is neither an object nor a string holding one.
    BadArguments { index: usize },
}

impl std::fmt::Display for ToolCallFormatError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Unclosed { index } => write!(f, "tool call {index}: <tool_call> is never closed"),
            Self::UnexpectedClose { index } => {
                write!(f, "tool call {index}: </tool_call> without <tool_call>")
            }
            Self::BadJson { index, message } => {
                write!(f, "tool call {index}: not a JSON object: {message}")
            }
            Self::MissingName { index } => write!(f, "tool call {index}: no string `name`"),
            Self::BadArguments { index } => {
                write!(f, "tool call {index}: `arguments` must be a JSON object")
            }
        }
    }
}

impl std::error::Error for ToolCallFormatError {}

pub fn parse_tool_calls(text: &str) -> Result<ParsedAssistant, ToolCallFormatError> {
    let mut content = String::new();
    let mut tool_calls = Vec::new();
    let mut rest = text;
    loop {
        let open = rest.find(OPEN);
        let close = rest.find(CLOSE);
        match (open, close) {
            (None, None) => {
                content.push_str(rest);
                break;
            }
            (None, Some(_)) => {
                return Err(ToolCallFormatError::UnexpectedClose {
                    index: tool_calls.len(),
                })
            }
            (Some(o), Some(c)) if c < o => {
                return Err(ToolCallFormatError::UnexpectedClose {
                    index: tool_calls.len(),
                })
            }
            (Some(o), _) => {
                content.push_str(&rest[..o]);
                let body_start = o + OPEN.len();
                let index = tool_calls.len();
                let Some(body_len) = rest[body_start..].find(CLOSE) else {
                    return Err(ToolCallFormatError::Unclosed { index });
                };
                let body = &rest[body_start..body_start + body_len];
                if body.contains(OPEN) {
                    return Err(ToolCallFormatError::Unclosed { index });
                }
                tool_calls.push(parse_body(body, index)?);
                rest = &rest[body_start + body_len + CLOSE.len()..];
            }
        }
    }
    Ok(ParsedAssistant {
        content: content.trim().to_string(),
        tool_calls,
    })
}

fn parse_body(body: &str, index: usize) -> Result<ToolCall, ToolCallFormatError> {
    let value: Value =
        serde_json::from_str(body.trim()).map_err(|e| ToolCallFormatError::BadJson {
            index,
            message: e.to_string(),
        })?;
    let Value::Object(obj) = value else {
        return Err(ToolCallFormatError::BadJson {
            index,
            message: "not an object".into(),
        });
    };
    let name = match obj.get("name") {
        Some(Value::String(n)) if !n.is_empty() => n.clone(),
        _ => return Err(ToolCallFormatError::MissingName { index }),
    };
    let arguments = match obj.get("arguments") {
        None | Some(Value::Null) => Value::Object(Map::new()),
        Some(Value::Object(a)) => Value::Object(a.clone()),
        Some(Value::String(s)) => match serde_json::from_str::<Value>(s) {
            Ok(Value::Object(a)) => Value::Object(a),
            _ => return Err(ToolCallFormatError::BadArguments { index }),
        },
        Some(_) => return Err(ToolCallFormatError::BadArguments { index }),
    };
    Ok(ToolCall { name, arguments })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn content_and_parallel_calls() {
        let text = "Let me check.\n<tool_call>\n{\"name\": \"bash\", \"arguments\": {\"command\": \"ls\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"read\", \"arguments\": {\"path\": \"读我.md\"}}\n</tool_call>";
        let parsed = parse_tool_calls(text).unwrap();
        assert_eq!(parsed.content, "Let me check.");
        assert_eq!(
            parsed.tool_calls,
            [
                ToolCall {
                    name: "bash".into(),
                    arguments: json!({"command": "ls"})
                },
                ToolCall {
                    name: "read".into(),
                    arguments: json!({"path": "读我.md"})
                },
            ]
        );
    }

    #[test]
    fn plain_text_has_no_calls() {
        let parsed = parse_tool_calls("  just text, no < tags > here ").unwrap();
        assert_eq!(
            parsed,
            ParsedAssistant {
                content: "just text, no < tags > here".into(),
                tool_calls: vec![]
            }
        );
    }

    #[test]
    fn string_arguments_and_missing_arguments() {
        let parsed = parse_tool_calls("<tool_call>{\"name\": \"f\", \"arguments\": \"{\\\"x\\\": 1}\"}</tool_call><tool_call>{\"name\": \"g\"}</tool_call>").unwrap();
        assert_eq!(parsed.tool_calls[0].arguments, json!({"x": 1}));
        assert_eq!(parsed.tool_calls[1].arguments, json!({}));
    }

    #[test]
    fn malformed_blocks_are_format_errors() {
        use ToolCallFormatError::*;
        let cases = [
            ("<tool_call>\n{\"name\": \"f\"", Unclosed { index: 0 }),
            ("a</tool_call>", UnexpectedClose { index: 0 }),
            (
                "<tool_call>{\"name\": \"f\"}</tool_call></tool_call>",
                UnexpectedClose { index: 1 },
            ),
            (
                "<tool_call><tool_call>{\"name\": \"f\"}</tool_call>",
                Unclosed { index: 0 },
            ),
            (
                "<tool_call>{\"arguments\": {}}</tool_call>",
                MissingName { index: 0 },
            ),
            (
                "<tool_call>{\"name\": \"f\", \"arguments\": [1]}</tool_call>",
                BadArguments { index: 0 },
            ),
            (
                "<tool_call>[1, 2]</tool_call>",
                BadJson {
                    index: 0,
                    message: "not an object".into(),
                },
            ),
        ];
        for (text, want) in cases {
            assert_eq!(parse_tool_calls(text).unwrap_err(), want, "{text:?}");
        }
        let e = parse_tool_calls("<tool_call>{name: f}</tool_call>").unwrap_err();
        assert!(matches!(e, BadJson { index: 0, .. }), "{e}");
        assert!(e.to_string().starts_with("tool call 0: not a JSON object"));
    }
}
