//! What every handler shares: the engine handle, the tokenizer and chat template, the limits,
//! admission control, metrics, the weight version and the set of requests in flight.

use super::detok::TokenTable;
use super::metrics::Metrics;
use super::openai::{Context, SamplingDefaults};
use crate::chat::ChatTemplate;
use crate::engine::EngineHandle;
use crate::kvcache::RequestId;
use crate::tokenizer::Tokenizer;
use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

pub struct AppState {
    pub engine: Arc<EngineHandle>,
    pub tokenizer: Tokenizer,
    pub template: ChatTemplate,
    pub table: TokenTable,
    pub served_model_name: String,
    /// Rows of the model's embedding.
    pub model_vocab: usize,
    pub max_model_len: usize,
    pub defaults: SamplingDefaults,
    pub eos_ids: Vec<u32>,
    pub api_key: Option<String>,
    pub admission: Admission,
    pub metrics: Metrics,
    /// The version of the weights loaded now (0 at start, +1 per reload).
    pub weight_version: AtomicU64,
    pub paused: AtomicBool,
    /// Set by SIGTERM: new generation requests get 503.
    pub stopping: AtomicBool,
    /// Engine ids of every request a client is waiting on (for aborting them all at shutdown).
    pub live: Mutex<HashSet<RequestId>>,
    /// For response ids.
    pub next_response: AtomicU64,
    pub started_unix: u64,
}

impl AppState {
    pub fn context(&self) -> Context<'_> {
        Context {
            tokenizer: &self.tokenizer,
            template: &self.template,
            served_model_name: &self.served_model_name,
            model_vocab: self.model_vocab,
            max_model_len: self.max_model_len,
            defaults: &self.defaults,
            eos_ids: &self.eos_ids,
        }
    }

    pub fn weight_version(&self) -> u64 {
        self.weight_version.load(Ordering::SeqCst)
    }

    /// Aborts every request in flight (their clients get `finish_reason: "abort"`).
    pub fn abort_all(&self) -> usize {
        let ids: Vec<RequestId> = self
            .live
            .lock()
            .map(|l| l.iter().copied().collect())
            .unwrap_or_default();
        for &id in &ids {
            let _ = self.engine.abort(id);
        }
        ids.len()
    }
}

/// Bounded admission: at most `capacity` sequences (choices) admitted and not yet finished.
/// Past it a request is refused with 429 rather than queued without bound.
pub struct Admission {
    in_flight: Arc<AtomicUsize>,
    pub capacity: usize,
}

/// Held while a request's sequences are in flight; releases them on drop.
pub struct Permit {
    in_flight: Arc<AtomicUsize>,
    count: usize,
}

impl Drop for Permit {
    fn drop(&mut self) {
        self.in_flight.fetch_sub(self.count, Ordering::SeqCst);
    }
}

impl Admission {
    pub fn new(capacity: usize) -> Self {
        Self {
            in_flight: Arc::new(AtomicUsize::new(0)),
            capacity,
        }
    }

    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::SeqCst)
    }

    /// Admits `count` sequences if they fit under the capacity.
    pub fn try_admit(&self, count: usize) -> Option<Permit> {
        self.in_flight
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |now| {
                (now + count <= self.capacity).then_some(now + count)
            })
            .ok()
            .map(|_| Permit {
                in_flight: self.in_flight.clone(),
                count,
            })
    }
}
