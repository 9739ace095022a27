//! Logprobs of a prompt's own tokens (OpenAI's `echo` with `logprobs`), computed as engine work
//! during the request's own chunked prefill, as vLLM does: a request submitted with
//! `prompt_logprobs: Some(top_n)` has, in each step that computes some of its prompt positions,
//! the LM head run over those rows (in chunks of [`CHUNK_ROWS`], so a long prompt never holds
//! `[T, vocab]` logits at once), and gets one [`PromptLogprobs`] event before its first token.
//! Other requests' steps interleave with its prefill chunks like with any prefill.
//!
//! ```text
//!   prompt    t0   t1   t2   t3   t4 | sampled
//!   row       r0   r1   r2   r3   r4     row r_p scores token t_(p+1); r4 gives the first sample
//!   logprobs  None lp1  lp2  lp3  lp4
//! ```
//!
//! Rows skipped by a prefix-cache hit are never computed, so such a request takes no hits while
//! logprobs are missing (it still caches its blocks for the requests after it; the server asks
//! for them on the first choice of each prompt only). A preempted request keeps the values it
//! has and computes only the missing ones when it runs again.
//!
//! Each value is [`log_softmax_at`] of the row before the token: what the trainer's
//! `token_logprobs` gives for the same ids, bit for bit on the reference backend, whose paged
//! prefill gives every row the numbers of a full forward pass.

use crate::backend::Backend;
use crate::engine::sampler::{log_softmax_at, sample, SampleRng, SamplingParams};
use crate::kvcache::RequestId;
use crate::model::Qwen2Model;
use anyhow::Result;
use std::ops::Range;

/// Rows of logits computed at once.
pub const CHUNK_ROWS: usize = 64;

/// One prompt's logprobs: position 0 has none (nothing precedes it).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PromptLogprobs {
    /// `logprobs[t] = log p(tokens[t] | tokens[<t])`; `None` at t = 0.
    pub logprobs: Vec<Option<f32>>,
    /// At each position t >= 1, the `top_n` most likely tokens (descending, ties by id); empty at
    /// t = 0 and when `top_n` is 0.
    pub top_logprobs: Vec<Vec<(u32, f32)>>,
    /// At each position t >= 1, the rank of `tokens[t]` in its distribution: 1 + the number of
    /// tokens with a larger logit (vLLM's `rank`); `None` at t = 0.
    pub ranks: Vec<Option<u32>>,
}

impl PromptLogprobs {
    /// Appends the next position's values.
    pub fn push(&mut self, scored: ScoredRow) {
        self.logprobs.push(Some(scored.logprob));
        self.top_logprobs.push(scored.top_logprobs);
        self.ranks.push(Some(scored.rank));
    }
}

/// A request's prompt logprobs while its prefill computes them.
#[derive(Clone, Debug)]
pub struct PromptLogprobsState {
    /// Alternatives per position (at most `MAX_TOP_LOGPROBS`).
    pub top_n: usize,
    /// The values so far: positions `0 .. values.logprobs.len()`.
    pub values: PromptLogprobs,
    /// Handed out in an event (the values are then gone).
    pub delivered: bool,
}

impl PromptLogprobsState {
    pub fn new(top_n: usize) -> Self {
        Self {
            top_n,
            values: PromptLogprobs {
                logprobs: vec![None],
                top_logprobs: vec![Vec::new()],
                ranks: vec![None],
            },
            delivered: false,
        }
    }

    /// Whether every prompt token has its value.
    pub fn is_complete(&self, prompt_len: usize) -> bool {
        self.delivered || self.values.logprobs.len() >= prompt_len
    }

    /// The positions among `computed` (those a step computes) whose rows score a prompt token
    /// still missing: row `p` scores token `p + 1`.
    pub fn rows_needed(&self, prompt_len: usize, computed: Range<usize>) -> Range<usize> {
        if self.delivered {
            return 0..0;
        }
        let next_target = self.values.logprobs.len();
        let start = computed.start.max(next_target - 1);
        let end = computed.end.min(prompt_len.saturating_sub(1));
        start..end.max(start)
    }
}

/// One row of a step's hidden states that scores a prompt token.
#[derive(Clone, Copy, Debug)]
pub struct PromptRow {
    pub id: RequestId,
    /// Row in the step's hidden states.
    pub row: u32,
    /// The prompt token it scores.
    pub target: u32,
    pub top_n: usize,
}

/// What [`score_rows`] finds for one row.
#[derive(Clone, Debug, PartialEq)]
pub struct ScoredRow {
    pub logprob: f32,
    pub top_logprobs: Vec<(u32, f32)>,
    /// 1 + the number of tokens whose logit is above the target's.
    pub rank: u32,
}

/// 1 + the number of logits above `row[target]` (NaN counts as below everything).
pub fn rank_of(row: &[f32], target: u32) -> u32 {
    let Some(&x) = row.get(target as usize) else {
        return row.len() as u32;
    };
    let x = if x.is_nan() { f32::NEG_INFINITY } else { x };
    1 + row.iter().filter(|&&y| y > x).count() as u32
}

/// The logprob (and `top_n` alternatives) of every row's target, in `rows`' order.
pub fn score_rows<B: Backend>(
    backend: &B,
    model: &Qwen2Model<B>,
    hidden: &B::Tensor,
    rows: &[PromptRow],
) -> Result<Vec<ScoredRow>> {
    let mut out = Vec::with_capacity(rows.len());
    let width = model.config.vocab_size;
    // Greedy sampling reports the model's own top logprobs and draws nothing.
    let mut unused_rng = SampleRng::from_seed(0);
    for chunk in rows.chunks(CHUNK_ROWS) {
        let indices: Vec<u32> = chunk.iter().map(|r| r.row).collect();
        let gathered = backend.gather_rows(hidden, &indices)?;
        let logits = backend.to_host(&model.lm_head(backend, &gathered)?)?;
        for (r, row) in chunk.iter().zip(logits.chunks_exact(width)) {
            let top = if r.top_n > 0 {
                let greedy_top = SamplingParams {
                    top_logprobs: r.top_n,
                    ..SamplingParams::greedy()
                };
                sample(row, &greedy_top, &mut unused_rng).top_logprobs
            } else {
                Vec::new()
            };
            out.push(ScoredRow {
                logprob: log_softmax_at(row, r.target),
                top_logprobs: top,
                rank: rank_of(row, r.target),
            });
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_needed_cover_each_missing_target_once() {
        let mut state = PromptLogprobsState::new(0);
        // A 10-token prompt: rows 0..9 score tokens 1..10; row 9 samples.
        assert_eq!(state.rows_needed(10, 0..4), 0..4);
        for _ in 0..4 {
            state.values.logprobs.push(Some(0.0));
        }
        assert_eq!(state.rows_needed(10, 4..12), 4..9);
        // After a preemption the prefill starts over: the rows already scored are skipped.
        assert_eq!(state.rows_needed(10, 0..6), 4..6);
        assert_eq!(state.rows_needed(10, 0..3), 4..4);
        assert!(!state.is_complete(10));
        for _ in 0..5 {
            state.values.logprobs.push(Some(0.0));
        }
        assert!(state.is_complete(10));
        assert_eq!(state.rows_needed(10, 9..10), 9..9);
        // A one-token prompt has nothing to score.
        let one = PromptLogprobsState::new(0);
        assert!(one.is_complete(1));
        assert_eq!(one.rows_needed(1, 0..1), 0..0);
    }
}
