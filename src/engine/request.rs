//! One generation request as the engine tracks it.
//!
//! ```text
//!   tokens: prompt ─────────────────┬ generated ──────────┐
//!           0              prompt_len                 num_tokens()
//!           ├── num_computed_tokens ──►│ (K/V in the cache; the rest is computed next)
//! ```
//!
//! The scheduler's one rule: every running request's `num_computed_tokens` catches up to
//! `num_tokens()`. When it does, the last row's logits give the next token, which makes
//! `num_tokens()` one larger again (decode). A preempted request drops to zero computed tokens
//! and later recomputes all of them, prompt and generated alike.

use crate::engine::prompt_logprobs::PromptLogprobsState;
use crate::engine::sampler::{SampleRng, SamplingParams, MAX_TOP_LOGPROBS};
use crate::kvcache::RequestId;

/// Why a request ended (OpenAI's `finish_reason` words where they exist).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// A stop token was generated (it is the last token of the output).
    Stop(u32),
    /// `max_tokens` generated, or the model's context is full.
    Length,
    /// Aborted by the caller (or its client went away).
    Abort,
    /// The engine could not run it (the message says why).
    Error(String),
}

impl FinishReason {
    pub fn as_str(&self) -> &'static str {
        match self {
            FinishReason::Stop(_) => "stop",
            FinishReason::Length => "length",
            FinishReason::Abort => "abort",
            FinishReason::Error(_) => "error",
        }
    }
}

/// What a caller submits beyond [`GenerationRequest`] (all off by default):
/// [`crate::engine::Engine::add_request_with`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RequestOptions {
    /// vLLM's `min_tokens`: until this many tokens are generated, the stop ids are masked out
    /// of the distribution sampled from (set to `-inf`, the rest renormalised), so the request
    /// cannot stop; the reported logprobs are those of that masked distribution.
    pub min_tokens: usize,
    /// Scheduling priority, vLLM's convention: lower runs first; equal priorities run in
    /// arrival order (all 0: first come, first served).
    pub priority: i64,
    /// Isolates prefix-cache entries: blocks are only shared between requests with the same
    /// salt (vLLM's `cache_salt`, hashed to 64 bits by the caller).
    pub cache_salt: Option<u64>,
}

/// What a caller submits.
#[derive(Clone, Debug)]
pub struct GenerationRequest {
    pub prompt: Vec<u32>,
    pub params: SamplingParams,
    /// Tokens to generate at most (the context limit may end it earlier).
    pub max_tokens: usize,
    /// Generating any of these ends the request (the token is kept in the output).
    pub stop_ids: Vec<u32>,
    /// `Some(top_n)`: also the logprobs of the prompt's own tokens, with `top_n` alternatives
    /// each (at most `MAX_TOP_LOGPROBS`), computed during the prefill and delivered before the
    /// first token (see [`crate::engine::prompt_logprobs`]).
    pub prompt_logprobs: Option<usize>,
}

#[derive(Clone, Debug)]
pub struct Request {
    pub id: RequestId,
    /// Submission order: FIFO admission; the youngest is preempted first.
    pub arrival: u64,
    pub prompt_len: usize,
    /// Prompt then generated tokens.
    pub tokens: Vec<u32>,
    pub num_computed_tokens: usize,
    /// Prompt tokens served from the prefix cache at first admission.
    pub num_cached_tokens: Option<usize>,
    pub params: SamplingParams,
    pub max_tokens: usize,
    pub stop_ids: Vec<u32>,
    pub rng: SampleRng,
    /// Per generated token: its logprob under the distribution sampled from.
    pub logprobs: Vec<f32>,
    pub top_logprobs: Vec<Vec<(u32, f32)>>,
    pub num_preemptions: usize,
    /// The prompt's own logprobs, when asked for, as the prefill computes them.
    pub prompt_logprobs: Option<PromptLogprobsState>,
    /// `min_tokens`, `priority`, `cache_salt`.
    pub options: RequestOptions,
}

impl Request {
    pub fn new(id: RequestId, arrival: u64, submitted: GenerationRequest, rng: SampleRng) -> Self {
        Self {
            id,
            arrival,
            prompt_len: submitted.prompt.len(),
            tokens: submitted.prompt,
            num_computed_tokens: 0,
            num_cached_tokens: None,
            params: submitted.params,
            max_tokens: submitted.max_tokens,
            stop_ids: submitted.stop_ids,
            rng,
            logprobs: Vec::new(),
            top_logprobs: Vec::new(),
            num_preemptions: 0,
            prompt_logprobs: submitted
                .prompt_logprobs
                .map(|top_n| PromptLogprobsState::new(top_n.min(MAX_TOP_LOGPROBS))),
            options: RequestOptions::default(),
        }
    }

    /// Whether the next sample must come from a masked distribution (`min_tokens` not reached
    /// with stop ids to mask): it is then sampled on the host, from logits passed through
    /// [`Request::mask_logits`].
    pub fn masks_logits(&self) -> bool {
        self.output().len() < self.options.min_tokens && !self.stop_ids.is_empty()
    }

    /// Sets the logits of every token this request may not sample next to `-inf` (the stop
    /// ids while `min_tokens` is not reached); sampling then renormalises over the rest, and
    /// the logprob reported is that of the masked distribution.
    pub fn mask_logits(&self, logits: &mut [f32]) {
        if self.masks_logits() {
            for &t in &self.stop_ids {
                if let Some(x) = logits.get_mut(t as usize) {
                    *x = f32::NEG_INFINITY;
                }
            }
        }
    }

    /// Whether prompt logprobs are wanted and some are still missing (the request then takes no
    /// prefix-cache hits: the rows a hit skips are the ones it needs).
    pub fn needs_prompt_rows(&self) -> bool {
        self.prompt_logprobs
            .as_ref()
            .is_some_and(|p| !p.is_complete(self.prompt_len))
    }

    pub fn num_tokens(&self) -> usize {
        self.tokens.len()
    }

    pub fn output(&self) -> &[u32] {
        &self.tokens[self.prompt_len..]
    }

    /// Tokens still to compute before the next sample.
    pub fn num_uncomputed(&self) -> usize {
        self.num_tokens() - self.num_computed_tokens
    }

    /// Whether the request is done after appending `token` (checked in this order: stop token,
    /// `max_tokens`, the context limit).
    pub fn finish_after(&self, token: u32, max_model_len: usize) -> Option<FinishReason> {
        if self.stop_ids.contains(&token) {
            Some(FinishReason::Stop(token))
        } else if self.output().len() >= self.max_tokens || self.num_tokens() >= max_model_len {
            Some(FinishReason::Length)
        } else {
            None
        }
    }
}
