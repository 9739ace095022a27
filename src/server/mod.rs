//! `swerve-serve`: the OpenAI-compatible rollout server (DESIGN.md; issue 6).
//!
//! ```text
//!  HTTP (axum, tokio) ──► http.rs: auth, body ──► openai.rs: fields ─► Job (token ids, params)
//!        ▲                                                              │ generate.rs: admit (429),
//!        │  response.rs: JSON / stream.rs: SSE chunks                   ▼ submit per choice
//!        └──────────── Run { ChoiceState } ◄── events ◄── EngineHandle (engine thread: steps)
//! ```
//!
//! - [`openai`]: request bodies read field by field into a [`openai::Job`] ([`chat_request`]:
//!   chat; [`prompts`]: prompts as token ids; [`extensions`]: vLLM's extension fields;
//!   [`tokenize`]: `/tokenize`); [`policy`]: which fields are implemented, refused or ignored;
//!   [`fields`]: the typed field reader; [`error`]: OpenAI-shaped errors naming the field.
//! - [`generate`]: admission, submission, each choice's text, stop strings and finish;
//!   [`detok`]: token bytes and incremental UTF-8 text; [`response`]: bodies and stream chunks;
//!   [`stream`]: the SSE body (dropping it aborts its requests).
//! - [`http`]: the routes and OpenAI handlers ([`handler`]: what every handler shares;
//!   [`context`]: what parsing needs to know); [`control`]: weights, pause, sleep, caches,
//!   health; [`sglang`]: SGLang's `/generate` and `/abort_request`; [`metrics`]: Prometheus text; [`state`]: what handlers share;
//!   [`launch`]: loading the model, sizing the KV cache, serving, and stopping on SIGTERM.
//!
//! Token-in, token-out: every choice carries `token_ids` (and `prompt_token_ids`), a request may
//! send `prompt_token_ids` instead of text or messages, and `usage` has `cached_tokens`; every
//! response carries the `weight_version` that produced it.

pub mod chat_request;
pub mod context;
pub mod control;
pub mod detok;
pub mod error;
pub mod extensions;
pub mod fields;
pub mod generate;
pub mod handler;
pub mod http;
pub mod launch;
pub mod metrics;
pub mod openai;
pub mod policy;
pub mod prompts;
pub mod response;
pub mod sglang;
pub mod state;
pub mod stream;
pub mod tokenize;

pub use launch::{run, ServeOptions};
