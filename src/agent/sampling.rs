//! What sampling a model for episodes needs, decided in one place for `rollout`, `eval` and `rl`:
//! the ids that end a reply, the episodes' context limit, and the in-process engine.

use crate::backend::DeviceChoice;
use crate::config::ModelConfig;
use crate::engine::launch::{launch_engine, EngineLaunch};
use crate::engine::EngineHandle;
use crate::tokenizer::Tokenizer;
use anyhow::{bail, Result};
use std::path::Path;

/// The context an episode gets when `--max-context` is not given: the model's, at most this
/// (RL-SPEC's stage 1; stage 2 asks for 131,072 with a YaRN model).
pub const DEFAULT_MAX_CONTEXT: usize = 65_536;

/// A model's limits for episodes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelLimits {
    /// The tokenizer's stop ids that the model's vocabulary holds (a model may be smaller than
    /// its tokenizer; an id it cannot produce stops nothing).
    pub stop_ids: Vec<u32>,
    /// Tokens an episode may hold: `--max-context` (refused beyond the model's), else the
    /// model's, at most [`DEFAULT_MAX_CONTEXT`].
    pub max_context: usize,
}

impl ModelLimits {
    pub fn new(
        config: &ModelConfig,
        tokenizer: &Tokenizer,
        max_context: Option<usize>,
    ) -> Result<Self> {
        let model_context = config.max_context();
        let max_context = match max_context {
            Some(n) if n > model_context => {
                bail!("--max-context {n} is beyond the model's context of {model_context} tokens")
            }
            Some(0) => bail!("--max-context 0: an episode needs at least its prompt"),
            Some(n) => n,
            None => model_context.min(DEFAULT_MAX_CONTEXT),
        };
        let stop_ids = tokenizer
            .stop_ids()
            .iter()
            .copied()
            .filter(|&t| (t as usize) < config.vocab_size)
            .collect();
        Ok(Self {
            stop_ids,
            max_context,
        })
    }
}

/// The in-process engine episodes sample from: `concurrency` sequences at once, each up to
/// `max_context` tokens, 90% of what the weights leave for the KV cache.
pub fn launch_rollout_engine(
    model_dir: &Path,
    device: DeviceChoice,
    max_context: usize,
    concurrency: usize,
    seed: u64,
    tensor_parallel: usize,
) -> Result<EngineHandle> {
    launch_engine(&EngineLaunch {
        model: model_dir.to_path_buf(),
        device,
        max_model_len: max_context,
        kv_cache_fraction: 0.9,
        num_kv_blocks: None,
        max_num_seqs: concurrency,
        max_num_batched_tokens: 8192,
        seed,
        tensor_parallel,
    })
}
