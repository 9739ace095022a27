//! Logprobs of a prompt's own tokens (OpenAI's `echo` with `logprobs`): one full forward pass
//! with the engine's current weights, outside the paged cache, then the LM head over chunks of
//! rows so a long prompt never holds `[T, vocab]` logits at once.
//!
//! Each value is [`log_softmax_at`] of the row before the token: what the trainer's
//! `token_logprobs` gives for the same ids, bit for bit on the reference backend.

use crate::backend::Backend;
use crate::engine::engine::Engine;
use crate::engine::sampler::{log_softmax_at, sample, SampleRng, SamplingParams, MAX_TOP_LOGPROBS};
use crate::model::PackedBatch;
use anyhow::{ensure, Result};

/// Rows of logits computed at once.
const CHUNK_ROWS: usize = 64;

/// One prompt's logprobs: position 0 has none (nothing precedes it).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PromptLogprobs {
    /// `logprobs[t] = log p(tokens[t] | tokens[<t])`; `None` at t = 0.
    pub logprobs: Vec<Option<f32>>,
    /// At each position t >= 1, the `top_n` most likely tokens (descending, ties by id); empty at
    /// t = 0 and when `top_n` is 0.
    pub top_logprobs: Vec<Vec<(u32, f32)>>,
}

/// The logprobs of `tokens` under `engine`'s model; `top_n` is capped at [`MAX_TOP_LOGPROBS`].
/// Errors name the token out of the vocabulary or the length past the engine's `max_model_len`.
pub fn prompt_logprobs<B: Backend>(
    engine: &Engine<B>,
    tokens: &[u32],
    top_n: usize,
) -> Result<PromptLogprobs> {
    let vocab = engine.model.config.vocab_size;
    let limit = engine.config().max_model_len;
    ensure!(!tokens.is_empty(), "prompt: empty");
    ensure!(
        tokens.len() <= limit,
        "prompt: {} tokens exceed max_model_len {limit}",
        tokens.len()
    );
    if let Some((i, &t)) = tokens
        .iter()
        .enumerate()
        .find(|(_, &t)| t as usize >= vocab)
    {
        anyhow::bail!("prompt: token {t} at position {i} is outside the vocabulary of {vocab}");
    }
    let top_n = top_n.min(MAX_TOP_LOGPROBS);
    let mut out = PromptLogprobs {
        logprobs: vec![None],
        top_logprobs: vec![Vec::new()],
    };
    if tokens.len() == 1 {
        return Ok(out);
    }
    let backend = &engine.backend;
    let model = &engine.model;
    let hidden = model.forward_hidden(backend, &PackedBatch::from_sequences(&[tokens]))?;
    let rows = tokens.len() - 1;
    let greedy_top = SamplingParams {
        top_logprobs: top_n,
        ..SamplingParams::greedy()
    };
    let mut unused_rng = SampleRng::from_seed(0);
    let mut start = 0;
    while start < rows {
        let end = (start + CHUNK_ROWS).min(rows);
        let chunk = backend.slice_rows(&hidden, start..end)?;
        let logits = backend.to_host(&model.lm_head(backend, &chunk)?)?;
        let width = model.local.vocab_local;
        for (k, row) in logits.chunks_exact(width).enumerate() {
            let target = tokens[start + k + 1];
            out.logprobs.push(Some(log_softmax_at(row, target)));
            out.top_logprobs.push(if top_n > 0 {
                // Greedy sampling reports the model's own top logprobs and draws nothing.
                sample(row, &greedy_top, &mut unused_rng).top_logprobs
            } else {
                Vec::new()
            });
        }
        start = end;
    }
    Ok(out)
}
