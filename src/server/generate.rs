//! Running a [`Job`] on the engine: admission, one engine request per choice, and each choice's
//! state as its tokens arrive (text, stop strings, logprobs, finish).
//!
//! ```text
//!  Job ──admit (429 past capacity)──► submit_with × choices ──► engine thread
//!                                                                  │ sink: (choice, event)
//!  Run { ChoiceState per choice } ◄── one async channel ◄──────────┘
//!    │ stop string matched: abort that choice's request, keep the text before it
//!    └─► response JSON, or SSE chunks (stream.rs)
//! ```
//!
//! The [`Inflight`] guard aborts every unfinished request when it is dropped: a client that goes
//! away (its handler future or its response stream dropped) frees its blocks at once.

use super::detok::{find_stop_span, held_back, TextBuilder};
use super::error::{from_engine_refusal, ApiError};
use super::openai::Job;
use super::state::{AppState, Permit};
use crate::engine::{
    EngineAsleep, FinalRecord, FinishReason, PromptLogprobs, RequestEvent, TokenEvent,
};
use crate::kvcache::RequestId;
use crate::toolcall::OPEN as TOOL_CALL_OPEN;
use std::sync::Arc;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};
use tokio::sync::oneshot;

/// Every request of a job that the engine accepted; aborts the unfinished ones on drop.
pub struct Inflight {
    state: Arc<AppState>,
    ids: Vec<Option<RequestId>>,
    done: Vec<bool>,
    /// The caller's request id, forgotten when the job ends.
    name: Option<String>,
    _permit: Permit,
}

impl Inflight {
    fn abort(&mut self, choice: usize) {
        if let Some(id) = self.ids[choice] {
            if !self.done[choice] {
                let _ = self.state.engine.abort(id);
            }
        }
    }

    fn finished(&mut self, choice: usize) {
        self.done[choice] = true;
        if let Some(id) = self.ids[choice] {
            if let Ok(mut live) = self.state.live.lock() {
                live.remove(&id);
            }
        }
    }
}

impl Drop for Inflight {
    fn drop(&mut self) {
        let mut aborted = 0;
        for choice in 0..self.ids.len() {
            if !self.done[choice] {
                self.abort(choice);
                self.finished(choice);
                aborted += 1;
            }
        }
        if aborted > 0 {
            self.state.metrics.client_aborts(aborted);
        }
        if let Some(name) = &self.name {
            self.state.forget_name(name);
        }
    }
}

/// Events of all choices: (choice index, event).
pub type Events = UnboundedReceiver<(usize, RequestEvent)>;

/// Admits and submits every choice of `job`; returns once the engine has accepted them all.
pub async fn start(state: &Arc<AppState>, job: &Job) -> Result<(Inflight, Events), ApiError> {
    if state.stopping.load(std::sync::atomic::Ordering::SeqCst) {
        return Err(ApiError::unavailable("the server is shutting down"));
    }
    if let Some(level) = state.sleep_level() {
        return Err(ApiError::asleep(level));
    }
    let choices = job.num_choices();
    if choices > state.admission.capacity {
        return Err(ApiError::field(
            "n",
            format!(
                "{choices} sequences (prompts x n) can never be admitted: the server admits at most {} at once (--max-num-seqs + --max-queue-len)",
                state.admission.capacity
            ),
        ));
    }
    let permit = state.admission.try_admit(choices).ok_or_else(|| {
        state.metrics.rejected_overload();
        ApiError::overloaded(
            format!(
                "the server is at capacity: {} sequences in flight, at most {} (asked for {choices}); retry later",
                state.admission.in_flight(),
                state.admission.capacity
            ),
            1,
        )
    })?;
    let mut inflight = Inflight {
        state: state.clone(),
        ids: vec![None; choices],
        done: vec![false; choices],
        name: job.ext.request_id.clone(),
        _permit: permit,
    };
    let (tx, rx) = unbounded_channel();
    let mut replies = Vec::with_capacity(choices);
    for (choice, (request, options)) in job.requests().into_iter().enumerate() {
        let tx = tx.clone();
        let (reply_tx, reply_rx) = oneshot::channel();
        state
            .engine
            .submit_with_options(
                request,
                options,
                Box::new(move |event| tx.send((choice, event)).is_ok()),
                Box::new(move |result| {
                    let _ = reply_tx.send(result);
                }),
            )
            .map_err(|_| ApiError::unavailable("the engine has stopped"))?;
        replies.push(reply_rx);
    }
    drop(tx);
    let mut refusal = None;
    for (choice, reply) in replies.into_iter().enumerate() {
        match reply.await {
            Ok(Ok(id)) => {
                inflight.ids[choice] = Some(id);
                if let Ok(mut live) = state.live.lock() {
                    live.insert(id);
                }
                if let Some(rid) = &job.ext.request_id {
                    state.name_request(rid, id);
                }
            }
            Ok(Err(e)) => {
                inflight.done[choice] = true;
                // Asleep: the engine took a /sleep after the check above (the server's flag is
                // set once the engine has answered the sleep): 503 as for the flag.
                refusal.get_or_insert_with(|| match e.downcast_ref::<EngineAsleep>() {
                    Some(asleep) => ApiError::asleep(asleep.level),
                    None => from_engine_refusal(&e),
                });
            }
            Err(_) => {
                inflight.done[choice] = true;
                refusal.get_or_insert_with(|| ApiError::unavailable("the engine has stopped"));
            }
        }
    }
    match refusal {
        Some(error) => Err(error),
        None => Ok((inflight, rx)),
    }
}

