//! One episode: the agent works on a fresh sandbox of its task until it submits, runs out of
//! turns, or fills its context; then the tests decide.
//!
//! ```text
//!  start sandbox (setup) ─► prompt ─► [ generate ─► parse <tool_call>s ─► run tools ─► observe ]*
//!      ─► submit | max_turns | context_full ─► grade (submitted only) ─► reward ─► close
//! ```
//!
//! What a reply is (actions, a format error, the end of the context) and how it is masked and
//! closed: [`super::turn`]. A format error is answered with a user message saying what was wrong.
//! Several calls in one reply run in order; `submit` ends the episode at once.

use super::editor::Editor;
use super::policy::{Policy, TurnInput};
use super::prompt;
use super::reward::{reward, SuspiciousReward};
use super::sandbox_pool::Prestarted;
use super::transcript::Transcript;
use super::turn::{reply_body, Reply};
use crate::chat::ChatTemplate;
use crate::env::diff::{filter_diff, raw_diff, snapshot, AgentDiff};
use crate::env::grading::{grade_fresh, GradeResult};
use crate::env::task::Verdict;
use crate::env::{describe_end, grade_in_place, Environment, Grading, Sandbox, Task};
use crate::tokenizer::Tokenizer;
use crate::toolcall::ToolCall;
use anyhow::Result;
use serde_json::{json, Value};
use std::time::Instant;

#[derive(Clone, Debug)]
pub struct EpisodeConfig {
    pub max_turns: usize,
    /// L_thr of the turn penalty (RL-SPEC.md).
    pub turn_threshold: usize,
    /// Context limit in tokens (prompt, actions and observations).
    pub max_context: usize,
    /// Most tokens one reply may have.
    pub max_turn_tokens: usize,
    /// Most bytes of one tool result shown to the agent (the middle is cut with a marker).
    pub observation_bytes: usize,
    /// Attempts after an infrastructure failure (sandbox start, daemon, grader crash, a policy
    /// request that fails) before the episode is given up as an error.
    pub infra_retries: usize,
    /// What a flagged change (`AgentDiff::suspicious`) costs (`--suspicious-reward`).
    pub suspicious_reward: SuspiciousReward,
}

impl Default for EpisodeConfig {
    fn default() -> Self {
        Self {
            max_turns: 40,
            turn_threshold: 10,
            max_context: 65536,
            max_turn_tokens: 4096,
            observation_bytes: 16 * 1024,
            infra_retries: 2,
            suspicious_reward: SuspiciousReward::Keep,
        }
    }
}

/// Why an episode ended.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum Finish {
    Submitted,
    MaxTurns,
    ContextFull,
    /// The infrastructure failed (sandbox, daemon, grader, policy server), not the agent, on
    /// every attempt: the message says how. Never trained on.
    Error(String),
}

impl Finish {
    pub fn as_str(&self) -> &'static str {
        match self {
            Finish::Submitted => "submitted",
            Finish::MaxTurns => "max_turns",
            Finish::ContextFull => "context_full",
            Finish::Error(_) => "error",
        }
    }
}

/// An episode's outcome with both forms of its trajectory (serialisable: the processes of a
/// multi-node RL loop exchange their episodes).
#[derive(serde::Serialize, serde::Deserialize)]
pub struct Episode {
    pub task_id: String,
    pub sample: usize,
    pub seed: u64,
    pub transcript: Option<Transcript>,
    pub turns: usize,
    pub format_errors: usize,
    /// Tokens the policy generated (format-error turns included).
    pub generated: usize,
    pub finish: Finish,
    pub resolved: bool,
    pub reward: f64,
    pub generation_s: f64,
    pub environment_s: f64,
    pub grading_s: f64,
    /// Weight versions seen across the turns (first, last), where the policy reports them.
    pub weight_versions: Option<(u64, u64)>,
    /// The agent's change as grading applied it (tasks with a repository).
    pub patch: Option<AgentDiff>,
    /// Grading's findings: per-test verdict, why the tests did not run, the log's tail.
    pub grading: Option<GradingRecord>,
    /// Attempts lost to infrastructure failures before this one.
    pub infra_retries: usize,
    /// Seconds its sandboxes took to start (setup included), wherever they started: the
    /// episode's own thread, or a warm-pool filler while other episodes ran.
    #[serde(default)]
    pub sandbox_start_s: f64,
    /// Seconds the episode waited for its sandboxes: the whole start when it started one
    /// itself, what was left of it when a warm one was still starting, 0 when one was ready.
    /// `sandbox_start_s - sandbox_wait_s` is the start-up the warm pool hid.
    #[serde(default)]
    pub sandbox_wait_s: f64,
}

