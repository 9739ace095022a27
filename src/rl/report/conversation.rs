//! An episode's chat form (`messages`) as the conversation a reader follows: the prompts, each
//! assistant turn with its tool calls shown as calls, each observation as the agent saw it (the
//! stored text, with the scaffold's `--observation-bytes` cut marked), and the format errors
//! (a masked turn, [`crate::agent::turn`], and the scaffold's answer to it) marked.
//!
//! ```text
//!   system            closed <details>: the same for every episode
//!   user (first)      the task prompt
//!   assistant         turn N: its text, then a box per <tool_call> (name, arguments);
//!                     `"loss": false` ─► FORMAT ERROR, masked: the raw text
//!   tool              observation: answer to call K of the turn before
//!   user (later)      "Format error: ..." ─► the scaffold's answer, marked
//! ```

use super::html::{escape, long_text, long_text_with};
use crate::agent::turn::parse_actions;
use crate::toolcall::{parse_tool_calls, ToolCall};
use serde_json::Value;
use std::collections::VecDeque;

/// How the scaffold answers a format error (agent::episode).
const FORMAT_ERROR_PREFIX: &str = "Format error: ";

/// The conversation's HTML: one block per message.
pub fn conversation_html(messages: &[Value]) -> String {
    let mut html = String::new();
    let mut turn = 0;
    let mut users = 0;
    // Short names of the last turn's calls, answered in order by the observations after it.
    let mut pending_calls: VecDeque<String> = VecDeque::new();
    for (i, message) in messages.iter().enumerate() {
        let role = message["role"].as_str().unwrap_or("?");
        let content = content_text(message);
        let block = match role {
            "system" => system_html(&content),
            "user" => {
                users += 1;
                user_html(&content, users == 1)
            }
            "assistant" => {
                turn += 1;
                let trained = message.get("loss") != Some(&Value::Bool(false));
                let last = i + 1 == messages.len();
                let (block, calls) = assistant_html(&content, turn, trained, last);
                pending_calls = calls.into();
                block
            }
            "tool" => observation_html(&content, pending_calls.pop_front()),
            other => format!(
                "<section class=\"message\"><h3><span class=\"role\">{}</span></h3>{}</section>",
                escape(other),
                long_text(&content, "text")
            ),
        };
        html.push_str(&block);
        html.push('\n');
    }
    html
}

/// A message's `content` as text: a string as it is, null as nothing, anything else as JSON.
fn content_text(message: &Value) -> String {
    match message.get("content") {
        Some(Value::String(s)) => s.clone(),
        None | Some(Value::Null) => String::new(),
        Some(other) => serde_json::to_string_pretty(other).unwrap_or_default(),
    }
}

fn system_html(content: &str) -> String {
    format!(
        "<details class=\"message system\"><summary><span class=\"role\">system prompt</span>\
         <span class=\"meta\">{} bytes</span></summary>{}</details>",
        content.len(),
        long_text(content, "text")
    )
}

fn user_html(content: &str, first: bool) -> String {
    if !first && content.starts_with(FORMAT_ERROR_PREFIX) {
        return format!(
            "<section class=\"message format-error-answer\"><h3><span class=\"role\">scaffold</span>\
             <span class=\"meta\">the answer to a format error</span>\
             <span class=\"badge flag\">format error</span></h3>{}</section>",
            long_text(content, "text")
        );
    }
    let what = if first { "the task" } else { "a user message" };
    format!(
        "<section class=\"message user\"><h3><span class=\"role\">user</span>\
         <span class=\"meta\">{what}</span></h3>{}</section>",
        long_text(content, "text")
    )
}

