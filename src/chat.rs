//! Chat rendering with a real Jinja engine, token ids with an action mask, and tool-call parsing.
//!
//! The template is whatever the checkpoint carries (Qwen2.5's by default), rendered by minijinja
//! with HF's options (`trim_blocks`, `lstrip_blocks`), Python-compatible methods, and a `tojson`
//! that writes JSON as Python's `json.dumps(x, ensure_ascii=False)` does (`", "` and `": "`,
//! insertion order, non-ASCII kept): a prompt rendered any other way is one the model never saw.
//!
//! Action mask: 1 on the tokens of assistant turns (content, tool calls, the closing
//! `<|im_end|>`), 0 elsewhere, and 0 on an assistant message with `"loss": false`.
//!
//! ```text
//! <|im_start|>user\nFix it<|im_end|>\n<|im_start|>assistant\nDone.<|im_end|>\n
//! └────────────────── 0 ──────────────────────────────────────┘└─── 1 ────┘└0┘
//! ```
//!
//! Spans are found by rendering prefixes: an assistant turn starts where the conversation before
//! it, rendered with the generation prompt, ends, and ends at the last `<|im_end|>` of the
//! conversation rendered through it. Tokens come from tokenizing the text piece by piece between
//! added tokens (which the tokenizer isolates anyway), so they equal the whole text's tokens.

use crate::tokenizer::{ByteSpans, Tokenizer};
use anyhow::{anyhow, bail, Context, Result};
use minijinja::{Environment, ErrorKind, Value as JinjaValue};
use serde_json::{Map, Value};

/// Qwen2.5-Instruct's chat template (also embedded in assets/qwen2.5/tokenizer_config.json).
pub const QWEN25_CHAT_TEMPLATE: &str = include_str!("chat_template.jinja");

/// A conversation checked and normalised for rendering: roles known, tool-call arguments parsed
/// into objects, content as text.
#[derive(Clone, Debug)]
pub struct Conversation {
    pub messages: Vec<Value>,
    pub tools: Option<Vec<Value>>,
}

/// Token ids of a rendered conversation and the action mask over them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MaskedTokens {
    pub tokens: Vec<u32>,
    pub action_mask: Vec<u8>,
}

impl MaskedTokens {
    /// The tokens with mask 1, in order: what the loss trains on.
    pub fn action_tokens(&self) -> Vec<u32> {
        self.tokens
            .iter()
            .zip(&self.action_mask)
            .filter(|(_, &m)| m == 1)
            .map(|(&t, _)| t)
            .collect()
    }
}

impl Conversation {
    /// Checks and normalises OpenAI/HF-style messages. Errors name the message index.
    pub fn new(messages: &[Value], tools: Option<&[Value]>) -> Result<Self> {
        if messages.is_empty() {
            bail!("messages: the conversation is empty");
        }
        let messages = messages
            .iter()
            .enumerate()
            .map(|(i, m)| normalise_message(m).with_context(|| format!("messages[{i}]")))
            .collect::<Result<Vec<_>>>()?;
        let tools = tools
            .map(|tools| {
                tools
                    .iter()
                    .enumerate()
                    .map(|(i, t)| match t {
                        Value::Object(_) => Ok(t.clone()),
                        other => {
                            bail!("tools[{i}]: a tool definition must be an object, found {other}")
                        }
                    })
                    .collect::<Result<Vec<_>>>()
            })
            .transpose()?;
        Ok(Self { messages, tools })
    }

    /// Parses `{"messages": [...], "tools": [...]}`.
    pub fn from_json(value: &Value) -> Result<Self> {
        let messages = value
            .get("messages")
            .and_then(Value::as_array)
            .ok_or_else(|| anyhow!("expected a `messages` array"))?;
        let tools = match value.get("tools") {
            None | Some(Value::Null) => None,
            Some(Value::Array(t)) => Some(t.as_slice()),
            Some(other) => bail!("`tools` must be an array, found {other}"),
        };
        Self::new(messages, tools)
    }
}