/// What grading found, as a trajectory keeps it.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct GradingRecord {
    pub verdict: Option<Verdict>,
    /// Why the tests did not run (the agent's change does not apply, or cannot be read).
    pub failure: Option<String>,
    /// The end of the test log.
    pub log_tail: String,
    /// A cleanup that failed after the verdict.
    pub cleanup_error: Option<String>,
}

/// Bytes of the test log a trajectory keeps.
const LOG_TAIL_BYTES: usize = 8 * 1024;

impl Episode {
    /// Grading found the test framework tampered with (grading/verdict.rs): reward 0.
    pub fn tampered(&self) -> bool {
        self.grading
            .as_ref()
            .and_then(|g| g.verdict.as_ref())
            .is_some_and(|v| !v.tampered.is_empty())
    }

    /// Action tokens (mask 1) of the trajectory.
    pub fn action_tokens(&self) -> usize {
        self.transcript
            .as_ref()
            .map_or(0, |t| t.action_mask.iter().filter(|&&m| m == 1).count())
    }

    /// The trajectory line (RL-SPEC.md's format plus the episode's facts and chat form).
    pub fn to_json(&self) -> Value {
        let mut line = json!({
            "group": self.task_id,
            "task": self.task_id,
            "sample": self.sample,
            "seed": self.seed,
            "reward": self.reward,
            "resolved": self.resolved,
            "turns": self.turns,
            "format_errors": self.format_errors,
            "finish": self.finish.as_str(),
        });
        if let Finish::Error(message) = &self.finish {
            line["error"] = Value::String(message.clone());
        }
        if let Some((first, last)) = self.weight_versions {
            line["weight_version"] = json!([first, last]);
        }
        if self.infra_retries > 0 {
            line["infra_retries"] = json!(self.infra_retries);
        }
        if let Some(diff) = &self.patch {
            line["patch"] = json!(diff.patch);
            if !diff.dropped.is_empty() {
                line["patch_dropped"] = json!(diff.dropped);
            }
            line["suspicious"] = json!(!diff.suspicious.is_empty());
            if !diff.suspicious.is_empty() {
                line["suspicious_reasons"] = json!(diff.suspicious);
            }
        }
        if let Some(grading) = &self.grading {
            line["grading"] = json!(grading);
            if self.tampered() {
                line["tampered"] = json!(true);
            }
        }
        if let Some(t) = &self.transcript {
            line["tokens"] = json!(t.tokens);
            line["action_mask"] = json!(t.action_mask);
            if t.sampled {
                line["logprobs"] = json!(t.logprobs);
            }
            line["messages"] = json!(t.messages);
            line["tools"] = json!(t.tools);
        }
        line
    }
}

/// What every episode shares.
pub struct EpisodeContext<'a> {
    pub env: &'a dyn Environment,
    pub policy: &'a dyn Policy,
    pub tokenizer: &'a Tokenizer,
    pub template: &'a ChatTemplate,
    pub config: &'a EpisodeConfig,
}

/// When episodes must stop (the RL loop's `--rollout-deadline`); `Deadline(None)`: never.
#[derive(Clone, Copy, Debug, Default)]
pub struct Deadline(pub Option<Instant>);

impl Deadline {
    pub fn passed(&self) -> bool {
        self.0.is_some_and(|at| Instant::now() >= at)
    }
}

/// Runs one episode to its end. An infrastructure failure (an `Err` from the sandbox, the
/// grader or the policy) starts the episode again, up to `infra_retries` times; past that it
/// ends with [`Finish::Error`] (reward 0, never trained on), keeping the tokens it had.
pub fn run_episode(ctx: &EpisodeContext<'_>, task: &Task, sample: usize, seed: u64) -> Episode {
    run_episode_until(ctx, task, sample, seed, Deadline(None), None).expect("no deadline")
}

/// The name of an episode's sandbox (its container, folder or pod): unique in the run, per
/// attempt, and known before the episode starts (a warm pool starts it ahead).
pub fn sandbox_name(task: &Task, sample: usize, seed: u64, attempt: usize) -> String {
    format!(
        "{}-{}-{:08x}",
        task.id,
        sample,
        (seed as u32 ^ std::process::id()).wrapping_add(attempt as u32)
    )
}

