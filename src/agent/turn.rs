//! A reply's rules, in one place: what the policy's tokens of one turn are to the episode and to
//! the trainer. [`super::episode`] acts on the verdict; [`super::transcript`] only appends.
//!
//! ```text
//!  generated tokens ── ends in a stop id? ── the text is decoded without it
//!   ├ not stopped, and the reply reaches --max-context ─► ContextFull: kept as generated
//!   │     (trained, not closed: nothing follows), the episode ends
//!   ├ the text's tool calls are valid ─► Actions: trained; closed with an <|im_end|> that was
//!   │     not generated (mask 0) when cut by --max-turn-tokens after complete calls
//!   ├ not stopped, calls incomplete ─► FormatError "cut at N tokens": masked, closed
//!   └ otherwise (no call, bad JSON, unknown tool, missing argument) ─► FormatError: masked, closed
//! ```
//!
//! A format error stays in the context (the agent sees what it wrote and a user message saying
//! what was wrong) but is out of the loss (RL-SPEC: format-error turns are masked).

use super::policy::TurnOutput;
use crate::toolcall::{parse_tool_calls, ToolCall};
use serde_json::Value;

/// What one reply is.
#[derive(Clone, Debug, PartialEq)]
pub enum Reply {
    /// The context is full: the episode ends with this reply as generated.
    ContextFull,
    /// Valid tool calls, to run in order.
    Actions(Vec<ToolCall>),
    /// No valid tool call: the message the agent is shown.
    FormatError(String),
}

impl Reply {
    /// Judges `out` (whose text, the stop token left out, is `text`) when the episode held
    /// `context_used` tokens before it, under `max_context`.
    pub fn judge(out: &TurnOutput, text: &str, context_used: usize, max_context: usize) -> Self {
        if !out.stopped && context_used + out.tokens.len() >= max_context {
            return Reply::ContextFull;
        }
        match parse_actions(text) {
            Ok(calls) => Reply::Actions(calls),
            Err(_) if !out.stopped => Reply::FormatError(format!(
                "Your reply was cut at {} tokens before it ended. Keep replies shorter.",
                out.tokens.len()
            )),
            Err(message) => Reply::FormatError(message),
        }
    }

    /// Whether the reply's tokens enter the loss (action mask 1).
    pub fn trained(&self) -> bool {
        !matches!(self, Reply::FormatError(_))
    }

    /// Whether a reply that did not generate its `<|im_end|>` gets one (mask 0): every reply
    /// but the last of a full context, which nothing follows.
    pub fn closed(&self) -> bool {
        !matches!(self, Reply::ContextFull)
    }
}

/// The generated tokens without the stop token that ended them (the text the agent wrote).
pub fn reply_body(out: &TurnOutput) -> &[u32] {
    if out.stopped {
        &out.tokens[..out.tokens.len().saturating_sub(1)]
    } else {
        &out.tokens
    }
}

/// The reply's tool calls, or what is wrong with them.
pub fn parse_actions(text: &str) -> Result<Vec<ToolCall>, String> {
    let parsed = parse_tool_calls(text).map_err(|e| {
        format!("{e}. Call a tool as <tool_call>\n{{\"name\": NAME, \"arguments\": {{...}}}}\n</tool_call>.")
    })?;
    if parsed.tool_calls.is_empty() {
        return Err("your reply has no tool call. Every reply must call at least one tool (bash, str_replace_editor, or submit when you are done).".into());
    }
    for call in &parsed.tool_calls {
        let required: &[&str] = match call.name.as_str() {
            "bash" => &["command"],
            "str_replace_editor" => &["command", "path"],
            "submit" => &[],
            other => {
                return Err(format!(
                    "unknown tool `{other}`; the tools are bash, str_replace_editor and submit."
                ))
            }
        };
        for arg in required {
            if !call.arguments.get(*arg).is_some_and(Value::is_string) {
                return Err(format!(
                    "`{}` needs the string argument `{arg}`.",
                    call.name
                ));
            }
        }
    }
    Ok(parsed.tool_calls)
}

#[cfg(test)]
mod tests {
    use super::*;

    const LS: &str =
        "<tool_call>\n{\"name\": \"bash\", \"arguments\": {\"command\": \"ls\"}}\n</tool_call>";

    fn output(tokens: usize, stopped: bool) -> TurnOutput {
        TurnOutput {
            tokens: vec![7; tokens],
            logprobs: None,
            stopped,
            weight_version: None,
        }
    }

    #[test]
    fn format_errors_name_the_problem() {
        assert!(parse_actions("just text")
            .unwrap_err()
            .contains("no tool call"));
        assert!(parse_actions("<tool_call>\n{bad json\n</tool_call>")
            .unwrap_err()
            .contains("not a JSON object"));
        assert!(
            parse_actions("<tool_call>\n{\"name\": \"rm\", \"arguments\": {}}\n</tool_call>")
                .unwrap_err()
                .contains("unknown tool `rm`")
        );
        assert!(parse_actions(
            "<tool_call>\n{\"name\": \"bash\", \"arguments\": {}}\n</tool_call>"
        )
        .unwrap_err()
        .contains("`command`"));
        let ok = parse_actions(&format!(
            "x {LS}<tool_call>\n{{\"name\": \"submit\", \"arguments\": {{}}}}\n</tool_call>"
        ))
        .unwrap();
        assert_eq!(ok.len(), 2);
    }

    #[test]
    fn each_kind_of_reply_is_masked_and_closed_by_the_rules() {
        // Stopped with valid calls: trained, closed.
        let r = Reply::judge(&output(10, true), LS, 100, 1000);
        assert!(matches!(r, Reply::Actions(_)) && r.trained() && r.closed());
        // Cut by the turn limit after complete calls: still actions.
        let r = Reply::judge(&output(10, false), LS, 100, 1000);
        assert!(matches!(r, Reply::Actions(_)));
        // Cut before the calls were complete: a format error saying so, masked, closed.
        let r = Reply::judge(&output(10, false), "<tool_call>\n{\"na", 100, 1000);
        assert_eq!(
            r,
            Reply::FormatError(
                "Your reply was cut at 10 tokens before it ended. Keep replies shorter.".into()
            )
        );
        assert!(!r.trained() && r.closed());
        // Not stopped and at the context limit: kept as generated, trained, not closed.
        let r = Reply::judge(&output(10, false), LS, 990, 1000);
        assert_eq!(r, Reply::ContextFull);
        assert!(r.trained() && !r.closed());
        // Stopped exactly at the limit: judged as a reply (the stop token fits).
        let r = Reply::judge(&output(10, true), LS, 990, 1000);
        assert!(matches!(r, Reply::Actions(_)));
        // No call: a format error with the reason.
        let r = Reply::judge(&output(3, true), "hello", 0, 1000);
        assert!(matches!(&r, Reply::FormatError(m) if m.contains("no tool call")));
    }

    #[test]
    fn the_body_leaves_out_the_stop_token() {
        let stopped = TurnOutput {
            tokens: vec![1, 2, 3],
            logprobs: None,
            stopped: true,
            weight_version: None,
        };
        assert_eq!(reply_body(&stopped), &[1, 2]);
        let cut = TurnOutput {
            stopped: false,
            ..stopped
        };
        assert_eq!(reply_body(&cut), &[1, 2, 3]);
    }
}
