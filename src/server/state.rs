//! What every handler shares: the engine handle, the tokenizer and chat template, the limits,
//! admission control, metrics, the weight version and the set of requests in flight.

use super::context::{Context, SamplingDefaults};
use super::detok::TokenTable;
use super::metrics::Metrics;
use crate::chat::ChatTemplate;
use crate::engine::EngineHandle;
use crate::kvcache::RequestId;
use crate::tokenizer::Tokenizer;
use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
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
    /// Engine ids of every request a client is waiting on (the count `abort_all` reports).
    pub live: Mutex<HashSet<RequestId>>,
    /// For response ids.
    pub next_response: AtomicU64,
    pub started_unix: u64,
    /// 0 awake; else the sleep level (1: KV cache released, 2: weights too).
    pub sleep_level: AtomicU8,
    /// Engine ids by the caller's request id (`request_id`, SGLang's `rid`), for
    /// `/abort_request`.
    pub named: Mutex<HashMap<String, Vec<RequestId>>>,
    /// The folder the server was started with (prime-rl's `/reload_weights` goes back to it).
    pub base_model_dir: PathBuf,
    /// The model folder the weights were last loaded from (reloaded from on a wake-up after
    /// sleep level 2).
    pub weights_dir: Mutex<PathBuf>,
    /// SGLang's weight-version label, when an update gave one (`weight_version`).
    pub weight_version_label: Mutex<Option<String>>,
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

    /// The sleep level while asleep.
    pub fn sleep_level(&self) -> Option<u8> {
        match self.sleep_level.load(Ordering::SeqCst) {
            0 => None,
            level => Some(level),
        }
    }

    /// Records that engine request `id` belongs to the caller's request `rid`.
    pub fn name_request(&self, rid: &str, id: RequestId) {
        if let Ok(mut named) = self.named.lock() {
            named.entry(rid.to_string()).or_default().push(id);
        }
    }

    /// Forgets the caller's request id `rid`.
    pub fn forget_name(&self, rid: &str) {
        if let Ok(mut named) = self.named.lock() {
            named.remove(rid);
        }
    }

    /// Aborts the requests named `rid`; how many engine requests that was.
    pub fn abort_named(&self, rid: &str) -> usize {
        let ids = self
            .named
            .lock()
            .map(|n| n.get(rid).cloned().unwrap_or_default())
            .unwrap_or_default();
        for &id in &ids {
            let _ = self.engine.abort(id);
        }
        ids.len()
    }

    /// SGLang's `weight_version` in `meta_info`: the label an update gave, else the number.
    pub fn weight_version_label(&self) -> String {
        self.weight_version_label
            .lock()
            .ok()
            .and_then(|l| l.clone())
            .unwrap_or_else(|| self.weight_version().to_string())
    }

    /// Aborts every request in flight, those held by a pause included (their clients get
    /// `finish_reason: "abort"`); how many the server knew to be in the engine.
    pub fn abort_all(&self) -> usize {
        let known = self.live.lock().map(|l| l.len()).unwrap_or_default();
        let _ = self.engine.abort_all();
        known
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