/// [`run_episode`], stopped once `deadline` passes: before its next turn (its sandbox closed),
/// or at once when its generation is aborted ([`super::policy::Policy::abort_in_flight`]: the
/// error that follows is not retried). `None`: stopped, nothing to keep. A tool command that is
/// running finishes first (its sandbox's timeout bounds it), and so does grading.
///
/// `prestarted`: the first attempt's sandbox, started ahead by a warm pool (named by
/// [`sandbox_name`]); its start failing is that attempt's infrastructure failure.
pub fn run_episode_until(
    ctx: &EpisodeContext<'_>,
    task: &Task,
    sample: usize,
    seed: u64,
    deadline: Deadline,
    mut prestarted: Option<Prestarted>,
) -> Option<Episode> {
    let mut attempt = 0;
    let (mut sandbox_start_s, mut sandbox_wait_s) = (0.0, 0.0);
    loop {
        let mut episode = Episode {
            task_id: task.id.clone(),
            sample,
            seed,
            transcript: None,
            turns: 0,
            format_errors: 0,
            generated: 0,
            finish: Finish::Error(String::new()),
            resolved: false,
            reward: 0.0,
            generation_s: 0.0,
            environment_s: 0.0,
            grading_s: 0.0,
            weight_versions: None,
            patch: None,
            grading: None,
            infra_retries: attempt,
            sandbox_start_s,
            sandbox_wait_s,
        };
        let mut transcript = None;
        let first = prestarted.take();
        let result = drive(ctx, task, &mut episode, &mut transcript, deadline, first);
        episode.transcript = transcript;
        (sandbox_start_s, sandbox_wait_s) = (episode.sandbox_start_s, episode.sandbox_wait_s);
        let Err(e) = result else {
            return Some(episode);
        };
        if deadline.passed() {
            return None;
        }
        if attempt < ctx.config.infra_retries {
            attempt += 1;
            eprintln!(
                "\nepisode {} #{sample}: infrastructure failure, attempt {attempt} of {}: {e:#}",
                task.id,
                ctx.config.infra_retries + 1
            );
            continue;
        }
        episode.finish = Finish::Error(format!("{e:#}"));
        episode.resolved = false;
        episode.reward = 0.0;
        return Some(episode);
    }
}

fn drive(
    ctx: &EpisodeContext<'_>,
    task: &Task,
    episode: &mut Episode,
    transcript_slot: &mut Option<Transcript>,
    deadline: Deadline,
    prestarted: Option<Prestarted>,
) -> Result<()> {
    let config = ctx.config;
    let name = sandbox_name(task, episode.sample, episode.seed, episode.infra_retries);
    let started = Instant::now();
    let mut sandbox = match prestarted {
        Some(warm) => {
            episode.sandbox_start_s += warm.start_s;
            episode.sandbox_wait_s += warm.wait_s;
            warm.sandbox?
        }
        None => {
            let sandbox = ctx.env.start(task, &name);
            let start_s = started.elapsed().as_secs_f64();
            episode.sandbox_start_s += start_s;
            episode.sandbox_wait_s += start_s;
            sandbox?
        }
    };
    let baseline = match &task.grading {
        Grading::Tests(_) => Some(snapshot(sandbox.as_mut())?),
        Grading::Command { .. } => None,
    };
    episode.environment_s += started.elapsed().as_secs_f64();
    let workdir = sandbox.workdir().to_string();
    let transcript = transcript_slot.insert(Transcript::start(
        ctx.template,
        ctx.tokenizer,
        &prompt::system_prompt(&workdir),
        &prompt::task_prompt(&task.problem_statement, &workdir),
        prompt::tools(),
    )?);
    if transcript.len() >= config.max_context {
        anyhow::bail!(
            "task {}: the prompt alone is {} tokens, over --max-context {}",
            task.id,
            transcript.len(),
            config.max_context
        );
    }
    let mut editor = Editor::default();
    let mut finish = Finish::MaxTurns;
    for turn in 1..=config.max_turns {
        if deadline.passed() {
            // Closed here, not graded: the caller drops the episode.
            let _ = sandbox.close();
            anyhow::bail!("stopped at the rollout deadline before turn {turn}");
        }
        let mut turn_state = TurnState {
            sandbox: sandbox.as_mut(),
            editor: &mut editor,
            transcript,
            episode,
        };
        if let Some(end) = play_turn(ctx, task, turn, &mut turn_state)? {
            finish = end;
            break;
        }
    }
    let graded = finish_episode(
        ctx,
        task,
        sandbox,
        baseline,
        &name,
        finish == Finish::Submitted,
        episode,
    )?;
    episode.resolved = graded.is_some_and(|g| g.resolved);
    let flagged = episode
        .patch
        .as_ref()
        .is_some_and(|d| !d.suspicious.is_empty());
    episode.reward = config.suspicious_reward.apply(
        reward(
            episode.resolved,
            episode.turns,
            config.turn_threshold,
            config.max_turns,
        ),
        episode.resolved,
        flagged,
    );
    episode.finish = finish;
    Ok(())
}

