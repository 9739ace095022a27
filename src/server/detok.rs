//! Token ids to text, incrementally: each token's raw bytes come from a table built once, text
//! grows by the longest valid UTF-8 prefix of the bytes so far, and stop strings are matched on
//! that text.
//!
//! ```text
//!  token ids ──► TokenTable::bytes ──► TextBuilder (pending bytes ─► valid UTF-8 text) ──► stops
//!                 (byte-level BPE alphabet mapped back; added tokens as their text)
//! ```
//!
//! For a byte-level BPE tokenizer (Qwen2.5's) concatenated bytes, decoded lossily, are exactly
//! what decoding the whole id list gives; [`TokenTable::new`] checks that on a sample of the
//! vocabulary and refuses any tokenizer where it does not hold.

use crate::tokenizer::Tokenizer;
use anyhow::{bail, Result};

/// Every id's bytes and whether it is special (skipped with `skip_special_tokens`).
pub struct TokenTable {
    bytes: Vec<Box<[u8]>>,
    special: Vec<bool>,
}

/// GPT-2's byte-level alphabet: the printable bytes stand for themselves; the others are shifted
/// to code points 256 and up, in order. Returns the inverse: char -> byte.
fn byte_level_inverse() -> std::collections::HashMap<char, u8> {
    let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    let mut map = std::collections::HashMap::new();
    let mut shifted = 0u32;
    for b in 0..=255u8 {
        let c = if printable(b) {
            char::from(b)
        } else {
            shifted += 1;
            char::from_u32(255 + shifted).expect("below the surrogates")
        };
        map.insert(c, b);
    }
    map
}

impl TokenTable {
    /// The table for ids `0..model_vocab` (ids past the tokenizer's vocabulary, the embedding's
    /// padding, have no bytes).
    pub fn new(tokenizer: &Tokenizer, model_vocab: usize) -> Result<Self> {
        let hf = tokenizer.hf();
        let inverse = byte_level_inverse();
        let added = hf.get_added_tokens_decoder();
        let mut bytes = Vec::with_capacity(model_vocab);
        let mut special = Vec::with_capacity(model_vocab);
        for id in 0..model_vocab as u32 {
            if let Some(token) = added.get(&id) {
                bytes.push(token.content.as_bytes().into());
                special.push(token.special);
                continue;
            }
            let piece = match hf.id_to_token(id) {
                None => Vec::new(),
                Some(s) => match s.chars().map(|c| inverse.get(&c).copied()).collect() {
                    Some(b) => b,
                    None => bail!(
                        "token {id} ({s:?}) is not byte-level BPE: this server decodes byte-level tokenizers (Qwen2.5's) only"
                    ),
                },
            };
            bytes.push(piece.into());
            special.push(false);
        }
        let table = Self { bytes, special };
        // The table must decode as the tokenizer does: check single ids and runs of ids.
        let n = model_vocab.min(tokenizer.vocab_size()) as u32;
        let step = (n / 1500).max(1);
        let sample: Vec<u32> = (0..n).step_by(step as usize).collect();
        for window in sample.chunks(7) {
            let want = tokenizer.decode(window, false)?;
            if table.decode(window, false) != want {
                bail!("the tokenizer's decoder is not byte-level BPE (ids {window:?} decode to {want:?}): unsupported");
            }
        }
        Ok(table)
    }

    /// The raw bytes of `id` (empty past the vocabulary, or for a skipped special token).
    pub fn bytes(&self, id: u32, skip_special: bool) -> &[u8] {
        match self.bytes.get(id as usize) {
            Some(_) if skip_special && self.special[id as usize] => &[],
            Some(b) => b,
            None => &[],
        }
    }

    /// The full bytes of `id`, special or not (OpenAI's logprob `bytes`).
    pub fn raw(&self, id: u32) -> &[u8] {
        self.bytes.get(id as usize).map_or(&[], |b| b)
    }

    /// `id` as text on its own (invalid UTF-8 replaced): a logprob entry's `token`.
    pub fn text(&self, id: u32) -> String {
        String::from_utf8_lossy(self.raw(id)).into_owned()
    }

    /// Text of `ids`, as the tokenizer's decode gives it.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> String {
        let mut builder = TextBuilder::default();
        for &id in ids {
            builder.push(self.bytes(id, skip_special));
        }
        builder.finish();
        builder.text
    }
}

/// Text grown from bytes: `text` is always valid UTF-8; bytes of an incomplete character wait in
/// `pending`; an invalid sequence becomes one U+FFFD, as `String::from_utf8_lossy` does.
#[derive(Default, Debug)]
pub struct TextBuilder {
    pending: Vec<u8>,
    pub text: String,
}

