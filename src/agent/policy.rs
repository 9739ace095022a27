//! Who writes the assistant turns: the model (through the in-process engine or a running
//! `swerve-serve`), or a script that needs no model (oracle, noop, replay) to test environments,
//! sandbox limits and grading on their own.

use crate::engine::{EngineHandle, FinishReason, GenerationRequest, RequestEvent, SamplingParams};
use crate::env::Task;
use crate::http_client::http_request;
use crate::tokenizer::{Tokenizer, IM_END};
use anyhow::{anyhow, bail, Context, Result};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// One turn to write.
pub struct TurnInput<'a> {
    pub task: &'a Task,
    /// Everything so far, ending in the generation prompt.
    pub tokens: &'a [u32],
    /// 1-based.
    pub turn: usize,
    pub max_tokens: usize,
    /// Seeds this turn's sampling.
    pub seed: u64,
}

pub struct TurnOutput {
    pub tokens: Vec<u32>,
    /// The sampler's logprob per token (model policies).
    pub logprobs: Option<Vec<f32>>,
    /// Ended by a stop token (the last of `tokens`); false: cut by `max_tokens`.
    pub stopped: bool,
    /// The weight version the tokens were sampled under, where known.
    pub weight_version: Option<u64>,
}

pub trait Policy: Send + Sync {
    fn name(&self) -> String;
    fn generate(&self, input: &TurnInput<'_>) -> Result<TurnOutput>;
    /// Ends every generation in flight (their `generate` calls return an error); a policy that
    /// cannot does nothing, and its episodes stop at their next turn instead.
    fn abort_in_flight(&self) {}
}

/// The model through the in-process engine (RL-correct sampling: temperature 1, no filters).
pub struct EnginePolicy {
    pub engine: Arc<EngineHandle>,
    pub stop_ids: Vec<u32>,
    pub temperature: f32,
}

impl Policy for EnginePolicy {
    fn name(&self) -> String {
        "model".into()
    }

    fn abort_in_flight(&self) {
        // An engine that has stopped has nothing in flight.
        let _ = self.engine.abort_all();
    }

    fn generate(&self, input: &TurnInput<'_>) -> Result<TurnOutput> {
        let request = GenerationRequest {
            prompt: input.tokens.to_vec(),
            params: SamplingParams {
                temperature: self.temperature,
                seed: Some(input.seed),
                ..SamplingParams::default()
            },
            max_tokens: input.max_tokens,
            stop_ids: self.stop_ids.clone(),
            prompt_logprobs: None,
        };
        let (_, events) = self.engine.submit(request)?;
        for event in events {
            if let RequestEvent::Finished(record) = event {
                let stopped = match &record.finish_reason {
                    FinishReason::Stop(_) => true,
                    FinishReason::Length => false,
                    FinishReason::Abort => bail!("the engine aborted the request"),
                    FinishReason::Error(e) => bail!("the engine failed the request: {e}"),
                };
                return Ok(TurnOutput {
                    tokens: record.output_tokens,
                    logprobs: Some(record.logprobs),
                    stopped,
                    weight_version: Some(record.weight_version),
                });
            }
        }
        Err(anyhow!("the engine stopped before the request finished"))
    }
}

/// The model behind a running `swerve-serve` (`--server URL`): token ids in, token ids and
/// logprobs out, through `/v1/completions`.
pub struct ServerPolicy {
    /// host:port
    pub address: String,
    pub api_key: Option<String>,
    pub stop_ids: Vec<u32>,
}

impl ServerPolicy {
    /// From `http://HOST:PORT` (plain HTTP; swerve-serve speaks HTTP/1).
    pub fn new(url: &str, api_key: Option<String>, stop_ids: Vec<u32>) -> Result<Self> {
        let rest = url.strip_prefix("http://").ok_or_else(|| {
            anyhow!("--server {url}: expected http://HOST:PORT (swerve-serve speaks plain HTTP)")
        })?;
        let address = rest
            .trim_end_matches('/')
            .trim_end_matches("/v1")
            .to_string();
        if address.is_empty() || address.contains('/') {
            bail!("--server {url}: expected http://HOST:PORT");
        }
        Ok(Self {
            address,
            api_key,
            stop_ids,
        })
    }

