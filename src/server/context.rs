//! What parsing a request needs to know about the server ([`Context`]), and the sampling
//! defaults for fields a request leaves unset.

use crate::chat::ChatTemplate;
use crate::engine::SamplingParams;
use crate::tokenizer::Tokenizer;

/// Sampling used for fields a request leaves unset: RL-correct (temperature 1, no filters) unless
/// the server was started with `--use-generation-config`.
#[derive(Clone, Debug, PartialEq)]
pub struct SamplingDefaults {
    pub temperature: f32,
    pub top_p: f32,
    pub top_k: Option<usize>,
    pub min_p: f32,
}

impl Default for SamplingDefaults {
    fn default() -> Self {
        let p = SamplingParams::default();
        Self {
            temperature: p.temperature,
            top_p: p.top_p,
            top_k: p.top_k,
            min_p: p.min_p,
        }
    }
}

/// What parsing needs to know about the server.
pub struct Context<'a> {
    pub tokenizer: &'a Tokenizer,
    pub template: &'a ChatTemplate,
    pub served_model_name: &'a str,
    /// Rows of the model's embedding: token ids must be below it.
    pub model_vocab: usize,
    pub max_model_len: usize,
    pub defaults: &'a SamplingDefaults,
    /// Stop ids used unless `ignore_eos` (the tokenizer's `<|im_end|>`, `<|endoftext|>`).
    pub eos_ids: &'a [u32],
}