fn normalise_message(message: &Value) -> Result<Value> {
    let Value::Object(obj) = message else {
        bail!("a message must be an object, found {message}")
    };
    let role = obj
        .get("role")
        .and_then(Value::as_str)
        .ok_or_else(|| anyhow!("no `role`"))?;
    if !matches!(role, "system" | "developer" | "user" | "assistant" | "tool") {
        bail!("unknown role {role:?} (expected system, developer, user, assistant or tool)");
    }
    let mut out = obj.clone();
    if role == "developer" {
        // OpenAI's newer name for the system role; Qwen2.5's template knows only `system`.
        out.insert("role".into(), Value::String("system".into()));
    }
    let content = match obj.get("content") {
        None | Some(Value::Null) => Value::String(String::new()),
        Some(Value::String(s)) => Value::String(s.clone()),
        // OpenAI content parts: the text parts, joined.
        Some(Value::Array(parts)) => {
            let mut text = String::new();
            for (p, part) in parts.iter().enumerate() {
                match (
                    part.get("type").and_then(Value::as_str),
                    part.get("text").and_then(Value::as_str),
                ) {
                    (Some("text"), Some(t)) => text.push_str(t),
                    _ => bail!("content[{p}]: only text parts are supported, found {part}"),
                }
            }
            Value::String(text)
        }
        Some(other) => bail!("`content` must be a string, found {other}"),
    };
    out.insert("content".into(), content);
    match obj.get("tool_calls") {
        None | Some(Value::Null) => {
            out.remove("tool_calls");
        }
        Some(Value::Array(calls)) if role == "assistant" => {
            let calls = calls
                .iter()
                .enumerate()
                .map(|(c, call)| {
                    normalise_tool_call(call).with_context(|| format!("tool_calls[{c}]"))
                })
                .collect::<Result<Vec<_>>>()?;
            if calls.is_empty() {
                out.remove("tool_calls");
            } else {
                out.insert("tool_calls".into(), Value::Array(calls));
            }
        }
        Some(Value::Array(_)) => {
            bail!("only assistant messages may carry `tool_calls` (role is {role:?})")
        }
        Some(other) => bail!("`tool_calls` must be an array, found {other}"),
    }
    match obj.get("loss") {
        None | Some(Value::Bool(_)) => {}
        Some(other) => bail!("`loss` must be true or false, found {other}"),
    }
    Ok(Value::Object(out))
}

/// `{"type": "function", "function": {"name", "arguments"}}` or `{"name", "arguments"}`; a JSON
/// string `arguments` (OpenAI style) is parsed into an object (HF style).
fn normalise_tool_call(call: &Value) -> Result<Value> {
    let function = call.get("function").unwrap_or(call);
    let name = match function.get("name") {
        Some(Value::String(n)) if !n.is_empty() => n.clone(),
        _ => bail!("a tool call needs a non-empty `name`"),
    };
    let arguments = match function.get("arguments") {
        None | Some(Value::Null) => Value::Object(Map::new()),
        Some(Value::String(s)) => serde_json::from_str(s)
            .with_context(|| format!("`arguments` of {name} is a string but not JSON"))?,
        Some(v) => v.clone(),
    };
    let mut function_obj = Map::new();
    function_obj.insert("name".into(), Value::String(name));
    function_obj.insert("arguments".into(), arguments);
    let mut out = match call {
        Value::Object(o) => o.clone(),
        _ => bail!("a tool call must be an object"),
    };
    out.remove("name");
    out.remove("arguments");
    out.insert("type".into(), Value::String("function".into()));
    out.insert("function".into(), Value::Object(function_obj));
    Ok(Value::Object(out))
}

/// A compiled chat template.
pub struct ChatTemplate {
    env: Environment<'static>,
}

impl ChatTemplate {
    /// The tokenizer's own template, or Qwen2.5's when it carries none.
    pub fn for_tokenizer(tokenizer: &Tokenizer) -> Result<Self> {
        Self::new(tokenizer.chat_template().unwrap_or(QWEN25_CHAT_TEMPLATE))
    }