/// How a choice ended.
#[derive(Clone, Debug)]
pub struct Finish {
    /// stop, length, abort, error (tool_calls is decided when rendering; an abort or an error
    /// is answered as an OpenAI error, `super::response`).
    pub reason: &'static str,
    pub error: Option<String>,
    pub cached_tokens: usize,
    pub weight_version: u64,
}

/// One choice as it is generated.
#[derive(Debug)]
pub struct ChoiceState {
    pub prompt_index: usize,
    pub tokens: Vec<u32>,
    pub logprobs: Vec<f32>,
    pub top_logprobs: Vec<Vec<(u32, f32)>>,
    /// The weight versions of the first and last tokens, and the index of the first token
    /// sampled under weights other than the first token's.
    pub versions: Option<WeightVersions>,
    text: TextBuilder,
    /// A stop string matched: the text ends at its start and later tokens are ignored.
    stopped_by_string: bool,
    /// The stop string that matched.
    pub matched_stop: Option<String>,
    pub finish: Option<Finish>,
    /// Streaming: how much text and how many tokens have been sent.
    pub sent_text: usize,
    pub sent_tokens: usize,
    /// Streaming: the first chunk (role, echo, prompt ids) and the finish have been sent.
    pub sent_start: bool,
    pub sent_finish: bool,
}

/// Which weights a choice's tokens were sampled under.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WeightVersions {
    pub first: u64,
    pub last: u64,
    /// The index (in the choice's token ids) of the first token sampled under weights other
    /// than the first token's; `None` while they are all the first token's.
    pub change_index: Option<usize>,
}

impl WeightVersions {
    fn record(versions: &mut Option<Self>, index: usize, version: u64) {
        match versions {
            None => {
                *versions = Some(Self {
                    first: version,
                    last: version,
                    change_index: None,
                })
            }
            Some(v) => {
                if version != v.first && v.change_index.is_none() {
                    v.change_index = Some(index);
                }
                v.last = version;
            }
        }
    }
}

impl ChoiceState {
    pub fn text(&self) -> &str {
        &self.text.text
    }

    /// Text that may be streamed now: all of it once finished; before that, not a possible
    /// start of a stop string, and nothing from a `<tool_call>` on when tool calls are parsed.
    pub fn streamable_len(&self, job: &Job) -> usize {
        let text = self.text();
        if self.finish.is_some() {
            return text.len();
        }
        let mut end = text.len() - held_back(text, &job.stop_strings);
        if job.parse_tool_calls {
            if let Some(at) = text.find(TOOL_CALL_OPEN) {
                end = end.min(at);
            }
        }
        end
    }
}

/// All choices of a job and the guard over their engine requests.
pub struct Run {
    pub state: Arc<AppState>,
    pub job: Job,
    pub choices: Vec<ChoiceState>,
    pub prompt_logprobs: Vec<Option<PromptLogprobs>>,
    inflight: Inflight,
}

impl Run {
    pub fn new(state: Arc<AppState>, job: Job, inflight: Inflight) -> Self {
        let prompt_logprobs = vec![None; job.prompts.len()];
        let choices = (0..job.num_choices())
            .map(|c| ChoiceState {
                prompt_index: c / job.n,
                tokens: Vec::new(),
                logprobs: Vec::new(),
                top_logprobs: Vec::new(),
                versions: None,
                text: TextBuilder::default(),
                stopped_by_string: false,
                matched_stop: None,
                finish: None,
                sent_text: 0,
                sent_tokens: 0,
                sent_start: false,
                sent_finish: false,
            })
            .collect();
        Self {
            state,
            job,
            choices,
            prompt_logprobs,
            inflight,
        }
    }

    /// Whether choice `index` waits for its prompt's logprobs before its first stream chunk
    /// (they come from the prompt's first choice, which computes them during its prefill; if
    /// that choice ended without them, nothing is waited for).
    pub fn awaits_prompt_logprobs(&self, index: usize) -> bool {
        let p = self.choices[index].prompt_index;
        self.job.wants_prompt_logprobs()
            && self.prompt_logprobs[p].is_none()
            && self.choices[p * self.job.n].finish.is_none()
    }

