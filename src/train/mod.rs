//! The training side: `score` (per-token logprobs of given token sequences, the trainer's
//! "recompute old logprobs" step), `tokenize` (a data file as the trainer tokenizes it), `loss`
//! (the fused LM-head loss of RFT and DAPO, CPU reference) and `optimizer` (AdamW, clipping,
//! schedules).

pub mod checkpoint;
pub mod data;
pub mod learner;
pub mod loss;
pub mod optimizer;
pub mod run_dir;
pub mod score;
pub mod tokenize;
pub mod trainer;
