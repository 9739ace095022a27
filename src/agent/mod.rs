//! The agent scaffold: an LLM working on a repository in a sandbox through tool calls, with the
//! tests as its reward (RL-SPEC.md). Trajectories come out token-in, token-out.
//!
//! - [`prompt`]: the system and task prompts and the tools (`bash`, `str_replace_editor`,
//!   `submit`) in the chat template's format.
//! - [`transcript`]: an episode's token form (ids, action mask, logprobs) and chat form.
//! - [`editor`]: `str_replace_editor` with SWE-agent's semantics, inside the sandbox.
//! - [`policy`]: who writes the turns: the in-process engine, a `swerve-serve`, or a script
//!   (oracle, noop, replay); [`sampling`]: a model's stop ids, context limit and engine.
//! - [`episode`]: one episode from setup to reward; [`turn`]: a reply's rules; [`reward`]:
//!   RL-SPEC's reward.
//! - [`rollout`]: many episodes at once on worker threads; pass@k and summaries;
//!   [`sandbox_pool`]: their order, and the next episodes' sandboxes started ahead (warm pool).
//! - [`command`]: `swerve-train rollout` and `eval`.

pub mod command;
pub mod editor;
pub mod episode;
pub mod policy;
pub mod prompt;
pub mod reward;
pub mod rollout;
pub mod sampling;
pub mod sandbox_pool;
pub mod transcript;
pub mod turn;