/// After the last turn: the agent's diff is read, its sandbox closed (every process it started
/// gone), and a submitted episode graded: in a fresh sandbox for tasks with tests, in place for
/// a command (the toy).
fn finish_episode(
    ctx: &EpisodeContext<'_>,
    task: &Task,
    mut sandbox: Box<dyn Sandbox>,
    baseline: Option<String>,
    name: &str,
    submitted: bool,
    episode: &mut Episode,
) -> Result<Option<GradeResult>> {
    let t = Instant::now();
    let (Grading::Tests(plan), Some(tree)) = (&task.grading, baseline) else {
        let graded = if submitted {
            Some(grade_in_place(sandbox.as_mut(), task)?)
        } else {
            None
        };
        if let Err(e) = sandbox.close() {
            eprintln!("\nepisode {name}: closing the sandbox failed (the episode is kept): {e:#}");
        }
        episode.grading_s += t.elapsed().as_secs_f64();
        return Ok(graded);
    };
    let owned = plan.owned_paths()?;
    let diff = raw_diff(sandbox.as_mut(), &tree)?.map(|raw| filter_diff(&raw, &owned));
    if let Err(e) = sandbox.close() {
        eprintln!("\nepisode {name}: closing the sandbox failed (the episode is kept): {e:#}");
    }
    episode.environment_s += t.elapsed().as_secs_f64();
    let t = Instant::now();
    let graded = match diff {
        Err(why) => {
            episode.grading = Some(GradingRecord {
                failure: Some(why),
                ..GradingRecord::default()
            });
            None
        }
        Ok(mut diff) => {
            let graded = if submitted {
                let g = grade_fresh(ctx.env, task, plan, &diff.patch, name)?;
                // What grading put back, read from the grading sandbox itself, and what the
                // syntax tree of the added lines shows.
                for (path, why) in &g.dropped {
                    if !diff.dropped.iter().any(|(p, _)| p == path) {
                        diff.dropped.push((path.clone(), why.clone()));
                    }
                }
                diff.suspicious.extend(g.flags.iter().map(|f| f.describe()));
                episode.grading = Some(GradingRecord {
                    verdict: g.verdict.clone(),
                    failure: g.failure.clone(),
                    log_tail: tail(&g.output.output, LOG_TAIL_BYTES),
                    cleanup_error: g.cleanup_error.clone(),
                });
                Some(g)
            } else {
                None
            };
            episode.patch = Some(diff);
            graded
        }
    };
    episode.grading_s += t.elapsed().as_secs_f64();
    Ok(graded)
}

/// The last `max_bytes` of `text` (on a character boundary).
fn tail(text: &str, max_bytes: usize) -> String {
    let mut start = text.len().saturating_sub(max_bytes);
    while !text.is_char_boundary(start) {
        start += 1;
    }
    text[start..].to_string()
}

/// What one turn reads and updates.
struct TurnState<'t> {
    sandbox: &'t mut dyn Sandbox,
    editor: &'t mut Editor,
    transcript: &'t mut Transcript,
    episode: &'t mut Episode,
}

/// One turn: the policy's reply, its tool calls, their observation. `Some(finish)` ends the
/// episode.
fn play_turn(
    ctx: &EpisodeContext<'_>,
    task: &Task,
    turn: usize,
    state: &mut TurnState<'_>,
) -> Result<Option<Finish>> {
    let config = ctx.config;
    let (transcript, episode) = (&mut *state.transcript, &mut *state.episode);
    let room = config.max_context.saturating_sub(transcript.len());
    if room == 0 {
        return Ok(Some(Finish::ContextFull));
    }
    let t = Instant::now();
    let out = ctx.policy.generate(&TurnInput {
        task,
        tokens: &transcript.tokens,
        turn,
        max_tokens: room.min(config.max_turn_tokens),
        seed: episode.seed.wrapping_add(turn as u64),
    })?;
    episode.generation_s += t.elapsed().as_secs_f64();
    episode.generated += out.tokens.len();
    if let Some(v) = out.weight_version {
        let (first, _) = episode.weight_versions.unwrap_or((v, v));
        episode.weight_versions = Some((first, v));
    }
    episode.turns = turn;
    if out.tokens.is_empty() {
        anyhow::bail!("the policy returned no token for turn {turn}");
    }
    let text = ctx.tokenizer.decode(reply_body(&out), false)?;
    let reply = Reply::judge(&out, &text, transcript.len(), config.max_context);
    let (trained, closed) = (reply.trained(), reply.closed());
    transcript.push_assistant(&out.tokens, out.logprobs.as_deref(), &text, trained, closed);
    let observation = match reply {
        Reply::ContextFull => return Ok(Some(Finish::ContextFull)),
        Reply::Actions(calls) => {
            let (observation, submitted) = run_tool_calls(ctx, &calls, state)?;
            if submitted {
                return Ok(Some(Finish::Submitted));
            }
            observation
        }
        Reply::FormatError(message) => {
            episode.format_errors += 1;
            vec![json!({"role": "user", "content": format!("Format error: {message}")})]
        }
    };
    // After the last turn nothing reads an observation: the trajectory ends at the reply.
    if turn == config.max_turns {
        return Ok(Some(Finish::MaxTurns));
    }
    if !append_observation(ctx, state.transcript, observation)? {
        return Ok(Some(Finish::ContextFull));
    }
    Ok(None)
}