/// A turn's block and the short names of its calls (for the observations that answer them).
fn assistant_html(content: &str, turn: usize, trained: bool, last: bool) -> (String, Vec<String>) {
    let heading =
        format!("<span class=\"role\">assistant</span><span class=\"meta\">turn {turn}</span>");
    if !trained {
        // The answer that follows names the problem; the last turn has none, so it is named here.
        let reason = match (last, parse_actions(content)) {
            (true, Err(why)) => format!("<p class=\"note\">The parser: {}</p>", escape(&why)),
            _ => String::new(),
        };
        let text = if content.is_empty() {
            "<p class=\"note\">An empty reply (a stop token alone).</p>".to_string()
        } else {
            long_text(content, "text")
        };
        let block = format!(
            "<section class=\"message format-error\" id=\"turn-{turn}\"><h3>{heading}\
             <span class=\"badge flag\">format error</span>\
             <span class=\"badge masked-badge\">masked: not trained</span></h3>{reason}{text}</section>"
        );
        return (block, Vec::new());
    }
    let mut body = String::new();
    let mut names = Vec::new();
    match parse_tool_calls(content) {
        Ok(parsed) => {
            if !parsed.content.is_empty() {
                body.push_str(&long_text(&parsed.content, "text"));
            }
            for (k, call) in parsed.tool_calls.iter().enumerate() {
                body.push_str(&call_html(call, k + 1));
                names.push(call_name(call));
            }
            if parsed.tool_calls.is_empty() {
                body.push_str(
                    "<p class=\"note\">No tool call: the context filled up during this reply.</p>",
                );
            }
        }
        Err(e) => {
            body.push_str(&format!(
                "<p class=\"note\">Its tool calls do not parse ({}): the context filled up during this reply.</p>{}",
                escape(&e.to_string()),
                long_text(content, "text")
            ));
        }
    }
    let block = format!(
        "<section class=\"message assistant\" id=\"turn-{turn}\"><h3>{heading}</h3>{body}</section>"
    );
    (block, names)
}

/// A short name for a call: `bash: FIRST LINE`, `str_replace_editor view PATH`, `submit`.
fn call_name(call: &ToolCall) -> String {
    let arg = |k: &str| call.arguments.get(k).and_then(Value::as_str).unwrap_or("");
    let name = match call.name.as_str() {
        "bash" => format!("bash: {}", arg("command").lines().next().unwrap_or("")),
        "str_replace_editor" => format!("str_replace_editor {} {}", arg("command"), arg("path")),
        other => other.to_string(),
    };
    let mut end = name.len().min(100);
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    if end < name.len() {
        format!("{} …", &name[..end])
    } else {
        name
    }
}

