//! The inference engine (DESIGN.md decisions 7-10): requests, the continuous-batching
//! scheduler over the paged KV cache, RL-correct sampling, and the step loop.
//!
//! - [`request`]: one request's tokens, computed count and sampling state.
//! - [`scheduler`]: one rule, `num_computed_tokens` catches up to `num_tokens` under a budget.
//! - [`sampler`]: temperature / top-k / top-p / min-p sampling with exact logprobs.
//! - [`engine`]: [`Engine`], synchronous: plan, paged forward, sample, events.
//! - [`handle`]: [`EngineHandle`], the engine on its own thread behind channels: submit, a stream
//!   of events per request, abort, weight updates, pause (new submissions held until resume)
//!   and resume, sleep and wake-up.
//! - [`launch`]: an engine for a model folder on the backend chosen at run time.
//! - [`reload`]: weight updates in place between steps.
//! - [`handoff`]: a trainer's weights in memory, each rank's shard to the engine rank of the same
//!   index (device to device, or streamed one tensor at a time through the host).
//! - [`parallel`]: a tensor-parallel group of engines stepped in lockstep ([`TpEngine`]) behind
//!   the same thread and handle ([`EngineCore`]).
//! - [`prompt_logprobs`]: logprobs of a prompt's own tokens (for `echo`), computed during the
//!   request's prefill.
//! - [`sleep`]: sleep levels (the KV cache's memory given back; the weights' too), and the
//!   prefix cache reset.

#[allow(clippy::module_inception)]
pub mod engine;
pub mod handle;
pub mod handoff;
pub mod launch;
pub mod parallel;
pub mod prompt_logprobs;
pub mod reload;
pub mod request;
pub mod sampler;
pub mod scheduler;
pub mod sleep;

pub use engine::{Engine, EngineConfig, EngineEvent, EngineStats, FinalRecord, TokenEvent, Usage};
pub use handle::{EngineAsleep, EngineHandle, EventSink, RequestEvent, SubmitReply};
pub use parallel::{EngineCore, TpEngine};
pub use prompt_logprobs::PromptLogprobs;
pub use request::{FinishReason, GenerationRequest, RequestOptions};
pub use sampler::SamplingParams;