    /// POSTs a JSON body; the answer's JSON, or an error with the status and body.
    pub fn post_json(&self, path: &str, body: &Value) -> Result<Value> {
        let auth = self.api_key.as_ref().map(|k| format!("Bearer {k}"));
        let headers: Vec<(&str, &str)> = auth
            .as_deref()
            .map(|a| vec![("Authorization", a)])
            .unwrap_or_default();
        let (status, body) = http_request(&self.address, "POST", path, &headers, Some(body))
            .with_context(|| format!("swerve-serve at {}", self.address))?;
        let text = String::from_utf8_lossy(&body);
        if status != 200 {
            bail!("{}{path}: HTTP {status}: {text}", self.address);
        }
        serde_json::from_str(&text).with_context(|| format!("{}{path}: not JSON", self.address))
    }
}

impl Policy for ServerPolicy {
    fn name(&self) -> String {
        format!("server http://{}", self.address)
    }

    fn generate(&self, input: &TurnInput<'_>) -> Result<TurnOutput> {
        let answer = self.post_json(
            "/v1/completions",
            &json!({
                "prompt": input.tokens,
                "max_tokens": input.max_tokens,
                "temperature": 1.0,
                "seed": input.seed,
                "logprobs": 0,
                "stop_token_ids": self.stop_ids,
            }),
        )?;
        let choice = answer
            .pointer("/choices/0")
            .ok_or_else(|| anyhow!("swerve-serve answered without choices: {answer}"))?;
        let tokens: Vec<u32> = choice
            .get("token_ids")
            .and_then(Value::as_array)
            .ok_or_else(|| anyhow!("swerve-serve answered without token_ids"))?
            .iter()
            .map(|v| v.as_u64().map(|t| t as u32))
            .collect::<Option<_>>()
            .ok_or_else(|| anyhow!("token_ids are not ids"))?;
        let logprobs: Vec<f32> = choice
            .pointer("/logprobs/token_logprobs")
            .and_then(Value::as_array)
            .ok_or_else(|| anyhow!("swerve-serve answered without logprobs"))?
            .iter()
            .map(|v| v.as_f64().map(|x| x as f32))
            .collect::<Option<_>>()
            .ok_or_else(|| anyhow!("a token logprob is not a number"))?;
        if logprobs.len() != tokens.len() {
            bail!(
                "swerve-serve gave {} logprobs for {} tokens",
                logprobs.len(),
                tokens.len()
            );
        }
        let finish = choice.get("finish_reason").and_then(Value::as_str);
        let stopped = match finish {
            Some("stop") => true,
            Some("length") => false,
            // Aborted (a pause, a weight update, a shutdown): the last token may be cut, so
            // the turn is not kept; the episode starts again as an infrastructure failure.
            Some("abort") => bail!(
                "swerve-serve aborted the request after {} tokens",
                tokens.len()
            ),
            // No reason: nothing says the reply is whole.
            other => bail!(
                "swerve-serve ended a reply after {} tokens with finish_reason {other:?} (expected \"stop\" or \"length\")",
                tokens.len()
            ),
        };
        if tokens.is_empty() {
            bail!("swerve-serve ended a reply with no token (finish_reason {finish:?})");
        }
        Ok(TurnOutput {
            tokens,
            logprobs: Some(logprobs),
            stopped,
            weight_version: answer.get("weight_version").and_then(Value::as_u64),
        })
    }
}

/// Policies that write text, tokenized here and closed with `<|im_end|>`.
pub struct ScriptedPolicy {
    pub tokenizer: Arc<Tokenizer>,
    pub script: Script,
}

pub enum Script {
    /// Submits at once.
    Noop,
    /// Writes the task's solution files through the editor (or applies a SWE-bench gold patch
    /// with bash), then submits.
    Oracle,
    /// Per task id, the tool calls to issue, one per turn, then submit.
    Replay(HashMap<String, Vec<Value>>),
    /// The given replies, in order, for every task (tests: malformed calls and such).
    Replies(Vec<String>),
}

/// `<tool_call>` text for one call, as Qwen2.5 writes it.
pub fn tool_call_text(name: &str, arguments: &Value) -> String {
    format!(
        "<tool_call>\n{}\n</tool_call>",
        json!({"name": name, "arguments": arguments})
    )
}

impl ScriptedPolicy {
    /// The reply for `turn` (1-based).
    fn reply(&self, task: &Task, turn: usize) -> Result<String> {
        let submit = tool_call_text("submit", &json!({}));
        match &self.script {
            Script::Noop => Ok(submit),
            Script::Replies(replies) => Ok(replies.get(turn - 1).cloned().unwrap_or(submit)),
            Script::Replay(calls) => {
                let calls = calls
                    .get(&task.id)
                    .ok_or_else(|| anyhow!("the replay file has no line for task {}", task.id))?;
                Ok(match calls.get(turn - 1) {
                    Some(call) => tool_call_text(
                        call["name"].as_str().unwrap_or_default(),
                        &call["arguments"],
                    ),
                    None => submit,
                })
            }
            Script::Oracle => {
                let edits = oracle_edits(task)?;
                Ok(edits.get(turn - 1).cloned().unwrap_or(submit))
            }
        }
    }
}

/// The oracle's tool calls: each solution file written over its original through
/// `str_replace_editor` (`create` for a new file), or the gold patch through bash.
fn oracle_edits(task: &Task) -> Result<Vec<String>> {
    if let Some(patch) = &task.gold_patch {
        let command = format!(
            "git apply --whitespace=nowarn - <<'SWERVE_PATCH_EOF'\n{patch}\nSWERVE_PATCH_EOF"
        );
        return Ok(vec![tool_call_text("bash", &json!({ "command": command }))]);
    }
    let Some(solution) = &task.solution else {
        bail!(
            "task {} ({}) has no solution (nor a gold patch): the oracle cannot solve it",
            task.id,
            task.origin
        );
    };
    let crate::env::RepoSource::Folder(repo) = &task.repo else {
        bail!("task {}: a solution folder needs a repo folder", task.id);
    };
    let mut files = Vec::new();
    collect_files(solution, solution, &mut files)?;
    files.sort();
    let mut calls = Vec::new();
    for rel in files {
        let fixed = std::fs::read_to_string(solution.join(&rel)).with_context(|| {
            format!("task {}: reading solution file {}", task.id, rel.display())
        })?;
        let path = rel.to_string_lossy().to_string();
        match std::fs::read_to_string(repo.join(&rel)) {
            Ok(original) if original == fixed => {}
            Ok(original) if !original.is_empty() => calls.push(tool_call_text(
                "str_replace_editor",
                &json!({"command": "str_replace", "path": path, "old_str": original, "new_str": fixed}),
            )),
            _ => calls.push(tool_call_text(
                "str_replace_editor",
                &json!({"command": "create", "path": path, "file_text": fixed}),
            )),
        }
    }
    Ok(calls)
}

fn collect_files(root: &Path, dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = entry?.path();
        if path.is_dir() {
            collect_files(root, &path, out)?;
        } else {
            out.push(path.strip_prefix(root)?.to_path_buf());
        }
    }
    Ok(())
}

