//! swerve: rollout serving and RL training (rejection fine-tuning, then DAPO) for long-context,
//! multi-turn coding agents on Qwen2.5, with hand-written CUDA kernels.
//!
//! A tour of the crate:
//!
//! - [`config`]: HF `config.json` -> [`config::ModelConfig`] (transformers 4 and 5 field names,
//!   YaRN), validated; [`config::LocalSizes`] are one tensor-parallel rank's part of the model
//!   (`ModelConfig::shard`: nothing has to divide).
//! - [`tensor`]: element types and host tensors (checkpoint views or owned buffers).
//! - [`rng`]: the deterministic generators (SplitMix64, xorshift64, xoshiro256**) every seeded
//!   stream in the crate and its tests uses.
//! - [`backend`]: the [`backend::Backend`] trait of fused ops the model calls;
//!   [`backend::cpu`] is the f32 reference every kernel is checked against; [`backend::cuda`]
//!   loads the kernels `build.rs` compiled from `kernels/*.cu` (one fatbin per family) and runs
//!   the model with them and cuBLASLt; [`backend::select`] picks one at run time. The contracts
//!   and CPU references of the fused loss ([`backend::loss`]), the AdamW update
//!   ([`backend::adamw`]) and row sampling ([`backend::cpu_sampling`]) live here too, beside the
//!   kernels checked against them.
//! - [`dist`]: collectives between ranks ([`dist::Collectives`] on host bytes,
//!   [`dist::Communicator`] on a backend's tensors): ranks as threads ([`dist::local`]), NCCL
//!   ([`dist::nccl`]), processes over TCP after a rendezvous from torchrun's or Slurm's variables
//!   ([`dist::launch`], [`dist::rendezvous`], [`dist::tcp`]), and a task on every rank of a
//!   node's grid ([`dist::grid`]).
//! - [`model`]: the parameter layout and HF names ([`model::params`]), safetensors checkpoints
//!   ([`model::weights`]), the Qwen2 forward pass ([`model::qwen2`]) and synthetic models for
//!   benchmarks ([`model::synthetic`]).
//! - [`engine`]: requests, the continuous-batching scheduler, sampling and the step loop
//!   ([`engine::Engine`], threaded behind [`engine::EngineHandle`]).
//! - [`kvcache`]: the paged KV cache's block pool, prefix cache and [`kvcache::KvCacheManager`].
//! - [`server`]: `swerve-serve`, the OpenAI-compatible rollout server (axum over the engine
//!   handle): token ids in and out, weight reloads, pause and resume, Prometheus metrics.
//! - [`train`]: `score` (per-token logprobs of given sequences); RFT and DAPO training
//!   ([`train::trainer`] over [`train::learner::Learner`]): data, the fused LM-head loss, AdamW,
//!   checkpoints. The
//!   backward ops are [`backend::BackendGrad`]; the model's backward is [`model::backward`].
//! - [`env`]: coding tasks (swerve's task files, SWE-bench lines, built-in sets) and the
//!   sandboxes agents work in behind one trait ([`env::local`]: bubblewrap, [`env::docker`],
//!   [`env::toy`]: the in-process guessing game), with grading.
//! - [`agent`]: the scaffold (prompts, tools, the editor, token-in token-out transcripts,
//!   policies, episodes, rewards, concurrent rollouts): `swerve-train rollout` and `eval`.
//! - [`rl`]: `swerve-train rl`, the method in one process: rollouts, rewards, DAPO through
//!   [`train::learner`], weights handed to the engine in memory, iterated.
//! - [`bench`]: what `swerve-bench` measures; [`progress`]: progress bars; [`sysmem`]: the
//!   host's available memory; [`parse_only`]: `SWERVE_PARSE_ONLY=1`, the binaries' arguments
//!   parsed and nothing run.
//!
//! The binaries in `src/bin/` only parse arguments and call into these modules.
//!
//! Layering: a module uses only modules below it, so no two need each other (`tests/layering/`
//! checks every `crate::` path against its table, and that the files inside each directory module
//! import each other without cycles):
//!
//! ```text
//!  server  bench                          (src/bin/* on top)
//!  rl ─► agent ─► engine  train  env
//!                 kvcache  model
//!                          dist           (collectives over the backend's tensors)
//!                          backend        (a model calls back into it, never the reverse)
//!  tokenizer  chat  toolcall
//!  tensor  config  jsonl  progress  http_client  rng
//! ```

pub mod agent;
pub mod backend;
pub mod bench;
pub mod chat;
pub mod config;
pub mod dist;
pub mod engine;
pub mod env;
pub mod http_client;
pub mod jsonl;
pub mod kvcache;
pub mod model;
pub mod parse_only;
pub mod progress;
pub mod rl;
pub mod rng;
pub mod server;
pub mod sysmem;
pub mod tensor;
pub mod tokenizer;
pub mod toolcall;
pub mod train;