    pub fn new(source: &str) -> Result<Self> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_filter("tojson", tojson_filter);
        env.add_function(
            "raise_exception",
            |message: String| -> Result<JinjaValue, minijinja::Error> {
                Err(minijinja::Error::new(ErrorKind::InvalidOperation, message))
            },
        );
        env.add_template_owned("chat", source.to_string())
            .map_err(|e| anyhow!("the chat template does not compile: {e:#}"))?;
        Ok(Self { env })
    }

    /// The conversation as text, as HF's `apply_chat_template(..., tokenize=False)` renders it.
    pub fn render(
        &self,
        conversation: &Conversation,
        add_generation_prompt: bool,
    ) -> Result<String> {
        self.render_with(conversation, add_generation_prompt, &Map::new())
    }

    /// [`ChatTemplate::render`] with extra template variables (vLLM's `chat_template_kwargs`,
    /// e.g. `enable_thinking`); `messages`, `tools` and `add_generation_prompt` keep their
    /// values.
    pub fn render_with(
        &self,
        conversation: &Conversation,
        add_generation_prompt: bool,
        kwargs: &Map<String, Value>,
    ) -> Result<String> {
        self.render_messages_with(
            &conversation.messages,
            conversation.tools.as_deref(),
            add_generation_prompt,
            kwargs,
        )
    }

    fn render_messages(
        &self,
        messages: &[Value],
        tools: Option<&[Value]>,
        add_generation_prompt: bool,
    ) -> Result<String> {
        self.render_messages_with(messages, tools, add_generation_prompt, &Map::new())
    }

    fn render_messages_with(
        &self,
        messages: &[Value],
        tools: Option<&[Value]>,
        add_generation_prompt: bool,
        kwargs: &Map<String, Value>,
    ) -> Result<String> {
        let template = self.env.get_template("chat").expect("added in new()");
        let ctx = minijinja::context! {
            messages => JinjaValue::from_serialize(messages),
            tools => tools.map(JinjaValue::from_serialize),
            add_generation_prompt => add_generation_prompt,
            ..JinjaValue::from_serialize(kwargs)
        };
        template.render(ctx).map_err(|e| {
            // Name the first message whose prefix no longer renders.
            let culprit = (1..messages.len()).find(|&k| {
                self.render_messages_with(&messages[..k], tools, false, kwargs)
                    .is_err()
            });
            let at = culprit.map_or(messages.len().saturating_sub(1), |k| k - 1);
            anyhow!("messages[{at}]: the chat template failed to render: {e:#}")
        })
    }

    /// Token ids of the rendered conversation (no generation prompt) and its action mask.
    pub fn tokenize(
        &self,
        tokenizer: &Tokenizer,
        conversation: &Conversation,
    ) -> Result<MaskedTokens> {
        let messages = &conversation.messages;
        let tools = conversation.tools.as_deref();
        let text = self.render_messages(messages, tools, false)?;
        // Character spans of assistant turns that count in the loss.
        let mut spans = Vec::new();
        for (i, message) in messages.iter().enumerate() {
            if message["role"] != "assistant" || message.get("loss") == Some(&Value::Bool(false)) {
                continue;
            }
            let before = self.render_messages(&messages[..i], tools, true)?;
            let through = self.render_messages(&messages[..=i], tools, false)?;
            if !text.starts_with(&before)
                || !text.starts_with(&through)
                || through.len() < before.len()
            {
                bail!("messages[{i}]: the chat template does not render this conversation prefix by prefix, so the assistant turn cannot be located");
            }
            let end = match through[before.len()..].rfind(crate::tokenizer::IM_END) {
                Some(at) => before.len() + at + crate::tokenizer::IM_END.len(),
                None => through.len(),
            };
            spans.push(before.len()..end);
        }
        let (tokens, offsets) = tokenize_by_pieces(tokenizer, &text)?;
        let action_mask = offsets
            .iter()
            .map(|&(start, end)| spans.iter().any(|s| end > s.start && start < s.end) as u8)
            .collect();
        Ok(MaskedTokens {
            tokens,
            action_mask,
        })
    }
}

/// Tokenizes `text` piece by piece, cutting before and after every added token, and returns
/// the ids with each token's byte span in `text`.
fn tokenize_by_pieces(tokenizer: &Tokenizer, text: &str) -> Result<(Vec<u32>, ByteSpans)> {
    let mut tokens = Vec::new();
    let mut offsets = Vec::new();
    let mut piece_start = 0;
    let mut push_piece = |piece_start: usize, piece: &str| -> Result<()> {
        if piece.is_empty() {
            return Ok(());
        }
        let (ids, spans) = tokenizer.encode_with_offsets(piece)?;
        tokens.extend(ids);
        offsets.extend(
            spans
                .into_iter()
                .map(|(s, e)| (piece_start + s, piece_start + e)),
        );
        Ok(())
    };
    let mut i = 0;
    while i < text.len() {
        if let Some(token) = tokenizer.added_token_at(&text[i..]) {
            push_piece(piece_start, &text[piece_start..i])?;
            push_piece(i, &text[i..i + token.len()])?;
            i += token.len();
            piece_start = i;
        } else {
            i += text[i..].chars().next().map_or(1, char::len_utf8);
        }
    }
    push_piece(piece_start, &text[piece_start..])?;
    Ok((tokens, offsets))
}