impl Policy for ScriptedPolicy {
    fn name(&self) -> String {
        match &self.script {
            Script::Noop => "noop".into(),
            Script::Oracle => "oracle".into(),
            Script::Replay(_) => "replay".into(),
            Script::Replies(_) => "scripted".into(),
        }
    }

    fn generate(&self, input: &TurnInput<'_>) -> Result<TurnOutput> {
        let text = self.reply(input.task, input.turn)?;
        let mut tokens = self.tokenizer.encode(&text)?;
        let im_end = self
            .tokenizer
            .token_id(IM_END)
            .ok_or_else(|| anyhow!("the tokenizer has no {IM_END}"))?;
        let stopped = tokens.len() < input.max_tokens;
        if stopped {
            tokens.push(im_end);
        } else {
            tokens.truncate(input.max_tokens);
        }
        Ok(TurnOutput {
            tokens,
            logprobs: None,
            stopped,
            weight_version: None,
        })
    }
}

/// Reads a replay file: `{"task": ID, "tool_calls": [{"name", "arguments"}, ...]}` lines.
pub fn read_replay(path: &Path) -> Result<HashMap<String, Vec<Value>>> {
    let mut out = HashMap::new();
    for line in crate::jsonl::ObjectLines::open(path)? {
        let (line_no, value) = line?;
        let at = crate::jsonl::at(path, line_no);
        let task = value
            .get("task")
            .and_then(Value::as_str)
            .ok_or_else(|| anyhow!("{at}: task: expected a task id string"))?;
        let calls = value
            .get("tool_calls")
            .and_then(Value::as_array)
            .ok_or_else(|| anyhow!("{at}: tool_calls: expected a list"))?;
        for (i, call) in calls.iter().enumerate() {
            if call.get("name").and_then(Value::as_str).is_none() {
                bail!("{at}: tool_calls[{i}].name: expected a string");
            }
            if !call.get("arguments").is_some_and(Value::is_object) {
                bail!("{at}: tool_calls[{i}].arguments: expected an object");
            }
        }
        if out.insert(task.to_string(), calls.clone()).is_some() {
            bail!("{at}: task: {task:?} has an earlier line");
        }
    }
    Ok(out)
}

#[cfg(test)]
#[path = "policy_tests.rs"]
mod tests;
