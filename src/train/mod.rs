//! The training side: `score` (per-token logprobs of given token sequences, the trainer's
//! "recompute old logprobs" step), `tokenize` (a data file as the trainer tokenizes it), `loss`
//! (the fused LM-head loss of RFT and DAPO, CPU reference; defined in [`crate::backend::loss`]) and
//! `optimizer` (AdamW, clipping, schedules); `tensorboard` (the run's figures as TensorBoard
//! event files).

pub mod checkpoint;
pub mod data;
pub mod group;
pub mod handoff;
pub mod learner;
/// The fused LM-head loss lives with the backends that run it: [`crate::backend::loss`].
pub use crate::backend::loss;
pub mod offload;
pub mod optimizer;
pub mod run_dir;
pub mod score;
pub mod tensorboard;
pub mod tokenize;
pub mod trainer;