/// Python's `json.dumps(value, ensure_ascii=False)`.
fn tojson_filter(value: JinjaValue) -> Result<JinjaValue, minijinja::Error> {
    let json = serde_json::to_value(&value)
        .map_err(|e| minijinja::Error::new(ErrorKind::InvalidOperation, format!("tojson: {e}")))?;
    let mut out = String::new();
    write_python_json(&json, &mut out);
    Ok(JinjaValue::from_safe_string(out))
}

pub(crate) fn write_python_json(value: &Value, out: &mut String) {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => match (n.as_i64(), n.as_u64(), n.as_f64()) {
            (Some(i), _, _) => out.push_str(&i.to_string()),
            (_, Some(u), _) => out.push_str(&u.to_string()),
            (_, _, Some(f)) => out.push_str(&python_float_repr(f)),
            _ => out.push_str(&n.to_string()),
        },
        Value::String(s) => write_python_string(s, out),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_python_json(item, out);
            }
            out.push(']');
        }
        Value::Object(map) => {
            out.push('{');
            for (i, (k, v)) in map.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_python_string(k, out);
                out.push_str(": ");
                write_python_json(v, out);
            }
            out.push('}');
        }
    }
}

fn write_python_string(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Python's `repr(float)`: shortest round-trip digits; exponent form when the decimal exponent
/// is below -4 or at least 16 (`1e-05`, `1e+16`), otherwise positional with at least one
/// fractional digit (`1.0`, `0.0001`).
fn python_float_repr(f: f64) -> String {
    if f.is_nan() {
        return "NaN".into();
    }
    if f.is_infinite() {
        return if f > 0.0 {
            "Infinity".into()
        } else {
            "-Infinity".into()
        };
    }
    let sci = format!("{f:e}"); // shortest digits, e.g. "-1.2345e-7"
    let (mantissa, exponent) = sci.split_once('e').expect("{:e} has an exponent");
    let exponent: i32 = exponent.parse().expect("integer exponent");
    let negative = mantissa.starts_with('-');
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    let sign = if negative { "-" } else { "" };
    if (-4..16).contains(&exponent) {
        let point = exponent + 1; // digits before the decimal point
        let (int_part, frac_part) = if point <= 0 {
            (
                "0".to_string(),
                format!("{}{}", "0".repeat((-point) as usize), digits),
            )
        } else if point as usize >= digits.len() {
            (
                format!("{digits}{}", "0".repeat(point as usize - digits.len())),
                String::new(),
            )
        } else {
            (
                digits[..point as usize].to_string(),
                digits[point as usize..].to_string(),
            )
        };
        let frac_part = if frac_part.is_empty() {
            "0".to_string()
        } else {
            frac_part
        };
        format!("{sign}{int_part}.{frac_part}")
    } else {
        let (first, rest) = digits.split_at(1);
        let mantissa = if rest.is_empty() {
            first.to_string()
        } else {
            format!("{first}.{rest}")
        };
        let exp_sign = if exponent < 0 { '-' } else { '+' };
        format!("{sign}{mantissa}e{exp_sign}{:02}", exponent.abs())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_float_reprs() {
        for (f, want) in [
            (1.0, "1.0"),
            (0.5, "0.5"),
            (-2.25, "-2.25"),
            (1e-5, "1e-05"),
            (0.0001, "0.0001"),
            (1e16, "1e+16"),
            (123456789012345.0, "123456789012345.0"),
            (1.5e300, "1.5e+300"),
            (0.1 + 0.2, "0.30000000000000004"),
            (0.0, "0.0"),
        ] {
            assert_eq!(python_float_repr(f), want, "{f}");
        }
    }

    #[test]
    fn python_json_layout() {
        let v: Value = serde_json::from_str(
            r#"{"b": 1, "a": [true, null, "x\"y\n\u0001é"], "c": {"d": 2.5}}"#,
        )
        .unwrap();
        let mut out = String::new();
        write_python_json(&v, &mut out);
        assert_eq!(
            out,
            r#"{"b": 1, "a": [true, null, "x\"y\n\u0001é"], "c": {"d": 2.5}}"#
        );
    }
}