    pub fn all_finished(&self) -> bool {
        self.choices.iter().all(|c| c.finish.is_some())
    }

    pub fn handle(&mut self, choice: usize, event: RequestEvent) {
        if choice >= self.choices.len() || self.choices[choice].finish.is_some() {
            return;
        }
        match event {
            RequestEvent::PromptLogprobs(logprobs) => {
                let p = self.choices[choice].prompt_index;
                self.prompt_logprobs[p] = Some(logprobs);
            }
            RequestEvent::Token(token) => self.on_token(choice, token),
            RequestEvent::Finished(record) => self.on_finished(choice, record),
        }
    }

    fn on_token(&mut self, choice: usize, token: TokenEvent) {
        let job = &self.job;
        let c = &mut self.choices[choice];
        if c.stopped_by_string {
            return;
        }
        WeightVersions::record(&mut c.versions, c.tokens.len(), token.weight_version);
        c.tokens.push(token.token);
        c.logprobs.push(token.logprob);
        if job.logprobs.is_some_and(|n| n > 0) {
            c.top_logprobs.push(token.top_logprobs);
        }
        let before = c.text.text.len();
        // A stop token ends the output; its text is not part of it unless
        // `include_stop_str_in_output` (vLLM), and never before `min_tokens`, which masks it.
        let stop_token = job.stop_ids.contains(&token.token)
            && c.tokens.len() > job.ext.options.min_tokens
            && !job.ext.include_stop_str;
        if !stop_token {
            c.text
                .push(self.state.table.bytes(token.token, job.skip_special_tokens));
        }
        // vLLM checks stop strings only once `min_tokens` are generated.
        if job.stop_strings.is_empty() || c.tokens.len() <= job.ext.options.min_tokens {
            return;
        }
        if let Some((start, end)) = find_stop_span(&c.text.text, before, &job.stop_strings) {
            c.matched_stop = Some(c.text.text[start..end].to_string());
            c.text
                .text
                .truncate(if job.ext.include_stop_str { end } else { start });
            c.stopped_by_string = true;
            self.inflight.abort(choice);
        }
    }

    fn on_finished(&mut self, choice: usize, record: FinalRecord) {
        let c = &mut self.choices[choice];
        let (reason, error) = if c.stopped_by_string {
            ("stop", None)
        } else {
            c.text.finish();
            match &record.finish_reason {
                FinishReason::Stop(_) => ("stop", None),
                FinishReason::Length => ("length", None),
                FinishReason::Abort => ("abort", None),
                FinishReason::Error(e) => ("error", Some(e.clone())),
            }
        };
        c.finish = Some(Finish {
            reason,
            error,
            cached_tokens: record.usage.cached_tokens,
            weight_version: record.weight_version,
        });
        let prompt_tokens = self.job.prompts[c.prompt_index].len();
        self.state
            .metrics
            .finished(prompt_tokens, c.tokens.len(), record.usage.cached_tokens);
        self.inflight.finished(choice);
    }

    /// The engine dropped a choice without finishing it (it stopped): end it with an error.
    pub fn close(&mut self) {
        for (choice, c) in self.choices.iter_mut().enumerate() {
            if c.finish.is_none() {
                c.text.finish();
                c.finish = Some(Finish {
                    reason: "error",
                    error: Some("the engine stopped before this choice finished".into()),
                    cached_tokens: 0,
                    weight_version: self.state.weight_version(),
                });
                self.inflight.finished(choice);
            }
        }
    }

    /// The first error a choice ended with, if any.
    pub fn error(&self) -> Option<&str> {
        self.choices
            .iter()
            .find_map(|c| c.finish.as_ref()?.error.as_deref())
    }

    /// Usage over all choices: each prompt counted once (with its first choice's cached tokens).
    pub fn usage(&self) -> Usage {
        let mut usage = Usage::default();
        for (p, prompt) in self.job.prompts.iter().enumerate() {
            usage.prompt_tokens += prompt.len();
            usage.cached_tokens += self.choices[p * self.job.n]
                .finish
                .as_ref()
                .map_or(0, |f| f.cached_tokens);
        }
        usage.completion_tokens = self.choices.iter().map(|c| c.tokens.len()).sum();
        usage
    }

    /// The weight version the last choice finished with.
    pub fn weight_version(&self) -> u64 {
        self.choices
            .iter()
            .filter_map(|c| c.finish.as_ref().map(|f| f.weight_version))
            .max()
            .unwrap_or_else(|| self.state.weight_version())
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub cached_tokens: usize,
}

/// Runs a job to the end (non-streaming).
pub async fn collect(run: &mut Run, events: &mut Events) {
    while !run.all_finished() {
        match events.recv().await {
            Some((choice, event)) => run.handle(choice, event),
            None => run.close(),
        }
    }
}