impl TextBuilder {
    pub fn push(&mut self, bytes: &[u8]) {
        self.pending.extend_from_slice(bytes);
        let mut start = 0;
        loop {
            match std::str::from_utf8(&self.pending[start..]) {
                Ok(s) => {
                    self.text.push_str(s);
                    self.pending.clear();
                    return;
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    let s = std::str::from_utf8(&self.pending[start..start + valid])
                        .expect("valid_up_to");
                    self.text.push_str(s);
                    match e.error_len() {
                        Some(bad) => {
                            self.text.push(char::REPLACEMENT_CHARACTER);
                            start += valid + bad;
                        }
                        None => {
                            self.pending.drain(..start + valid);
                            return;
                        }
                    }
                }
            }
        }
    }

    /// Ends the text: an incomplete character left over becomes U+FFFD.
    pub fn finish(&mut self) {
        if !self.pending.is_empty() {
            self.text.push_str(&String::from_utf8_lossy(&self.pending));
            self.pending.clear();
        }
    }
}

/// The earliest stop string in `text` that ends after byte `new_from` (so a match must use some
/// of the newest text): its start. `stops` are non-empty.
pub fn find_stop(text: &str, new_from: usize, stops: &[String]) -> Option<usize> {
    find_stop_span(text, new_from, stops).map(|(start, _)| start)
}

/// [`find_stop`] with the end of the match too: `(start, end)` of the earliest stop string
/// (the longest one where two start at the same byte).
pub fn find_stop_span(text: &str, new_from: usize, stops: &[String]) -> Option<(usize, usize)> {
    let longest = stops.iter().map(String::len).max()?;
    let mut from = new_from.saturating_sub(longest.saturating_sub(1));
    while !text.is_char_boundary(from) {
        from -= 1;
    }
    stops
        .iter()
        .filter_map(|stop| {
            text[from..]
                .find(stop.as_str())
                .map(|at| (from + at, from + at + stop.len()))
        })
        .min_by_key(|&(start, end)| (start, std::cmp::Reverse(end)))
}

/// How many bytes at the end of `text` could be the start of a stop string: held back from a
/// stream until the next tokens decide.
pub fn held_back(text: &str, stops: &[String]) -> usize {
    stops
        .iter()
        .flat_map(|stop| {
            (1..stop.len())
                .rev()
                .filter(|&k| stop.is_char_boundary(k) && text.ends_with(&stop[..k]))
                .take(1)
        })
        .max()
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builder_waits_for_whole_characters_and_replaces_bad_bytes() {
        let mut b = TextBuilder::default();
        let snow = "☃".as_bytes();
        b.push(&snow[..1]);
        assert_eq!(b.text, "");
        b.push(&snow[1..]);
        assert_eq!(b.text, "☃");
        b.push(&[0xFF, b'a']);
        assert_eq!(b.text, "☃\u{FFFD}a");
        b.push(&snow[..2]);
        b.finish();
        assert_eq!(b.text, "☃\u{FFFD}a\u{FFFD}");
    }

    #[test]
    fn stops_are_found_across_pieces_and_prefixes_held_back() {
        let stops = vec!["END".to_string(), "\n\n".to_string()];
        assert_eq!(find_stop("abcEN", 3, &stops), None);
        assert_eq!(find_stop("abcEND", 5, &stops), Some(3));
        assert_eq!(find_stop("a\n\nEND", 5, &stops), Some(3));
        assert_eq!(find_stop("a\n\nEND", 2, &stops), Some(1));
        assert_eq!(held_back("abcEN", &stops), 2);
        assert_eq!(held_back("abc\n", &stops), 1);
        assert_eq!(held_back("abc", &stops), 0);
        let stops = vec!["é!".to_string()];
        assert_eq!(held_back("caé", &stops), 2);
        assert_eq!(find_stop("caé!", 4, &stops), Some(2));
    }

    #[test]
    fn the_table_decodes_as_the_tokenizer_does() {
        let tokenizer = Tokenizer::qwen25().unwrap();
        let table = TokenTable::new(&tokenizer, 151_936).unwrap();
        let text = "Hello, 世界! <tool_call>\n{\"a\": 1}</tool_call><|im_end|> café 🎉";
        let ids = tokenizer.encode(text).unwrap();
        assert_eq!(table.decode(&ids, false), text);
        assert_eq!(
            table.decode(&ids, true),
            tokenizer.decode(&ids, true).unwrap()
        );
        // Byte by byte through the builder, one token at a time.
        let mut b = TextBuilder::default();
        for &id in &ids {
            b.push(table.bytes(id, false));
            assert!(text.starts_with(&b.text));
        }
        assert_eq!(b.text, text);
        assert!(table.raw(151_900).is_empty());
    }
}
