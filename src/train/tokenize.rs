//! `swerve-train tokenize`: the trainer's own tokenization of a data file, so users can see the
//! exact ids and action masks training will use (the same code path).
//!
//! Input lines: `{"text": "..."}` (plain encoding; added tokens written in the text are
//! recognised; mask all 0) or `{"messages": [...], "tools": [...]}` (rendered with the
//! tokenizer's chat template, no generation prompt). Output lines:
//! `{"tokens": [...], "action_mask": [...]}`.

use crate::chat::{ChatTemplate, Conversation, MaskedTokens};
use crate::jsonl;
use crate::tokenizer::Tokenizer;
use anyhow::{anyhow, bail, Result};
use serde_json::{json, Value};
use std::path::Path;

/// One data line as token ids and action mask.
pub fn tokenize_line(
    tokenizer: &Tokenizer,
    template: &ChatTemplate,
    line: &Value,
) -> Result<MaskedTokens> {
    match (line.get("text"), line.get("messages")) {
        (Some(_), Some(_)) => bail!("a line has either `text` or `messages`, not both"),
        (Some(Value::String(text)), None) => {
            let tokens = tokenizer.encode(text)?;
            let action_mask = vec![0; tokens.len()];
            Ok(MaskedTokens {
                tokens,
                action_mask,
            })
        }
        (Some(other), None) => bail!("`text` must be a string, found {other}"),
        (None, Some(_)) => template.tokenize(tokenizer, &Conversation::from_json(line)?),
        (None, None) => bail!("expected `text` or `messages`"),
    }
}

/// Tokenizes every line of `input` into `output`, one line at a time; returns (lines, tokens).
pub fn tokenize_file(tokenizer: &Tokenizer, input: &Path, output: &Path) -> Result<(usize, usize)> {
    let template = ChatTemplate::for_tokenizer(tokenizer)?;
    let mut lines = jsonl::ObjectLines::open(input)?;
    let (mut total_lines, mut total_tokens) = (0, 0);
    jsonl::write_atomically(output, |write| {
        while let Some((line_no, value)) = lines.next_object()? {
            let masked = tokenize_line(tokenizer, &template, &value)
                .map_err(|e| anyhow!("{}: {e:#}", jsonl::at(input, line_no)))?;
            total_lines += 1;
            total_tokens += masked.tokens.len();
            write(&json!({ "tokens": masked.tokens, "action_mask": masked.action_mask }))?;
        }
        Ok(())
    })?;
    Ok((total_lines, total_tokens))
}

/// `swerve-train tokenize`: the tokenizer of folder `tokenizer_dir` over `input`.
pub fn run(tokenizer_dir: &Path, input: &Path, output: &Path) -> Result<(usize, usize)> {
    let tokenizer = Tokenizer::from_dir(tokenizer_dir)?;
    let (lines, tokens) = tokenize_file(&tokenizer, input, output)?;
    eprintln!(
        "tokenized {lines} lines ({tokens} tokens) -> {}",
        output.display()
    );
    Ok((lines, tokens))
}
