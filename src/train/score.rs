//! `swerve-train score`: per-token logprobs of given token sequences.
//!
//! Input: JSON lines `{"tokens": [ids...]}` (other keys are ignored). Output: one line per input
//! line, `{"logprobs": [null, lp1, lp2, ...]}`, as long as `tokens`, where
//! `lp_t = log p(tokens[t] | tokens[<t])` (the first token has no context, hence `null`).
//!
//! Sequences are packed in input order into batches of at most `batch_tokens` tokens (a longer
//! sequence runs alone, never truncated), each scored as soon as it is read, so memory holds one
//! batch whatever the file's size; the LM head runs over at most `LOGIT_ROWS` rows at a
//! time so the `[T, vocab]` logits are never whole in memory.

use crate::backend::{Backend, BackendGrad};
use crate::dist::grid::{run_grid, GridSpec, RankPlace, RankTask};
use crate::dist::Groups;
use crate::jsonl;
use crate::model::{PackedBatch, Qwen2Model};
use anyhow::{anyhow, bail, Result};
use serde_json::Value;
use std::path::Path;

/// Rows of logits materialised at once.
const LOGIT_ROWS: usize = 256;

/// The token ids of one score input line, checked: ids inside the vocabulary, length within
/// the model's context. Errors name `at` (`file:line`).
fn token_sequence(
    value: &Value,
    at: &str,
    vocab_size: usize,
    max_context: usize,
) -> Result<Vec<u32>> {
    let tokens = value
        .get("tokens")
        .and_then(Value::as_array)
        .ok_or_else(|| anyhow!("{at}: expected an object with a `tokens` array"))?;
    let mut ids = Vec::with_capacity(tokens.len());
    for (t, id) in tokens.iter().enumerate() {
        let id = id
            .as_u64()
            .filter(|&id| (id as usize) < vocab_size)
            .ok_or_else(|| anyhow!("{at}: tokens[{t}] = {id} is not a token id below the vocabulary size {vocab_size}"))?;
        ids.push(id as u32);
    }
    if ids.len() > max_context {
        bail!(
            "{at}: {} tokens exceed the model's context of {max_context}",
            ids.len()
        );
    }
    Ok(ids)
}

/// Logprobs of every sequence (`None` for each sequence's first token).
pub fn score_sequences<B: Backend>(
    backend: &B,
    model: &Qwen2Model<B>,
    sequences: &[Vec<u32>],
    batch_tokens: usize,
    mut on_sequence: impl FnMut(usize, Vec<Option<f32>>) -> Result<()>,
) -> Result<()> {
    if batch_tokens == 0 {
        bail!("batch_tokens must be positive");
    }
    let mut start = 0;
    while start < sequences.len() {
        // Greedy packing in input order; the first sequence of a batch always fits.
        let mut end = start;
        let mut tokens = 0;
        while end < sequences.len()
            && (end == start || tokens + sequences[end].len() <= batch_tokens)
        {
            tokens += sequences[end].len();
            end += 1;
        }
        let group = &sequences[start..end];
        let scored = score_batch(backend, model, group)?;
        for (offset, logprobs) in scored.into_iter().enumerate() {
            on_sequence(start + offset, logprobs)?;
        }
        start = end;
    }
    Ok(())
}

fn score_batch<B: Backend>(
    backend: &B,
    model: &Qwen2Model<B>,
    group: &[Vec<u32>],
) -> Result<Vec<Vec<Option<f32>>>> {
    let batch = PackedBatch::from_sequences(group);
    let mut results: Vec<Vec<Option<f32>>> =
        group.iter().map(|s| Vec::with_capacity(s.len())).collect();
    if batch.num_tokens() == 0 {
        return Ok(results);
    }
    let hidden = model.forward_hidden(backend, &batch)?;
    // Row r predicts the token at r + 1. A sequence's last row would read the next sequence's
    // first token: its logprob is computed but never reported.
    let mut targets = batch.tokens.clone();
    targets.rotate_left(1);
    let mut logprobs = Vec::with_capacity(batch.num_tokens());
    for chunk_start in (0..batch.num_tokens()).step_by(LOGIT_ROWS) {
        let chunk_end = (chunk_start + LOGIT_ROWS).min(batch.num_tokens());
        let rows = backend.slice_rows(&hidden, chunk_start..chunk_end)?;
        let logits = model.lm_head(backend, &rows)?;
        logprobs.extend(backend.token_logprobs(&logits, &targets[chunk_start..chunk_end])?);
    }
    for (s, result) in results.iter_mut().enumerate() {
        let range = batch.sequence_range(s);
        if !range.is_empty() {
            result.push(None);
            result.extend(
                logprobs[range.start..range.end - 1]
                    .iter()
                    .map(|&lp| Some(lp)),
            );
        }
    }
    Ok(results)
}