/// One tool call as a box: its name, then each argument (the editor's command and path in the
/// header, bash's command alone).
fn call_html(call: &ToolCall, index: usize) -> String {
    let mut header = format!("<span class=\"tool-name\">{}</span>", escape(&call.name));
    let mut arguments = String::new();
    let editor = call.name == "str_replace_editor";
    for (key, value) in call.arguments.as_object().into_iter().flatten() {
        let text = match value {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        if editor && (key == "command" || key == "path") {
            header.push_str(&format!(" <code>{}</code>", escape(&text)));
        } else if call.name == "bash" && key == "command" {
            arguments.push_str(&long_text(&text, "command"));
        } else {
            arguments.push_str(&format!(
                "<div class=\"argument\"><span class=\"argument-name\">{}</span>{}</div>",
                escape(key),
                long_text(&text, "argument-value")
            ));
        }
    }
    format!(
        "<div class=\"call\"><div class=\"meta\">tool call {index}</div>{header}{arguments}</div>"
    )
}

fn observation_html(content: &str, answers: Option<String>) -> String {
    let answers = answers
        .map(|name| {
            format!(
                " <span class=\"meta\">to <code>{}</code></span>",
                escape(&name)
            )
        })
        .unwrap_or_default();
    format!(
        "<section class=\"message tool\"><h3><span class=\"role\">observation</span>{answers}</h3>{}</section>",
        long_text_with(content, "observation", &mark_agent_cuts)
    )
}

/// `text` escaped, with each `[... N bytes omitted ...]` that the scaffold's
/// `--observation-bytes` cut wrote ([`crate::agent::episode::truncate_middle`]) highlighted.
pub fn mark_agent_cuts(text: &str) -> String {
    const OPEN: &str = "[... ";
    const CLOSE: &str = " bytes omitted ...]";
    let escaped = escape(text);
    let mut out = String::with_capacity(escaped.len());
    let mut rest = escaped.as_str();
    while let Some(i) = rest.find(OPEN) {
        let after = &rest[i + OPEN.len()..];
        let digits = after.bytes().take_while(u8::is_ascii_digit).count();
        if digits > 0 && after[digits..].starts_with(CLOSE) {
            let end = i + OPEN.len() + digits + CLOSE.len();
            out.push_str(&rest[..i]);
            out.push_str("<span class=\"agent-cut\" title=\"cut by --observation-bytes: the agent saw this marker\">");
            out.push_str(&rest[i..end]);
            out.push_str("</span>");
            rest = &rest[end..];
        } else {
            out.push_str(&rest[..i + OPEN.len()]);
            rest = &rest[i + OPEN.len()..];
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn conversation() -> Vec<Value> {
        vec![
            json!({"role": "system", "content": "You are an engineer."}),
            json!({"role": "user", "content": "<issue>fix the bug</issue>"}),
            json!({"role": "assistant", "content": "Let me look.\n<tool_call>\n{\"name\": \"bash\", \"arguments\": {\"command\": \"ls -la\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"str_replace_editor\", \"arguments\": {\"command\": \"str_replace\", \"path\": \"a.py\", \"old_str\": \"x < 1\", \"new_str\": \"x <= 1\"}}\n</tool_call>"}),
            json!({"role": "tool", "content": "a.py\n<script>alert(1)</script></details>"}),
            json!({"role": "tool", "content": "The file a.py has been edited."}),
            json!({"role": "assistant", "content": "<tool_call>{oops", "loss": false}),
            json!({"role": "user", "content": "Format error: tool call 0: <tool_call> is never closed"}),
            json!({"role": "assistant", "content": "I give up", "loss": false}),
        ]
    }

    #[test]
    fn calls_observations_and_format_errors_are_laid_out_in_order() {
        let html = conversation_html(&conversation());
        let order = [
            "system prompt",
            "&lt;issue&gt;fix the bug&lt;/issue&gt;",
            "turn 1",
            "Let me look.",
            "tool call 1</div><span class=\"tool-name\">bash</span>",
            "<pre class=\"command\">ls -la</pre>",
            "tool call 2</div><span class=\"tool-name\">str_replace_editor</span> <code>str_replace</code> <code>a.py</code>",
            "<span class=\"argument-name\">old_str</span><pre class=\"argument-value\">x &lt; 1</pre>",
            "to <code>bash: ls -la</code>",
            "&lt;script&gt;alert(1)&lt;/script&gt;&lt;/details&gt;",
            "to <code>str_replace_editor str_replace a.py</code>",
            "turn 2</span><span class=\"badge flag\">format error</span><span class=\"badge masked-badge\">masked: not trained</span>",
            "&lt;tool_call&gt;{oops",
            "the answer to a format error",
            "turn 3",
            "The parser: your reply has no tool call",
        ];
        let mut from = 0;
        for part in order {
            let at = html[from..]
                .find(part)
                .unwrap_or_else(|| panic!("{part} not after {from} in\n{html}"));
            from += at + part.len();
        }
        // The hostile observation made no element; the only details element is the system's.
        assert!(!html.contains("<script>"));
        assert_eq!(html.matches("</details>").count(), 1);
        // Only the last format error names its reason (the others have the scaffold's answer).
        assert_eq!(html.matches("The parser:").count(), 1);
    }

    #[test]
    fn the_agents_cut_marker_is_highlighted_and_fakes_of_it_are_not() {
        let text = "head <b>\n[... 1234 bytes omitted ...]\ntail [... x bytes omitted ...] [... 5";
        let html = mark_agent_cuts(text);
        assert_eq!(
            html,
            "head &lt;b&gt;\n<span class=\"agent-cut\" title=\"cut by --observation-bytes: the agent saw this marker\">[... 1234 bytes omitted ...]</span>\ntail [... x bytes omitted ...] [... 5"
        );
        // The real cut's marker is what the report highlights.
        let cut = crate::agent::episode::truncate_middle(&"y".repeat(100), 20);
        assert!(mark_agent_cuts(&cut).contains("<span class=\"agent-cut\""));
    }

    #[test]
    fn odd_contents_and_roles_still_render() {
        let html = conversation_html(&[
            json!({"role": "user", "content": null}),
            json!({"role": "assistant", "content": "", "loss": false}),
            json!({"role": "narrator", "content": [1, 2]}),
            json!({"role": "assistant", "content": "no calls at all, context ended"}),
            json!({"role": "tool", "content": "orphan"}),
        ]);
        assert!(html.contains("narrator") && html.contains("1,\n  2"));
        assert!(html.contains("No tool call"));
        assert!(html.contains("An empty reply (a stop token alone)."));
        assert!(html.contains("orphan"));
    }
}