/// Runs a reply's tool calls in order, up to a `submit` (or an environment that ends the
/// episode); returns the observation and whether the episode was submitted.
fn run_tool_calls(
    ctx: &EpisodeContext<'_>,
    calls: &[ToolCall],
    state: &mut TurnState<'_>,
) -> Result<(Vec<Value>, bool)> {
    let timeout = ctx.env.limits().command_timeout;
    let mut observation = Vec::new();
    let mut submitted = false;
    for call in calls {
        let t = Instant::now();
        let result = match call.name.as_str() {
            "submit" => {
                submitted = true;
                break;
            }
            "bash" => {
                let command = call.arguments["command"].as_str().unwrap_or_default();
                let out = state.sandbox.run(command, None, timeout)?;
                // The environment may end the episode (a game won), as a submit would.
                submitted |= out.ends_episode;
                bash_observation(&out)
            }
            _ => state
                .editor
                .call(&mut *state.sandbox, &call.arguments, timeout)?,
        };
        state.episode.environment_s += t.elapsed().as_secs_f64();
        observation.push(json!({
            "role": "tool",
            "content": truncate_middle(&result, ctx.config.observation_bytes),
        }));
        if submitted {
            break;
        }
    }
    Ok((observation, submitted))
}

/// Appends an observation unless it would overflow the context (then false: the episode ends).
fn append_observation(
    ctx: &EpisodeContext<'_>,
    transcript: &mut Transcript,
    observation: Vec<Value>,
) -> Result<bool> {
    let ids = transcript.observation_tokens(ctx.template, ctx.tokenizer, &observation)?;
    // The next reply needs at least one token of room.
    if transcript.len() + ids.len() >= ctx.config.max_context {
        return Ok(false);
    }
    transcript.push_observation(observation, ids);
    Ok(true)
}

/// A bash result as the agent sees it.
fn bash_observation(out: &crate::env::CommandOutput) -> String {
    let mut text = out.output.clone();
    if out.success() {
        if text.trim().is_empty() {
            text = "[no output]".into();
        }
        return text;
    }
    if !text.is_empty() && !text.ends_with('\n') {
        text.push('\n');
    }
    let end = if out.timed_out {
        format!(
            "[the command timed out after {:.0} s and was killed with everything it started]",
            out.elapsed.as_secs_f64()
        )
    } else if out.output_overflow {
        "[the command printed too much output and was killed]".into()
    } else {
        format!("[{}]", describe_end(out))
    };
    text.push_str(&end);
    text
}

/// `text` cut in the middle to at most about `max_bytes`, with a marker.
pub fn truncate_middle(text: &str, max_bytes: usize) -> String {
    if text.len() <= max_bytes {
        return text.to_string();
    }
    let mut head = max_bytes / 2;
    while !text.is_char_boundary(head) {
        head -= 1;
    }
    let mut tail = text.len() - (max_bytes - max_bytes / 2);
    while !text.is_char_boundary(tail) {
        tail += 1;
    }
    format!(
        "{}\n[... {} bytes omitted ...]\n{}",
        &text[..head],
        tail - head,
        &text[tail..]
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncation_keeps_both_ends_on_char_boundaries() {
        let text = "é".repeat(100);
        let cut = truncate_middle(&text, 51);
        assert!(cut.starts_with("éé") && cut.ends_with("éé") && cut.contains("omitted"));
        assert_eq!(truncate_middle("short", 10), "short");
    }
}