/// What `score` did, for the command's summary line.
#[derive(Debug, Clone, Copy)]
pub struct ScoreSummary {
    pub sequences: usize,
    pub tokens: usize,
    pub seconds: f64,
}

/// Reads `input` line by line, scores each batch of sequences as soon as it is read (only one
/// batch is ever in memory), writes `output` (through a temporary file, renamed when complete,
/// so a failed run never leaves a partial output behind).
pub fn score_file<B: Backend>(
    backend: &B,
    model: &Qwen2Model<B>,
    input: &Path,
    output: &Path,
    batch_tokens: usize,
) -> Result<ScoreSummary> {
    let mut summary = None;
    jsonl::write_atomically(output, |write| {
        summary = Some(score_lines(backend, model, input, batch_tokens, write)?);
        Ok(())
    })?;
    summary.ok_or_else(|| anyhow!("scoring wrote nothing"))
}

/// [`score_file`]'s work, each output line handed to `write`: every tensor-parallel rank runs it
/// (the forward's collectives need them all), one writes.
fn score_lines<B: Backend>(
    backend: &B,
    model: &Qwen2Model<B>,
    input: &Path,
    batch_tokens: usize,
    write: &mut dyn FnMut(&Value) -> Result<()>,
) -> Result<ScoreSummary> {
    if batch_tokens == 0 {
        bail!("batch_tokens must be positive");
    }
    let started = std::time::Instant::now();
    let (vocab_size, max_context) = (model.config.vocab_size, model.config.max_context());
    let mut lines = jsonl::ObjectLines::open(input)?;
    let mut summary = ScoreSummary {
        sequences: 0,
        tokens: 0,
        seconds: 0.0,
    };
    let mut pending: Vec<Vec<u32>> = Vec::new();
    let mut pending_tokens = 0;
    let mut flush = |pending: &mut Vec<Vec<u32>>| -> Result<()> {
        score_sequences(backend, model, pending, batch_tokens, |_, logprobs| {
            write(&serde_json::json!({ "logprobs": logprobs }))
        })?;
        pending.clear();
        Ok(())
    };
    while let Some((line_no, value)) = lines.next_object()? {
        let at = jsonl::at(input, line_no);
        let ids = token_sequence(&value, &at, vocab_size, max_context)?;
        // The packing `score_sequences` would choose over the whole file: a batch closes
        // before the sequence that would overflow it.
        if !pending.is_empty() && pending_tokens + ids.len() > batch_tokens {
            flush(&mut pending)?;
            pending_tokens = 0;
        }
        summary.sequences += 1;
        summary.tokens += ids.len();
        pending_tokens += ids.len();
        pending.push(ids);
    }
    flush(&mut pending)?;
    summary.seconds = started.elapsed().as_secs_f64();
    Ok(summary)
}

/// One rank of a tensor-parallel `score`: its part of the model; the first rank writes.
struct ScoreRank<'a> {
    model_dir: &'a Path,
    input: &'a Path,
    output: &'a Path,
    batch_tokens: usize,
}

impl RankTask for ScoreRank<'_> {
    type Output = ScoreSummary;

    fn run<B: BackendGrad + 'static>(
        &self,
        backend: &B,
        groups: Groups<B>,
        _place: RankPlace,
    ) -> Result<ScoreSummary> {
        let writer = groups.is_writer();
        let model = Qwen2Model::load_shard(backend, self.model_dir, groups.tp)?;
        if writer {
            score_file(backend, &model, self.input, self.output, self.batch_tokens)
        } else {
            score_lines(backend, &model, self.input, self.batch_tokens, &mut |_| {
                Ok(())
            })
        }
    }
}

/// `swerve-train score`: loads `model_dir` on `device`'s backend (over `tensor_parallel`
/// ranks, a thread each) and scores `input`.
pub fn run(
    device: crate::backend::DeviceChoice,
    model_dir: &Path,
    input: &Path,
    output: &Path,
    batch_tokens: usize,
    tensor_parallel: usize,
) -> Result<ScoreSummary> {
    let task = ScoreRank {
        model_dir,
        input,
        output,
        batch_tokens,
    };
    let spec = GridSpec {
        tp: tensor_parallel,
        ..GridSpec::single()
    };
    // Every rank scores everything; the first one's summary is the writer's.
    let summary = run_grid(device, &spec, &task)?.swap_remove(0);
    eprintln!(
        "scored {} sequences ({} tokens) in {:.2} s -> {}",
        summary.sequences,
        summary.tokens,
        summary.seconds,
        output.display()
    );
    Ok(summary)
}
